"""The sample file format: what is written reads back, and anything incomplete or foreign is refused."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
import torch
from safetensors.torch import load, save

from eagle3.store.sample_format import (
    FORMAT,
    SampleFormatError,
    check_header,
    encode_sample,
    encode_sample_parts,
    read_sample,
    record_of,
    verify_sample,
    write_sample,
    write_sample_parts,
)

T, K, H = 7, 3, 16
LAYERS = [2, 4, 6]


def make_tensors(t: int = T, dtype: torch.dtype = torch.bfloat16) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(t)
    return {
        "input_ids": torch.arange(t, dtype=torch.int64) + 100,
        "loss_mask": (torch.arange(t) % 2).to(torch.uint8),
        "aux_hidden_states": torch.randn(t, K, H, generator=g).to(dtype),
        "last_hidden_state": torch.randn(t, H, generator=g).to(dtype),
    }


def write(path: Path, t: int = T, dtype: torch.dtype = torch.bfloat16) -> bytes:
    x = make_tensors(t, dtype)
    data = encode_sample("s-1", LAYERS, x["input_ids"], x["loss_mask"], x["aux_hidden_states"], x["last_hidden_state"])
    write_sample(path, data)
    return data


def check(path: Path, **kw: object) -> int:
    args: dict = {"num_tokens": T, "num_aux": K, "hidden_size": H, "dtype": torch.bfloat16, **kw}
    return check_header(path, **args)


def test_a_written_sample_reads_back_bit_for_bit(tmp_path: Path) -> None:
    path = tmp_path / "s.safetensors"
    data = write(path)
    back = read_sample(path)
    want = make_tensors()
    for key, value in want.items():
        assert torch.equal(getattr(back, key), value), key
    rec = verify_sample(path, num_tokens=T, num_aux=K, hidden_size=H, dtype=torch.bfloat16, crc32=record_of(data).crc32)
    assert (rec.num_tokens, rec.num_bytes) == (T, len(data))
    assert check(path) == T


@pytest.mark.parametrize("cut", [0, 3, 8, 20, "mid-header", "end-of-header", "mid-data", "last-byte"])
def test_check_header_refuses_a_file_truncated_anywhere(tmp_path: Path, cut: int | str) -> None:
    path = tmp_path / "s.safetensors"
    data = write(path)
    (n,) = struct.unpack("<Q", data[:8])
    offsets = {"mid-header": 8 + n // 2, "end-of-header": 8 + n, "mid-data": (8 + n + len(data)) // 2,
               "last-byte": len(data) - 1}  # fmt: skip
    keep = offsets[cut] if isinstance(cut, str) else cut
    path.write_bytes(data[:keep])
    with pytest.raises(SampleFormatError):
        check(path)


def test_check_header_refuses_a_file_with_bytes_appended(tmp_path: Path) -> None:
    path = tmp_path / "s.safetensors"
    path.write_bytes(write(path) + b"\0")
    with pytest.raises(SampleFormatError, match="bytes"):
        check(path)


def test_check_header_refuses_wrong_dtype_shape_and_token_count(tmp_path: Path) -> None:
    path = tmp_path / "s.safetensors"
    write(path, dtype=torch.float16)
    with pytest.raises(SampleFormatError, match="aux_hidden_states"):
        check(path)
    write(path)
    with pytest.raises(SampleFormatError, match="aux_hidden_states"):
        check(path, num_aux=K + 1)
    with pytest.raises(SampleFormatError):
        check(path, hidden_size=H * 2)
    with pytest.raises(SampleFormatError, match="tokens"):
        check(path, num_tokens=T + 1)


def test_check_header_refuses_missing_or_extra_keys_and_foreign_files(tmp_path: Path) -> None:
    path = tmp_path / "s.safetensors"
    x = make_tensors()
    meta = {"format": FORMAT, "sample_id": "s-1", "aux_layers": "2,4,6"}
    path.write_bytes(save({k: v for k, v in x.items() if k != "loss_mask"}, metadata=meta))
    with pytest.raises(SampleFormatError, match="keys"):
        check(path)
    path.write_bytes(save({**x, "extra": torch.zeros(1)}, metadata=meta))
    with pytest.raises(SampleFormatError, match="keys"):
        check(path)
    path.write_bytes(save(x, metadata={"format": "something-else/1"}))
    with pytest.raises(SampleFormatError, match="format"):
        check(path)
    path.write_bytes(b"\x10\0\0\0\0\0\0\0not json at all!")
    with pytest.raises(SampleFormatError, match="JSON"):
        check(path)
    with pytest.raises(SampleFormatError, match="missing"):
        check(tmp_path / "absent.safetensors")


def test_encode_refuses_tensors_whose_token_counts_disagree() -> None:
    x = make_tensors()
    with pytest.raises(SampleFormatError, match="token counts"):
        encode_sample("s", LAYERS, x["input_ids"], x["loss_mask"][:-1], x["aux_hidden_states"], x["last_hidden_state"])
    with pytest.raises(SampleFormatError, match="layers"):
        encode_sample("s", [2, 4], x["input_ids"], x["loss_mask"], x["aux_hidden_states"], x["last_hidden_state"])


def test_verify_catches_non_finite_values(tmp_path: Path) -> None:
    path = tmp_path / "s.safetensors"
    x = make_tensors()
    x["last_hidden_state"][3, 5] = float("nan")
    write_sample(path, encode_sample("s", LAYERS, *x.values()))
    check(path)  # the header is fine; only the full check sees the values
    with pytest.raises(SampleFormatError, match="non-finite"):
        verify_sample(path, num_tokens=T, num_aux=K, hidden_size=H, dtype=torch.bfloat16)


def test_verify_catches_a_flipped_byte_through_the_checksum(tmp_path: Path) -> None:
    path = tmp_path / "s.safetensors"
    data = bytearray(write(path))
    crc = record_of(bytes(data)).crc32
    data[-3] ^= 0x01  # a low mantissa bit of the last value: still finite, same header
    path.write_bytes(bytes(data))
    check(path)
    with pytest.raises(SampleFormatError, match="checksum"):
        verify_sample(path, num_tokens=T, num_aux=K, hidden_size=H, dtype=torch.bfloat16, crc32=crc)


def test_verify_catches_token_ids_that_differ_from_the_prepared_sample(tmp_path: Path) -> None:
    path = tmp_path / "s.safetensors"
    write(path)
    other = torch.arange(T, dtype=torch.int64)
    with pytest.raises(SampleFormatError, match="token ids"):
        verify_sample(path, num_tokens=T, num_aux=K, hidden_size=H, dtype=torch.bfloat16, input_ids=other)


def test_the_header_records_format_sample_id_and_layers(tmp_path: Path) -> None:
    path = tmp_path / "s.safetensors"
    data = write(path)
    (n,) = struct.unpack("<Q", data[:8])
    meta = json.loads(data[8 : 8 + n])["__metadata__"]
    assert meta == {"format": FORMAT, "sample_id": "s-1", "aux_layers": "2,4,6"}


def split_file(data: bytes) -> tuple[dict, bytes]:
    (n,) = struct.unpack("<Q", data[:8])
    return json.loads(data[8 : 8 + n]), data[8 + n :]


@pytest.mark.parametrize("t", [1, 7, 33])
def test_the_streamed_encoding_is_the_same_file_as_safetensors_save(tmp_path: Path, t: int) -> None:
    x = make_tensors(t)
    whole = encode_sample("s-1", LAYERS, *x.values())
    parts = encode_sample_parts("s-1", LAYERS, *x.values())
    joined = b"".join(parts)
    assert len(joined) == len(whole)
    assert split_file(joined) == split_file(whole)  # same header (as JSON) and the same data bytes
    assert len(split_file(joined)[0]) == 5 and (8 + struct.unpack("<Q", joined[:8])[0]) % 8 == 0
    back = load(joined)
    assert all(torch.equal(back[k], v) for k, v in x.items())


def test_a_streamed_write_reads_back_and_its_record_matches_the_bytes(tmp_path: Path) -> None:
    path = tmp_path / "s.safetensors"
    x = make_tensors()
    aux = torch.randn(T + 3, K, H).bfloat16()[:T]  # a view of a bigger (padded) batch, as the engine hands over
    x["aux_hidden_states"] = aux
    rec = write_sample_parts(path, encode_sample_parts("s-1", LAYERS, *x.values()), T)
    data = path.read_bytes()
    assert rec == record_of(data)
    assert check(path) == T
    verify_sample(path, num_tokens=T, num_aux=K, hidden_size=H, dtype=torch.bfloat16, crc32=rec.crc32)
    assert torch.equal(read_sample(path).aux_hidden_states, aux)


def test_the_streamed_encoding_checks_token_counts_like_encode_sample() -> None:
    x = make_tensors()
    with pytest.raises(SampleFormatError, match="token counts"):
        encode_sample_parts(
            "s", LAYERS, x["input_ids"], x["loss_mask"][:-1], x["aux_hidden_states"], x["last_hidden_state"]
        )
