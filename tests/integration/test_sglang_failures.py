"""Real SGLang on CPU with its prefix (radix) cache on (server.prefix_cache), then killed: every extraction request
is salted into a cache namespace of its own, so it is computed whole even when its prompt was served before (by
extraction or by synthesize's turns, which the cache does serve); a request that does hit a cached prefix (its salt
reused) fails with a clear message instead of silently missing rows; a crashed server is restarted."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

import eagle3.data.synthesize as synth
from eagle3.data.chat import ChatTokenizer
from eagle3.data.generate import prompt_ids, stop_token_ids_of, turn_of
from eagle3.data.prepare import prepare
from eagle3.extract.engines.base import Dumped, Failed
from eagle3.extract.engines.sglang_engine import SGLangEngine
from eagle3.serving.generation import GenerationClient
from eagle3.serving.server import ServerError, SGLangServer
from eagle3.store import dump_protocol as proto
from eagle3.store.run_store import RunStore
from tests.integration.sglang_support import (
    SYNTH_PROMPTS,
    TEXTS,
    prepared,
    require_sglang_env,
    sglang_config,
    start_server,
    synthesize_config,
)
from tests.ports import free_port

pytestmark = [pytest.mark.sglang, pytest.mark.slow]


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory, demo_model: Path) -> Iterator[dict[str, Any]]:
    require_sglang_env()
    root = tmp_path_factory.mktemp("sglang-radix")
    cfg = sglang_config(root / "run", demo_model, max_restarts=1, prefix_cache=True)
    dump_dir = root / "dump"
    server = start_server(cfg, demo_model, dump_dir)
    try:
        yield {"cfg": cfg, "server": server, "dump_dir": dump_dir}
    finally:
        server.stop()


def engine(env: dict[str, Any], run_id: str) -> SGLangEngine:
    cfg = env["cfg"]
    return SGLangEngine(cfg, Path(cfg.model), run_id, env["dump_dir"], server=env["server"])


def test_a_cached_prefix_fails_the_sample_with_a_clear_message(env: dict[str, Any], demo_tokenizer: Any) -> None:
    sample = prepared(demo_tokenizer, [TEXTS[1]])[0]
    (first,) = engine(env, "radix-a").extract([sample])
    assert isinstance(first, Dumped)  # nothing cached yet: every row was computed
    first.path.unlink()
    # the same rid again (a client that reuses rids), so the same cache salt: the prefix is cached in its namespace
    (again,) = engine(env, "radix-a").extract([sample])
    assert isinstance(again, Failed)
    assert "prefix cache" in again.reason and "--disable-radix-cache" in again.reason
    assert "not 0" in again.reason  # the hook's own report on the rows it saw
    assert [p.name for p in env["dump_dir"].iterdir() if p.name != proto.STATUS_DIR] == []


def test_an_extraction_request_is_computed_whole_when_its_prompt_was_served_before(
    env: dict[str, Any], demo_tokenizer: Any
) -> None:
    sample = prepared(demo_tokenizer, [TEXTS[2]])[0]
    outs = [o for run_id in ("salt-a", "salt-b") for o in engine(env, run_id).extract([sample])]  # new rids, salts
    assert all(isinstance(o, Dumped) for o in outs), [getattr(o, "reason", o) for o in outs]
    tensors = [load_file(str(o.path)) for o in outs if isinstance(o, Dumped)]
    assert tensors[0].keys() == tensors[1].keys() and all(torch.equal(tensors[0][k], tensors[1][k]) for k in tensors[0])
    for o in outs:
        o.path.unlink()


def test_multi_turn_synthesize_reuses_the_conversation_so_far_and_its_extraction_stays_exact(
    env: dict[str, Any], demo_model: Path, tmp_path: Path
) -> None:
    """One server for both stages, as a pipeline run has: synthesize's later turns are served the earlier turns'
    KV from the cache (each turn's prompt holds the conversation so far), and extracting the conversations it wrote
    computes every row of each (the client and the hook check)."""
    server: SGLangServer = env["server"]
    cfg = synthesize_config(tmp_path / "run", demo_model, SYNTH_PROMPTS, max_new_tokens=8, user_turns=1)
    chat = ChatTokenizer.from_model_dir(demo_model)
    with GenerationClient([server], cfg.synthesize, stop_ids=stop_token_ids_of(demo_model, chat), run_id="pc") as c:
        question = [{"role": "user", "content": "Name three rivers of Europe."}]
        first = prompt_ids(chat, question)
        answer = turn_of(chat, c.generate(first, sample_id="x", turn=0).output_ids, c.stop_ids).text
        follow_up = [*question, {"role": "assistant", "content": answer}, {"role": "user", "content": "And of Asia?"}]
        second = c.generate(prompt_ids(chat, follow_up), sample_id="x", turn=1)
    assert second.cached_tokens >= len(first) - 1, (second.cached_tokens, len(first))  # the whole first turn

    store = RunStore(cfg.run_dir)
    prepare(cfg, store, demo_model)
    summary = synth.synthesize(cfg, store, demo_model, servers=[server]).summary
    assert not summary.failed and 0 < summary.cached_prompt_tokens < summary.prompt_tokens
    manifest = store.read_prepared_manifest()
    assert manifest is not None
    samples = [s for shard in range(len(manifest.shards)) for s in store.prepared_samples(shard)]
    assert any(sum(s.loss_mask) < len(s.loss_mask) // 2 for s in samples)  # a multi-turn one among them
    outs = list(engine(env, "pc-extract").extract(samples))
    assert all(isinstance(o, Dumped) for o in outs), [getattr(o, "reason", o) for o in outs]
    for o in outs:
        o.path.unlink()


def test_a_crashed_server_is_restarted_and_the_sample_retried(env: dict[str, Any], demo_tokenizer: Any) -> None:
    server: SGLangServer = env["server"]
    before, after = prepared(demo_tokenizer, ["Sent before the crash.", "Sent after the crash."])
    e = engine(env, "crash")
    (out,) = e.extract([before])
    assert isinstance(out, Dumped)
    assert server._proc is not None
    os.killpg(server._proc.pid, signal.SIGKILL)  # a crash: no clean shutdown
    server._proc.wait(30)
    (out2,) = e.extract([after])
    assert isinstance(out2, Dumped), getattr(out2, "reason", out2)
    assert server.restarts == 1 and server.is_alive()
    for o in (out, out2):
        o.path.unlink()


_LISTENER = "import socket, sys, time; s = socket.socket(); s.bind(('127.0.0.1', int(sys.argv[1]))); s.listen(); " \
    "print('listening', flush=True); time.sleep(1000)"  # fmt: skip


def test_a_port_taken_after_the_check_is_reported_at_the_failed_bind_naming_its_holder(
    tmp_path: Path, demo_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The race the check before launch cannot close (a process binds the port while SGLang loads the model):
    SGLang's HTTP server fails to listen and SGLang would wait 120 s for its warm-up, then SIGKILL itself (exit
    137, "warmup error: NewConnectionError"). The launcher reads the bind failure in the log and says what
    happened instead. Here the check is skipped and a listener holds the port from the start."""
    require_sglang_env()
    port = free_port()
    listener = subprocess.Popen([sys.executable, "-c", _LISTENER, str(port), "late-taker"], stdout=subprocess.PIPE,
                                text=True)  # fmt: skip
    try:
        assert listener.stdout is not None and listener.stdout.readline().strip() == "listening"
        monkeypatch.setattr(SGLangServer, "_check_port", lambda self: None)
        cfg = sglang_config(tmp_path / "run", demo_model)
        server = SGLangServer(cfg.server, demo_model, dump_dir=None, layers=None, log_dir=tmp_path / "log",
                              base_env=dict(os.environ), port=port)  # fmt: skip
        with pytest.raises(ServerError) as e:
            server.start()
    finally:
        listener.kill()
        listener.wait()
    msg = str(e.value)
    assert "could not bind its port" in msg and f"port {port}" in msg, msg
    assert f"pid {listener.pid}" in msg and "late-taker" in msg and "server.port" in msg, msg
    assert "exited with code" not in msg  # ours, not SGLang's own end two minutes later
    assert not server.is_alive() and not (tmp_path / "log" / "server.json").exists()  # the group stopped


def test_a_server_that_dies_while_starting_names_its_exception_on_the_first_line(
    tmp_path: Path, demo_model: Path
) -> None:
    """SGLang refuses an architecture it has no model class for and exits while starting. The error's first line,
    which a flow run's state message and the failure artifact show, names SGLang's own exception (not a fragment
    of its traceback); the log's tail follows."""
    require_sglang_env()
    model = tmp_path / "unknown-arch"
    shutil.copytree(demo_model, model)
    cfg_path = model / "config.json"
    cfg_path.write_text(json.dumps(json.loads(cfg_path.read_text()) | {"architectures": ["NoSuchForCausalLM"]}))
    cfg = sglang_config(tmp_path / "run", model)
    server = SGLangServer(cfg.server, model, dump_dir=None, layers=None, log_dir=tmp_path / "log",
                          base_env=dict(os.environ), port=free_port())  # fmt: skip
    with pytest.raises(ServerError) as e:
        server.start()
    first, _, tail = str(e.value).partition("\n")
    assert first.startswith("SGLang exited with code"), first
    assert "NoSuchForCausalLM" in first and "Error: " in first, first
    assert "^^^" not in first and "File " not in first, first
    assert tail  # the log's last lines still follow
    assert not server.is_alive() and not (tmp_path / "log" / "server.json").exists()
