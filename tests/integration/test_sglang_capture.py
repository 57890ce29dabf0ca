"""Real SGLang 0.5.23 on CPU with the server_patch hook, one server for the whole module (about a minute
to start on 2 cores): parity with the transformers forward, chunked prefill, windows, resume, leftovers."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

from eagle3.extract.engines.base import Dumped, Outcome
from eagle3.extract.engines.sglang_engine import SGLangEngine
from eagle3.extract.shard import extract_shard, open_run
from eagle3.serving.server import SGLangServer
from eagle3.store import dump_protocol as proto
from eagle3.store.run_store import PreparedSample, RunStore
from eagle3.store.sample_format import read_sample
from tests.integration.sglang_support import (
    TEXTS,
    assert_same_layer,
    prepared,
    require_sglang_env,
    sglang_config,
    start_server,
    token_errors,
    write_prepared,
)

pytestmark = [pytest.mark.sglang, pytest.mark.slow]
AUX = [2, 15, 27]  # EAGLE-3's default for SmolLM2's 30 layers


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory, demo_model: Path) -> Iterator[dict[str, Any]]:
    require_sglang_env()
    root = tmp_path_factory.mktemp("sglang")
    cfg = sglang_config(root / "run", demo_model, chunked_prefill_size=16)
    dump_dir = root / "dump"
    server = start_server(cfg, demo_model, dump_dir)
    try:
        yield {"cfg": cfg, "server": server, "dump_dir": dump_dir, "root": root}
    finally:
        server.stop()


@pytest.fixture(scope="module")
def samples(demo_tokenizer: Any) -> list[PreparedSample]:
    s = prepared(demo_tokenizer, TEXTS)
    assert max(len(x) for x in s) > 100
    return s


@pytest.fixture(scope="module")
def hf_states(demo_model: Path, samples: list[PreparedSample]) -> dict[str, tuple[torch.Tensor, ...]]:
    """The Hugging Face forward in fp32: hidden_states (embeddings, layer inputs..., final norm) per sample."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(demo_model, dtype=torch.float32).eval()
    out = {}
    with torch.no_grad():
        for s in samples:
            hs = model(torch.tensor([s.input_ids]), output_hidden_states=True).hidden_states
            out[s.sample_id] = tuple(h[0] for h in hs)
    return out


def engine_for(env: dict[str, Any], run_id: str, window: int = 1) -> SGLangEngine:
    cfg = env["cfg"].model_copy(deep=True)
    cfg.extract.window = window
    return SGLangEngine(cfg, Path(cfg.model), run_id, env["dump_dir"], server=env["server"])


def collect(engine: SGLangEngine, samples: Sequence[PreparedSample]) -> dict[str, Any]:
    out = {}
    for o in engine.extract(samples):
        assert isinstance(o, Dumped), getattr(o, "reason", o)
        out[o.sample.sample_id] = read_sample(o.path)
        o.path.unlink()
    return out


def test_the_hook_reports_the_layers_it_captures_from_its_worker(env: dict[str, Any]) -> None:
    workers = [s for s in proto.read_statuses(env["dump_dir"]) if s["status"] == "worker"]
    assert len(workers) == 1 and workers[0]["writes"] is True
    assert workers[0]["layers_to_capture"] == AUX and workers[0]["problem"] is None
    assert "capturing HF hidden_states [2, 15, 27]" in env["server"].log_tail(400)


def test_on_cpu_the_scheduler_is_forked_from_the_launcher_and_its_hook_captures(env: dict[str, Any]) -> None:
    """server_patch/cpu_fork.py: a spawned scheduler would load the plugin again and report it from its own pid; a
    forked one inherits the launcher's, so the only `loaded` report is the launcher's and the capturing worker is
    another process."""
    statuses = proto.read_statuses(env["dump_dir"])
    loaded = [s["pid"] for s in statuses if s["status"] == "loaded"]
    (worker,) = [s["pid"] for s in statuses if s["status"] == "worker"]
    assert len(loaded) == 1 and worker != loaded[0]
    assert "eagle3 cpu_fork: SGLang's scheduler and detokenizer are forked" in env["server"].log_path.read_text()


def test_dumps_match_the_hf_forward_per_token_and_not_the_neighbouring_layers(
    env: dict[str, Any], samples: list[PreparedSample], hf_states: dict[str, tuple[torch.Tensor, ...]]
) -> None:
    """Per token over all samples: each dumped layer is within bf16 noise of HF hidden_states[layer]
    (median token ~0.01; no token of any sample past 0.2) and far from hidden_states[layer +- 1]."""
    got = collect(engine_for(env, "parity"), samples)
    for s in samples:
        d = got[s.sample_id]
        assert d.input_ids.tolist() == s.input_ids and d.loss_mask.tolist() == s.loss_mask
        assert d.aux_hidden_states.dtype == torch.bfloat16 and d.aux_hidden_states.shape == (len(s), 3, 576)

    def pooled(k: int | None, layer: int) -> torch.Tensor:  # token errors of every sample, concatenated
        errs = []
        for s in samples:
            d = got[s.sample_id]
            mine = d.last_hidden_state if k is None else d.aux_hidden_states[:, k]
            e = token_errors(mine, hf_states[s.sample_id][layer])
            errs.append(e)
        return torch.cat(errs)

    for k, layer in enumerate(AUX):
        same = pooled(k, layer)
        assert float(same.median()) < 0.03 and float(same.max()) < 0.2, (layer, same.median(), same.max())
        for other in (layer - 1, layer + 1):
            far = float(pooled(k, other).median())
            assert far > 0.12 and far > 5 * float(same.median()), f"layer {layer} vs HF {other}: {far:.3f}"
    last = pooled(None, -1)  # the final post-norm state
    assert float(last.median()) < 0.03 and float(last.max()) < 0.2, (last.median(), last.max())


def multi_turn(demo_tokenizer: Any, turns: int) -> str:
    """A conversation of `turns` user/assistant rounds in SmolLM2's chat template (about 60 tokens a round)."""
    messages = []
    for t in range(turns):
        messages += [
            {"role": "user", "content": f"Step {t}: what does the draft do when the target rejects token {t}?"},
            {"role": "assistant", "content": f"It drops token {t} and every token after it, takes the target's own "
                                             "token there, and drafts again from that point on."},
        ]  # fmt: skip
    text = demo_tokenizer.apply_chat_template(messages, tokenize=False)
    assert isinstance(text, str)
    return text


def test_chunked_prefill_of_long_prompts_gives_the_one_pass_data(
    env: dict[str, Any], samples: list[PreparedSample], demo_model: Path, demo_tokenizer: Any
) -> None:
    """The server runs with --chunked-prefill-size 16: the long samples (the 106-token text and a ~300-token
    multi-turn conversation) reach the hook in 7 and 19+ chunks (SGLang's own log says so), which it stitches in
    order into what the transformers engine computes in one pass."""
    from eagle3.extract.engines.transformers_engine import TransformersEngine

    chunk = env["cfg"].server.chunked_prefill_size
    conversation = prepared(demo_tokenizer, [multi_turn(demo_tokenizer, 5)])[0]
    conversation = PreparedSample("conversation", conversation.input_ids, conversation.loss_mask, "test:conversation")
    long = [s for s in samples if len(s) > 100] + [conversation]
    assert chunk == 16 and len(long) == 2 and len(long[1]) > 250
    ref = {o.sample.sample_id: o for o in TransformersEngine(demo_model, device="cpu").extract(long)}
    log = env["server"].log_path
    before = log.stat().st_size
    got = collect(engine_for(env, "chunked"), long)
    with log.open("rb") as f:
        f.seek(before)
        prefills = [int(n) for n in re.findall(rb"Prefill batch, #new-seq: \d+, #new-token: (\d+)", f.read())]
    # one request at a time (window 1): each is prefilled in ceil(T / 16) forwards of at most 16 new tokens
    assert max(prefills) == chunk and sum(prefills) >= sum(len(s) for s in long)
    assert len(prefills) >= sum(-(-len(s) // chunk) for s in long)
    for s in long:
        g, r = got[s.sample_id], ref[s.sample_id]
        for k in range(len(AUX)):
            assert_same_layer(g.aux_hidden_states[:, k], r.aux_hidden_states[:, k], f"{s.sample_id} aux {k}")
        assert_same_layer(g.last_hidden_state, r.last_hidden_state, f"{s.sample_id} last")


def test_window_4_gives_the_same_data_as_window_1(env: dict[str, Any], samples: list[PreparedSample]) -> None:
    one = collect(engine_for(env, "w1", window=1), samples)
    four = collect(engine_for(env, "w4", window=4), samples)
    assert one.keys() == four.keys() == {s.sample_id for s in samples}
    for sid in one:
        assert torch.equal(one[sid].input_ids, four[sid].input_ids)
        assert torch.equal(one[sid].loss_mask, four[sid].loss_mask)
        # Batched rows may round differently in bf16; a swapped or shifted sample would be far off.
        for k in range(len(AUX)):
            assert_same_layer(four[sid].aux_hidden_states[:, k], one[sid].aux_hidden_states[:, k], f"{sid} aux {k}")
        assert_same_layer(four[sid].last_hidden_state, one[sid].last_hidden_state, f"{sid} last")


def test_health_checks_warm_up_and_foreign_requests_leave_no_files(env: dict[str, Any]) -> None:
    server: SGLangServer = env["server"]
    for _ in range(2):
        assert server.healthy()
    r = httpx.post(
        f"{server.url}/generate",
        json={"input_ids": [1, 2, 3, 4], "rid": "someone-else-1", "sampling_params": {"max_new_tokens": 0}},
        timeout=60,
    )
    assert r.status_code == 200
    leftovers = [p.name for p in env["dump_dir"].iterdir() if p.name != proto.STATUS_DIR]
    assert leftovers == []


def test_a_request_without_its_request_file_gets_an_error_file_and_the_server_lives(env: dict[str, Any]) -> None:
    server: SGLangServer = env["server"]
    rid = proto.make_rid("noreq", "x")
    r = httpx.post(
        f"{server.url}/generate",
        json={"input_ids": [1, 2, 3, 4, 5], "rid": rid, "sampling_params": {"max_new_tokens": 0}},
        timeout=60,
    )
    assert r.status_code == 200
    for _ in range(100):
        if proto.error_path(env["dump_dir"], rid).exists():
            break
        time.sleep(0.05)
    assert "no request file" in (proto.read_error(env["dump_dir"], rid) or "")
    assert json.loads(proto.error_path(env["dump_dir"], rid).read_text())["rid"] == rid
    proto.error_path(env["dump_dir"], rid).unlink()
    assert server.healthy() and not proto.dump_path(env["dump_dir"], rid).exists()


class Counting:
    def __init__(self, inner: SGLangEngine):
        self.inner, self.info, self.calls = inner, inner.info, 0

    def extract(self, samples: Sequence[PreparedSample]) -> Iterator[Outcome]:
        self.calls += len(samples)
        yield from self.inner.extract(samples)

    def close(self) -> None:
        self.inner.close()


def test_extracting_a_shard_twice_does_no_work_the_second_time(
    env: dict[str, Any], samples: list[PreparedSample], demo_model: Path
) -> None:
    cfg = env["cfg"].model_copy(deep=True)
    cfg.run_dir = str(env["root"] / "store")
    store = RunStore(cfg.run_dir)
    write_prepared(store, demo_model, samples[:3])
    engine = Counting(engine_for(env, "twice"))
    info = open_run(cfg, store, demo_model, engine.info)
    assert (info.engine, info.aux_layers, info.engine_layer_ids) == ("sglang", AUX, [1, 14, 26])
    m = extract_shard(store, 0, engine, info)
    assert m.status == "complete" and engine.calls == 3 and not m.errors
    for s in store.prepared_samples(0):
        assert store.open_sample(0, s.sample_id).loss_mask.tolist() == s.loss_mask
    again = Counting(engine_for(env, "twice"))
    m2 = extract_shard(store, 0, again, info)
    assert again.calls == 0 and m2.samples == m.samples
    assert [p.name for p in env["dump_dir"].iterdir() if p.name != proto.STATUS_DIR] == []


def test_fp8_requests_are_quantized_by_the_hook_through_chunked_prefill_into_a_verified_store(
    env: dict[str, Any], samples: list[PreparedSample], demo_model: Path, hf_states: dict[str, tuple[torch.Tensor, ...]]
) -> None:
    """extract.store_dtype float8_e4m3 on the same server that serves bf16 runs (the dtype travels per request in
    its .req.json): the hook quantizes on the device, the long sample's scales are stitched over its >= 7 chunks,
    and the dequantized states are within FP8 noise of the HF forward (e4m3: ~2.5% per token)."""
    from eagle3.store.verify import verify_run

    cfg = env["cfg"].model_copy(deep=True)
    cfg.run_dir, cfg.extract.store_dtype = str(env["root"] / "store-fp8"), "float8_e4m3"
    store = RunStore(cfg.run_dir)
    write_prepared(store, demo_model, samples)
    engine = SGLangEngine(cfg, Path(cfg.model), "fp8", env["dump_dir"], server=env["server"])
    info = open_run(cfg, store, demo_model, engine.info)
    assert info.store_dtype == "float8_e4m3" and info.dtype == "bfloat16"
    m = extract_shard(store, 0, engine, info)
    assert m.status == "complete" and not m.errors
    assert verify_run(store).clean
    for s in samples:
        d = store.open_sample(0, s.sample_id)
        assert d.is_fp8 and d.aux_scales is not None and d.aux_scales.shape == (len(s), 3)
        assert d.loss_mask.tolist() == s.loss_mask
        deq = d.dequantized(torch.float32)
        for k, layer in enumerate(AUX):
            assert_same_layer(deq.aux_hidden_states[:, k], hf_states[s.sample_id][layer], f"{s.sample_id} aux {k}",
                              median=0.06, worst=0.25)  # fmt: skip
        assert_same_layer(deq.last_hidden_state, hf_states[s.sample_id][-1], f"{s.sample_id} last",
                          median=0.06, worst=0.25)  # fmt: skip


def test_a_grown_store_extracts_only_the_new_samples_through_sglang(env: dict[str, Any], demo_model: Path) -> None:
    """grow x SGLang extraction: the intake's new shard, and only it, goes to the capturing server; old files stay
    as they were (bytes and mtimes) and run.json lists both intakes."""
    from eagle3.data.prepare import prepare
    from tests.integration.test_intake import conversation, extract_all, snapshot
    from tests.landing import drop

    traffic = env["root"] / "grow-traffic"
    traffic.mkdir()
    drop(traffic, "day1.jsonl", [conversation(i) for i in range(3)])
    cfg = env["cfg"].model_copy(deep=True)
    cfg.run_dir = str(env["root"] / "grow-store")
    cfg.data = cfg.data.model_copy(update={"dataset": str(traffic), "shard_size": 3, "max_length": 128})
    store = RunStore(cfg.run_dir)
    engine = engine_for(env, "grow")
    prepare(cfg, store, demo_model)
    assert len(extract_all(cfg, store, demo_model, engine)) == 3
    before = snapshot(store)
    drop(traffic, "day2.jsonl", [conversation(i) for i in range(3, 5)])
    assert prepare(cfg, store, demo_model).shards == [3, 2]
    assert sorted(extract_all(cfg, store, demo_model, engine)) == sorted(store.prepared_ids(1))  # once each
    assert {k: v for k, v in snapshot(store).items() if k in before} == before
    info = store.read_run_info()
    assert info is not None and info.engine == "sglang" and [i.new_samples for i in info.intakes] == [3, 2]
    assert [p.name for p in env["dump_dir"].iterdir() if p.name != proto.STATUS_DIR] == []
