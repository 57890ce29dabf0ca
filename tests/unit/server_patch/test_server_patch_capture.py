"""The hook's bookkeeping (server_patch/capture.py, writer.py) without SGLang: rows per request,
chunked-prefill stitching, radix-cache detection, and the written file."""

from __future__ import annotations

import time
from pathlib import Path

import torch

from eagle3.store import dump_protocol as proto
from eagle3.store.sample_format import read_sample
from server_patch.capture import Broken, Complete, Segment, Stitcher, plan_batch
from server_patch.writer import Chunk, DumpWriter, Job


def test_rows_follow_request_order_and_only_the_prefix_is_captured() -> None:
    plan = plan_batch(
        ["e3-a", "HEALTH_CHECK_1", "e3-b"],
        extend_lens=[5, 2, 3],
        prefix_lens=[0, 0, 0],
        prompt_lens=[5, 2, 3],
        rid_prefix="e3-",
    )
    assert plan.total_rows == 10
    assert plan.segments == [Segment("e3-a", 0, 5, 0, 5), Segment("e3-b", 7, 3, 0, 3)]


def test_decode_tails_of_a_mixed_batch_are_skipped_and_rows_capped_at_the_prompt() -> None:
    # e3-a: a 4-token chunk at position 8 of a 10-token prompt (only 2 prompt rows); e3-b: a decode tail.
    plan = plan_batch(["e3-a", "e3-b"], [4, 1], [8, 6], [10, 6], "e3-")
    assert plan.total_rows == 5
    assert plan.segments == [Segment("e3-a", 0, 2, 8, 10)]


def test_chunks_are_stitched_in_prompt_order() -> None:
    st = Stitcher()
    assert st.add(Segment("e3-a", 0, 16, 0, 40), "c0") == []
    assert st.add(Segment("e3-a", 0, 16, 16, 40), "c1") == []
    done = st.add(Segment("e3-a", 0, 8, 32, 40), "c2")
    assert done == [Complete("e3-a", ["c0", "c1", "c2"])]
    assert len(st) == 0


def test_a_first_chunk_after_position_0_is_a_radix_cache_error() -> None:
    (out,) = Stitcher().add(Segment("e3-a", 0, 1, 39, 40), "c")
    assert isinstance(out, Broken) and "--disable-radix-cache" in out.reason


def test_a_gap_between_chunks_breaks_the_request_and_a_restart_from_0_starts_over() -> None:
    st = Stitcher()
    st.add(Segment("e3-a", 0, 16, 0, 40), "c0")
    (out,) = st.add(Segment("e3-a", 0, 16, 20, 40), "c1")
    assert isinstance(out, Broken) and "out of order" in out.reason
    st.add(Segment("e3-b", 0, 16, 0, 20), "x0")
    st.add(Segment("e3-b", 0, 16, 0, 20), "y0")  # retracted and prefilled again
    assert st.add(Segment("e3-b", 0, 4, 16, 20), "y1") == [Complete("e3-b", ["y0", "y1"])]


def test_half_done_requests_are_bounded() -> None:
    st = Stitcher(max_partial=2)
    st.add(Segment("e3-a", 0, 1, 0, 9), "a")
    st.tick()
    st.add(Segment("e3-b", 0, 1, 0, 9), "b")
    out = st.add(Segment("e3-c", 0, 1, 0, 9), "c")
    assert len(out) == 1 and isinstance(out[0], Broken) and out[0].rid == "e3-a"


def _wait(path: Path) -> None:
    for _ in range(100):
        if path.exists():
            return
        time.sleep(0.02)
    raise AssertionError(f"{path} never appeared")


def test_the_writer_emits_a_store_file_with_the_clients_loss_mask(tmp_path: Path) -> None:
    t, k, h = 6, 3, 4
    aux = torch.randn(t, k * h).to(torch.bfloat16)  # [T, K*H] as SGLang concatenates
    last = torch.randn(t, h).to(torch.bfloat16)
    proto.write_request(tmp_path, proto.RequestInfo("e3-r-s1", "s1", t, [2, 5, 7], [0, 0, 1, 1, 1, 0]))
    w = DumpWriter(tmp_path, depth=2)
    w.submit(
        Job("e3-r-s1", list(range(t)), [Chunk(aux[:4], last[:4], None), Chunk(aux[4:], last[4:], None)], [2, 5, 7])
    )
    w.close()
    s = read_sample(proto.dump_path(tmp_path, "e3-r-s1"))
    assert s.input_ids.tolist() == list(range(t))
    assert s.loss_mask.tolist() == [0, 0, 1, 1, 1, 0]
    assert torch.equal(s.aux_hidden_states, aux.view(t, k, h))
    assert torch.equal(s.aux_hidden_states[:, 1], aux[:, h : 2 * h])  # layer 1 of 3 is the middle slice
    assert torch.equal(s.last_hidden_state, last)


def test_the_writer_reports_a_missing_request_file_as_an_error_file(tmp_path: Path) -> None:
    w = DumpWriter(tmp_path)
    w.submit(Job("e3-r-s2", [1, 2], [Chunk(torch.zeros(2, 6), torch.zeros(2, 2), None)], [1, 2, 3]))
    w.close()
    assert not proto.dump_path(tmp_path, "e3-r-s2").exists()
    assert "no request file" in (proto.read_error(tmp_path, "e3-r-s2") or "")


def _fp8_request(tmp_path: Path, rid: str, t: int, store_dtype: str) -> None:
    proto.write_request(tmp_path, proto.RequestInfo(rid, rid[-2:], t, [2, 5, 7], [1] * t, store_dtype))


def test_the_writer_stitches_chunks_quantized_by_the_hook_with_their_scales(tmp_path: Path) -> None:
    from eagle3.store.sample_format import quantize_fp8

    t, k, h = 6, 3, 4
    aux, last = torch.randn(t, k, h).to(torch.bfloat16), torch.randn(t, h).to(torch.bfloat16)
    (qa, sa), (ql, sl) = quantize_fp8(aux), quantize_fp8(last)  # what the hook does per chunk, on the device
    _fp8_request(tmp_path, "e3-r-f1", t, "float8_e4m3")
    chunks = [Chunk(qa[a:b].reshape(b - a, k * h), ql[a:b], None, sa[a:b], sl[a:b]) for a, b in ((0, 4), (4, 6))]
    w = DumpWriter(tmp_path)
    w.submit(Job("e3-r-f1", list(range(t)), chunks, [2, 5, 7]))
    w.close()
    s = read_sample(proto.dump_path(tmp_path, "e3-r-f1"))
    assert s.is_fp8 and torch.equal(s.aux_scales, sa) and torch.equal(s.last_scale, sl)
    assert torch.equal(s.aux_hidden_states.view(torch.uint8), qa.view(torch.uint8))


def test_the_writer_quantizes_on_the_cpu_when_the_hook_did_not_and_refuses_fp8_for_a_bf16_request(
    tmp_path: Path,
) -> None:
    from eagle3.store.sample_format import quantize_fp8

    t, k, h = 3, 3, 4
    aux, last = torch.randn(t, k * h).to(torch.bfloat16), torch.randn(t, h).to(torch.bfloat16)
    _fp8_request(tmp_path, "e3-r-f2", t, "float8_e4m3")  # e.g. its request file was unreadable at the first chunk
    _fp8_request(tmp_path, "e3-r-b3", t, "bfloat16")
    (qa, sa), (ql, sl) = quantize_fp8(aux.view(t, k, h)), quantize_fp8(last)
    w = DumpWriter(tmp_path)
    w.submit(Job("e3-r-f2", list(range(t)), [Chunk(aux, last, None)], [2, 5, 7]))
    w.submit(Job("e3-r-b3", list(range(t)), [Chunk(qa.view(t, k * h), ql, None, sa, sl)], [2, 5, 7]))
    w.close()
    s = read_sample(proto.dump_path(tmp_path, "e3-r-f2"))
    assert s.is_fp8 and torch.equal(s.aux_scales, sa)
    assert not proto.dump_path(tmp_path, "e3-r-b3").exists()
    assert "the request file asks for bfloat16" in (proto.read_error(tmp_path, "e3-r-b3") or "")
