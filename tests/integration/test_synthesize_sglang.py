"""synthesize through a real SGLang server on CPU (server.engine: sglang): greedy turns are reproducible, finish
reasons are counted, a bad row and a refused request are reported per row while the others complete (and a re-run
retries exactly the failed one), and a server killed mid-synthesize is restarted with every sample kept once."""

from __future__ import annotations

import json
import os
import shutil
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

import eagle3.data.synthesize as synth
from eagle3.progress import Progress
from eagle3.serving.server import SGLangServer
from eagle3.store.run_store import RunStore
from tests.integration.sglang_support import SYNTH_PROMPTS as PROMPTS
from tests.integration.sglang_support import plain_server_at, require_sglang_env
from tests.integration.sglang_support import synthesize_config as config
from tests.integration.sglang_support import synthesized_records as records

pytestmark = [pytest.mark.sglang, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, demo_model: Path) -> Iterator[SGLangServer]:
    """A server of this module's own, not the session's plain one: greedy turns are compared across two runs, and
    on the shared server (which other modules' sampled, concurrent requests had warmed) one of three greedy answers
    once came out different the second time (bf16 numerics depend on how requests are batched)."""
    with plain_server_at(tmp_path_factory.mktemp("served"), demo_model) as s:
        yield s


def test_greedy_turns_through_sglang_are_identical_twice_and_finish_reasons_are_counted(
    tmp_path: Path, demo_model: Path, server: SGLangServer
) -> None:
    """Reproducible as far as SGLang computes the same thing twice: bf16 results depend on which requests share a
    batch and on whether a prompt's prefix came from the radix cache (a greedy answer once differed the second time),
    so the requests go one at a time (concurrency 1) and the cache is flushed before each run."""
    reports: list[tuple[float, Progress]] = []
    t0 = time.monotonic()
    runs = []
    for name in ("a", "b"):
        assert httpx.post(f"{server.url}/flush_cache", timeout=30).status_code == 200
        cfg = config(tmp_path / name, demo_model, PROMPTS, concurrency=1)
        store = RunStore(cfg.run_dir)
        out = synth.synthesize(
            cfg, store, demo_model, lambda p: reports.append((time.monotonic(), p)), servers=[server]
        )
        runs.append((cfg, store, out))
    (_, store_a, a), (cfg_b, store_b, b) = runs
    assert records(store_a) and [r["messages"] for r in records(store_a)] == [r["messages"] for r in records(store_b)]
    assert a.manifest.num_samples == 3 and a.summary.generated == 3 and a.summary.failed == []
    turns = sum(a.summary.turns.values())
    assert turns == 4 and set(a.summary.turns) <= {"stop", "length"}  # the sky row has two assistant turns
    sky = records(store_a)[1]["messages"]
    assert [m["content"] for m in sky if m["role"] == "user"] == ["Name a colour of the sky.", "And at sunset?"]
    assert "Blue." not in [m["content"] for m in sky]
    first = store_a.prepared_samples(0)[0]  # the generated turn is in prepared/, under the loss mask
    tok = synth.ChatTokenizer.from_model_dir(demo_model).tokenizer
    masked = tok.decode([t for t, k in zip(first.input_ids, first.loss_mask, strict=True) if k])
    assert masked == records(store_a)[0]["messages"][1]["content"] + "<|im_end|>"

    # progress: the first report comes before any generation; the last one is the generation's own figure
    assert reports[0][0] - t0 < 60 and reports[0][1].stage == "synthesize"
    assert reports[-1][1].stage == "synthesize" and reports[-1][1].tokens > 0

    # on_truncated=drop: no generation again (a setting of the data, not of the generated text), fewer samples
    cfg_b.synthesize.on_truncated = "drop"
    dropped = synth.synthesize(cfg_b, store_b, demo_model, servers=[server])
    assert dropped.summary.generated == 0 and dropped.summary.dropped_truncated == b.summary.truncated_samples
    assert dropped.manifest.num_samples == 3 - b.summary.truncated_samples


def test_a_bad_row_and_a_refused_request_are_reported_per_row_and_a_rerun_retries_only_the_failed_one(
    tmp_path: Path, demo_model: Path, server: SGLangServer
) -> None:
    data = tmp_path / "rows.jsonl"
    shutil.copy(PROMPTS, data)
    long = " ".join(f"word{i}" for i in range(400))  # > CONTEXT tokens: the server refuses it every time
    with data.open("a") as f:
        f.write("{not json\n")  # row 3: a bad row (prepare reports it)
        f.write(json.dumps({"messages": [{"role": "user", "content": long}, {"role": "assistant", "content": "x"}]}))
        f.write("\n")  # row 4
        f.write(
            json.dumps({"messages": [{"role": "user", "content": "Say hi."}, {"role": "assistant", "content": "Hi."}]})
        )
        f.write("\n")  # row 5
    cfg = config(tmp_path / "run", demo_model, data)
    store = RunStore(cfg.run_dir)
    out = synth.synthesize(cfg, store, demo_model, servers=[server])
    assert [(f.row, "400" in f.reason and "context length" in f.reason) for f in out.summary.failed] == [
        (f"{data}:4", True)
    ]
    assert out.summary.generated == 4 and out.manifest.num_samples == 4  # the others are all there
    assert [(b.file, b.row, b.reason.split(" ")[0]) for b in out.manifest.bad_rows] == [
        (str(data), 3, "not"),  # prepare's: not valid JSON
        (str(data), 4, "synthesize:"),  # the refused request
    ]

    def generated() -> dict[str, int]:
        files = [*synth.synthesized_dir(store).glob("shard-*.jsonl"), *synth.synthesized_dir(store).glob("samples/*")]
        return {p.name: p.stat().st_mtime_ns for p in files}

    kept = generated()
    assert len(kept) == 4  # shard 1 (row 5) is one file; shard 0 keeps its 3 finished samples as sample files

    again = synth.synthesize(cfg, store, demo_model, servers=[server])  # retries exactly the failed sample
    assert again.summary.generated == 0 and [f.row for f in again.summary.failed] == [f"{data}:4"]
    assert generated() == kept


def test_a_server_killed_mid_synthesize_is_restarted_and_every_sample_is_kept_once(
    tmp_path: Path, demo_model: Path
) -> None:
    require_sglang_env()
    cfg = config(tmp_path / "run", demo_model, REPO / "data" / "demo_prompts.jsonl", concurrency=4)
    cfg.data.max_samples = 16
    store = RunStore(cfg.run_dir)
    (server,) = synth.open_servers(cfg, demo_model, dict(os.environ), tmp_path / "server")
    killed: dict[str, Any] = {}

    def kill_mid_synthesize() -> None:
        try:
            deadline = time.monotonic() + 900
            samples = synth.synthesized_dir(store) / "samples"
            while len(list(samples.glob("*.json"))) < 2:
                assert time.monotonic() < deadline, "no two samples within 900 s"
                time.sleep(0.1)
            assert server.pgid is not None
            os.killpg(server.pgid, signal.SIGKILL)  # the whole server at once, as the OOM killer would
            killed["done_at_kill"] = len(list(samples.glob("*.json")))
        except BaseException as e:
            killed["error"] = e

    watcher = threading.Thread(target=kill_mid_synthesize, daemon=True)
    watcher.start()
    try:
        out = synth.synthesize(cfg, store, demo_model, servers=[server])
    finally:
        server.stop()
    watcher.join(60)
    assert "error" not in killed, killed
    assert 2 <= killed["done_at_kill"] < 16 and server.restarts == 1
    assert out.summary.failed == [] and out.summary.generated == 16 and out.manifest.num_samples == 16
    recs = records(store)
    dataset = REPO / "data" / "demo_prompts.jsonl"
    assert sorted(r["source"] for r in recs) == sorted(f"{dataset}:{i}" for i in range(16))  # each once, none lost


def test_requests_that_keep_timing_out_are_given_up_per_row_after_the_retries_with_a_rid_each(
    tmp_path: Path, demo_model: Path, server: SGLangServer
) -> None:
    # 1 ms and 256 new tokens: no answer can come back in time. With 10 ms and 24 tokens, a short greedy answer
    # ("The sky is blue.") once did, on a warm server, and its row was not among the failed.
    cfg = config(
        tmp_path / "run", demo_model, PROMPTS, request_timeout_s=0.001, request_retries=1, max_new_tokens=256
    )
    out = synth.synthesize(cfg, RunStore(cfg.run_dir), demo_model, servers=[server])
    assert sorted(f.row for f in out.summary.failed) == [f"{PROMPTS}:{i}" for i in range(3)]  # each row, reported
    for f in out.summary.failed:
        assert "gave up after 2 attempts (synthesize.request_retries)" in f.reason
        assert (
            "no answer within 0s (synthesize.request_timeout_s)" in f.reason and ".1-" in f.reason
        )  # the resend's rid
    assert out.manifest.num_samples == 0 and server.is_alive()


def test_a_grown_dataset_is_answered_through_sglang_only_for_its_new_prompts(
    tmp_path: Path, demo_model: Path, server: SGLangServer
) -> None:
    """grow x synthesize (sglang engine): the second intake's prompts, and only they, go to the server, and their
    samples are appended to prepared/ as new shards; old prepared and synthesized files stay as they were."""
    from tests.integration.test_grow_synthesize import store_files
    from tests.integration.test_intake import conversation
    from tests.landing import drop

    traffic = tmp_path / "grow"
    traffic.mkdir()
    drop(traffic, "day1.jsonl", [conversation(i) for i in range(4)])
    cfg = config(tmp_path / "run", demo_model, traffic, max_new_tokens=8)
    store = RunStore(cfg.run_dir)
    first = synth.synthesize(cfg, store, demo_model, servers=[server])
    assert first.summary.generated == 4 and first.manifest.shards == [4]
    before = store_files(store)
    drop(traffic, "day2.jsonl", [conversation(i) for i in range(4, 6)] + [conversation(1)])
    grown = synth.synthesize(cfg, store, demo_model, servers=[server])
    assert grown.summary.generated == 2  # only the new prompts went to the server
    m = grown.manifest
    assert m.shards == [4, 2] and m.intakes[-1].shards == [1] and m.intakes[-1].known_samples == 1
    assert sorted(r["source"] for r in records(store)[4:]) == [f"{traffic / 'day2.jsonl'}:{i}" for i in range(2)]
    assert {k: v for k, v in store_files(store).items() if k in before} == before  # same bytes, same mtimes
