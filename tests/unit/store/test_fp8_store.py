"""FP8 hidden-state samples (extract.store_dtype: float8_e4m3): quantization, the file, checks, resume, loader, disk."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from eagle3.draft.data import DataError, read_row
from eagle3.extract import disk
from eagle3.extract.shard import RunMismatchError, check_same_run
from eagle3.store.run_store import RunInfo, RunStore
from eagle3.store.sample_format import (
    FP8,
    FP8_NAME,
    SampleFormatError,
    check_header,
    dequantize_fp8,
    encode_sample,
    quantize_fp8,
    read_header,
    read_sample,
    verify_sample,
    write_sample,
)
from tests.unit.tiny_store import run_info

T, K, H = 64, 3, 1024
LAYERS = [2, 4, 6]


def states(t: int = T, h: int = H, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    aux = (torch.randn(t, K, h, generator=g) * torch.logspace(-2, 2, t).view(t, 1, 1)).to(torch.bfloat16)
    last = torch.randn(t, h, generator=g).to(torch.bfloat16)
    return aux, last


def write_fp8(path: Path, t: int = T, h: int = H, **override: torch.Tensor) -> bytes:
    aux, last = states(t, h)
    (qa, sa), (ql, sl) = quantize_fp8(aux), quantize_fp8(last)
    x = {"aux_hidden_states": qa, "last_hidden_state": ql, "aux_scales": sa, "last_scale": sl, **override}
    ids, mask = torch.arange(t) + 5, (torch.arange(t) % 2).to(torch.uint8)
    data = encode_sample("s-1", LAYERS, ids, mask, x["aux_hidden_states"], x["last_hidden_state"],
                         x["aux_scales"], x["last_scale"])  # fmt: skip
    write_sample(path, data)
    return data


def rel_l2(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Per-row relative L2 of a against the reference b, rows = all but the last dim."""
    a, b = a.float(), b.float()
    return (a - b).norm(dim=-1) / b.norm(dim=-1)


def test_quantize_keeps_each_token_within_fp8_precision_whatever_its_scale() -> None:
    aux, _ = states()  # token norms spread over four orders of magnitude
    q, s = quantize_fp8(aux)
    assert q.dtype == FP8 and q.shape == aux.shape and s.shape == (T, K) and s.dtype == torch.float32
    assert rel_l2(dequantize_fp8(q, s), aux).max() < 0.04  # e4m3: 3 mantissa bits, ~2.5% rms per element
    assert q.float().abs().amax(-1).eq(448).all()  # each row's absmax maps to the top of the range


def test_quantize_gives_zero_rows_a_positive_scale_and_bad_rows_a_bad_one() -> None:
    x = torch.zeros(3, 8)
    x[1] = torch.arange(8.0)
    x[2, 3] = float("inf")
    q, s = quantize_fp8(x)
    assert s[0] > 0 and torch.isfinite(s[0]) and dequantize_fp8(q, s)[0].eq(0).all()
    assert torch.equal(dequantize_fp8(q, s, torch.float32)[1], x[1])  # small integers are exact
    assert not torch.isfinite(s[2])


def test_an_fp8_sample_reads_back_bit_for_bit_and_says_what_it_is(tmp_path: Path) -> None:
    path = tmp_path / "s.safetensors"
    data = write_fp8(path)
    aux, last = states()
    back = read_sample(path)
    (qa, sa), (ql, sl) = quantize_fp8(aux), quantize_fp8(last)
    assert back.is_fp8 and torch.equal(back.aux_hidden_states.view(torch.uint8), qa.view(torch.uint8))
    assert torch.equal(back.aux_scales, sa) and torch.equal(back.last_scale, sl)
    assert torch.equal(back.last_hidden_state.view(torch.uint8), ql.view(torch.uint8))
    header, _, _ = read_header(path)
    assert header["aux_hidden_states"]["dtype"] == "F8_E4M3" and header["aux_scales"]["shape"] == [T, K]
    assert header["__metadata__"]["store_dtype"] == FP8_NAME and "absmax" in header["__metadata__"]["scaling"]
    deq = back.dequantized()
    assert deq.aux_hidden_states.dtype == torch.bfloat16 and rel_l2(deq.aux_hidden_states, aux).max() < 0.04
    rec = verify_sample(path, num_tokens=T, num_aux=K, hidden_size=H, dtype=FP8, input_ids=torch.arange(T) + 5)
    assert rec.num_bytes == len(data)


def test_an_fp8_sample_is_at_most_051_of_the_bf16_minimum(tmp_path: Path) -> None:
    size = len(write_fp8(tmp_path / "s.safetensors"))
    assert size / (T * (K + 1) * H * 2) <= 0.51
    fp8_info = run_info(H, store_dtype=FP8_NAME)
    assert disk.run_estimate(fp8_info, T) >= size  # the disk guard estimates with the store dtype
    assert disk.run_estimate(fp8_info, T) < 0.52 * disk.run_estimate(run_info(H), T)


@pytest.mark.parametrize("bad", [0.0, -1.0, float("inf"), float("nan")])
def test_verify_refuses_scales_that_are_not_finite_and_positive(tmp_path: Path, bad: float) -> None:
    aux, _ = states()
    _, sa = quantize_fp8(aux)
    sa[7, 1] = bad
    path = tmp_path / "s.safetensors"
    write_fp8(path, aux_scales=sa)
    check_header(path, num_tokens=T, num_aux=K, hidden_size=H, dtype=FP8)  # the header is fine
    with pytest.raises(SampleFormatError, match=r"aux_scales has 1 scales that are not finite and positive"):
        verify_sample(path, num_tokens=T, num_aux=K, hidden_size=H, dtype=FP8)


def test_fp8_states_without_scales_or_scales_of_the_wrong_shape_are_refused(tmp_path: Path) -> None:
    aux, last = states()
    (qa, sa), (ql, sl) = quantize_fp8(aux), quantize_fp8(last)
    ids, mask = torch.arange(T), torch.ones(T, dtype=torch.uint8)
    with pytest.raises(SampleFormatError, match="FP8 states need both scales"):
        encode_sample("s", LAYERS, ids, mask, qa, ql)
    with pytest.raises(SampleFormatError, match="FP8 states need both scales"):
        encode_sample("s", LAYERS, ids, mask, aux, last, sa, sl)
    with pytest.raises(SampleFormatError, match=r"expected \[64, 3\] and \[64\]"):
        encode_sample("s", LAYERS, ids, mask, qa, ql, sa[:, :2], sl)


def test_a_store_holds_one_dtype(tmp_path: Path) -> None:
    """A bf16 file in an FP8 store (or the reverse) is not adopted, and the message says why."""
    bf16 = tmp_path / "bf16.safetensors"
    aux, last = states()
    write_sample(bf16, encode_sample("s", LAYERS, torch.arange(T), torch.ones(T, dtype=torch.uint8), aux, last))
    with pytest.raises(SampleFormatError, match=r"hidden states are BF16, the store holds F8_E4M3.*one dtype"):
        check_header(bf16, num_tokens=T, num_aux=K, hidden_size=H, dtype=FP8)
    fp8 = tmp_path / "fp8.safetensors"
    write_fp8(fp8)
    with pytest.raises(SampleFormatError, match=r"hidden states are F8_E4M3, the store holds BF16"):
        check_header(fp8, num_tokens=T, num_aux=K, hidden_size=H, dtype=torch.bfloat16)


def test_resume_refuses_a_change_of_store_dtype(tmp_path: Path) -> None:
    store = RunStore(tmp_path)
    with pytest.raises(RunMismatchError, match=r"store_dtype: store has 'bfloat16', now 'float8_e4m3'"):
        check_same_run(run_info(), run_info(store_dtype=FP8_NAME), store)
    check_same_run(run_info(store_dtype=FP8_NAME), run_info(store_dtype=FP8_NAME), store)


def test_a_run_json_from_before_store_dtype_means_the_model_dtype(tmp_path: Path) -> None:
    raw = run_info(dtype="float32").model_dump(mode="json")
    del raw["store_dtype"]
    (tmp_path / "run.json").write_text(json.dumps(raw))
    info = RunStore(tmp_path).read_run_info()
    assert isinstance(info, RunInfo) and info.store_dtype == "float32" and info.stored == torch.float32
    with pytest.raises(ValueError, match="store_dtype 'int8'"):
        run_info(store_dtype="int8")


def test_the_loader_reads_fp8_bytes_and_dequantizes_them_on_the_device(tmp_path: Path) -> None:
    paths = [tmp_path / "a.safetensors", tmp_path / "b.safetensors"]
    write_fp8(paths[0], t=10, h=32)
    write_fp8(paths[1], t=7, h=32)
    row = read_row(paths, batch_tokens=24)
    assert row.aux_hidden.dtype == FP8 and row.aux_scales is not None and row.aux_scales.shape == (24, K)
    assert row.aux_hidden.nbytes == 24 * K * 32  # one byte per element crosses to the device
    dense = row.dequantized()
    assert dense.aux_hidden.dtype == torch.bfloat16 and dense.aux_scales is None
    a = 0
    for p in paths:
        s = read_sample(p).dequantized()
        t = s.input_ids.numel()
        assert torch.equal(dense.aux_hidden[a : a + t], s.aux_hidden_states)
        assert torch.equal(dense.last_hidden[a : a + t], s.last_hidden_state)
        a += t
    assert not dense.aux_hidden[a:].any() and not dense.last_hidden[a:].any()  # padding dequantizes to 0


def test_the_loader_refuses_a_row_mixing_fp8_and_bf16(tmp_path: Path) -> None:
    fp8, bf16 = tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    write_fp8(fp8, t=8, h=32)
    aux, last = states(8, 32)
    write_sample(bf16, encode_sample("b", LAYERS, torch.arange(8), torch.ones(8, dtype=torch.uint8), aux, last))
    with pytest.raises(DataError, match="one run holds one model's states"):
        read_row([fp8, bf16], batch_tokens=16)
