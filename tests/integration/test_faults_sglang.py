"""Faults of a real SGLang server (CPU) during extraction, checked sample by sample: a hung scheduler makes a
request time out, and the shard still ends with every sample in the store exactly once and nothing left over.

The fault is SIGSTOP of SGLang's scheduler process while it runs the forward of one (long) sample, held
longer than `extract.request_timeout_s`, then SIGCONT: a GPU or collective hang looks like this (the HTTP
front end stays up and accepts the abort and the resend). It is the case that used to go wrong: SGLang still
holds the timed-out rid when the resend comes (a resend under the same rid was refused as a duplicate and
the sample failed), and the server finishes the abandoned attempt after the client gave up on it (a late
dump or error file under a shared rid would be adopted in place of the resend's, or left behind).

`assert_exactly_once` is shared with tests/e2e/test_faults_sglang_flow.py (a server SIGKILLed mid-shard
under the Prefect extract flow).
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from eagle3.extract.engines.sglang_engine import build_sglang_engine
from eagle3.extract.shard import extract_shard, open_run
from eagle3.store import dump_protocol as proto
from eagle3.store.run_store import PreparedSample, RunStore
from eagle3.store.verify import verify_run
from tests.integration.sglang_support import TEXTS, prepared, require_sglang_env, sglang_config, write_prepared

pytestmark = [pytest.mark.sglang, pytest.mark.slow]
PORT = 31101
TIMEOUT_S = 10.0  # extract.request_timeout_s: 4x a ~200-token prefill on 2 cores shared with other work (2.5 s)
HANG_S = TIMEOUT_S + 3.0  # past the timeout, the abort and the 1 s backoff: the resend arrives during the hang


# processes -----------------------------------------------------------------------------------
def _stat(pid: int) -> list[str]:
    """Fields of /proc/<pid>/stat after the command name (index 0 = state, 2 = pgrp, 11/12 = utime/stime)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def group_pids(pgid: int) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if int(_stat(int(d.name))[2]) == pgid:
                    out.append(int(d.name))
            except (OSError, IndexError):
                continue
    return out


def title(pid: int) -> str:
    return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")


def scheduler_pid(pgid: int) -> int:
    """SGLang's scheduler process (it names itself `sglang::scheduler...`), where the model and the hook run."""
    found = [p for p in group_pids(pgid) if title(p).startswith("sglang::scheduler")]
    assert len(found) == 1, f"expected one scheduler in process group {pgid}: {[(p, title(p)) for p in found]}"
    return found[0]


def cpu_seconds(pid: int) -> float:
    f = _stat(pid)
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


def wait_for(what: str, cond: Callable[[], bool], timeout_s: float, every_s: float = 0.005) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited {timeout_s:.0f} s for {what}")
        time.sleep(every_s)


# the exactly-once check ----------------------------------------------------------------------
def assert_exactly_once(store: RunStore, samples: list[PreparedSample], dump_dir: Path) -> None:
    """Shard 0 is complete with one sound file per prepared sample, holding that sample's token ids and loss
    mask, and nothing else: no second copy, no stray sample, no temporary file, no dump or side file."""
    ids = [s.sample_id for s in samples]
    m = store.read_manifest(0)
    assert m is not None and m.status == "complete" and m.errors == {}, m
    assert sorted(m.samples) == sorted(ids) and len(m.samples) == len(ids)
    assert m.tokens == sum(len(s) for s in samples)
    assert sorted(p.name for p in store.shard_dir(0).iterdir()) == sorted(
        [store.manifest_path(0).name, *(store.sample_path(0, i).name for i in ids)]
    )
    for s in samples:
        t = store.open_sample(0, s.sample_id)
        assert t.input_ids.tolist() == s.input_ids and t.loss_mask.tolist() == s.loss_mask, s.sample_id
        assert torch.isfinite(t.aux_hidden_states.float()).all() and torch.isfinite(t.last_hidden_state.float()).all()
    assert [p.name for p in dump_dir.iterdir() if p.name != proto.STATUS_DIR] == []  # no dump, .req/.error, temp
    assert list(store.root.rglob("*.tmp")) == []
    report = verify_run(store)
    assert report.clean and report.ok_count == len(ids) and report.missing_count == 0, report


# the test ------------------------------------------------------------------------------------
def test_a_request_timed_out_by_a_hung_scheduler_is_resent_and_the_late_attempt_leaves_nothing(
    tmp_path: Path, demo_model: Path, demo_tokenizer: Any, caplog: pytest.LogCaptureFixture
) -> None:
    require_sglang_env()
    cfg = sglang_config(tmp_path / "run", demo_model, port=PORT, max_restarts=0, chunked_prefill_size=4096)
    cfg.extract.request_timeout_s = TIMEOUT_S
    cfg.extract.request_retries = 3
    long_text = " ".join([TEXTS[2]] * 2)  # ~210 tokens: one forward of ~0.5 CPU-seconds, to stop inside
    samples = prepared(demo_tokenizer, [TEXTS[0], TEXTS[1], long_text, TEXTS[3], TEXTS[5]])
    victim = samples[2]
    store = RunStore(cfg.run_dir)
    write_prepared(store, demo_model, samples)
    engine = build_sglang_engine(cfg, demo_model, os.environ)  # launches and owns its server; close() stops it
    first, resend = engine.rid(victim, 0), engine.rid(victim, 1)
    assert first != resend
    hang: dict[str, Any] = {}

    def hang_the_scheduler_mid_forward() -> None:
        try:
            wait_for("the long sample's request", proto.request_path(engine.dump_dir, first).exists, 600)
            assert engine.server.pgid is not None
            pid = scheduler_pid(engine.server.pgid)
            busy_from = cpu_seconds(pid)
            wait_for("its forward to start", lambda: cpu_seconds(pid) - busy_from >= 0.1, 60)
            os.kill(pid, signal.SIGSTOP)
            try:
                hang["stopped_with_samples"] = len(list(store.shard_dir(0).glob("*.safetensors")))
                time.sleep(HANG_S)
            finally:
                os.kill(pid, signal.SIGCONT)
        except BaseException as e:
            hang["error"] = e

    caplog.set_level(logging.WARNING, logger="eagle3.sglang")
    watcher = threading.Thread(target=hang_the_scheduler_mid_forward, daemon=True)
    try:
        info = open_run(cfg, store, demo_model, engine.info)
        watcher.start()
        m = extract_shard(store, 0, engine, info)
        watcher.join(60)
    finally:
        engine.close()
    assert "error" not in hang, hang
    assert hang["stopped_with_samples"] < len(samples)
    assert m.status == "complete", m.errors

    # The client timed out, gave the attempt up and resent the sample under a new rid; the hang was no crash.
    assert engine.resent >= 1 and engine.server.restarts == 0
    resends = [r.getMessage() for r in caplog.records if "sending it again" in r.getMessage()]
    assert any(victim.sample_id in r and "extract.request_timeout_s" in r and resend in r for r in resends), resends
    # SGLang finished the abandoned attempt after the client had given up (its request file was gone by then):
    # the late file landed under the abandoned rid, not the resend's, and was deleted.
    log = engine.server.log_path.read_text(errors="replace")
    assert f"eagle3 dump {first} failed: no request file" in log
    assert_exactly_once(store, samples, engine.dump_dir)
