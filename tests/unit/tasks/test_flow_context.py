"""FlowContext (tasks/flow_context.py): what one flow run's tasks share, opened by the flow and passed to them.

Real locks, leases and server pools on a temporary run directory; no Prefect server (outside a flow run the flow run
id is None, which the lock and the lease record as such)."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest

from eagle3.config import PipelineConfig
from eagle3.store.lock import LOCK_NAME, RunLockLostError
from tasks.flow_context import flow_context
from tasks.progress import RunProgressRef


def config(run_dir: Path) -> PipelineConfig:
    return PipelineConfig.model_validate({"run_dir": str(run_dir), "model": str(run_dir / "model")})


def test_a_subflows_context_shares_its_parents_servers_and_only_the_parent_closes_them(tmp_path: Path) -> None:
    cfg = config(tmp_path / "run")
    with flow_context() as parent:
        pool = parent.server_pool(cfg, str(tmp_path / "model"))
        with flow_context() as child:  # the extract subflow inside the pipeline
            assert child is not parent and child.servers is parent.servers
            assert child.server_pool(cfg, str(tmp_path / "model")) is pool  # one launch for synthesize + extract
        assert parent.server_pool(cfg, str(tmp_path / "model")) is pool  # the child's end closed nothing
    with flow_context() as later:  # the next flow run in this process starts with no servers
        assert later.servers is not parent.servers
        assert later.server_pool(cfg, str(tmp_path / "model")) is not pool


def test_the_exclusive_hold_guards_the_shard_leases_and_a_lost_lock_is_reported(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    cfg = config(run_dir)
    with flow_context() as ctx:
        assert ctx.shard_lease(cfg, 0).under is None
        ctx.check_lock()  # no hold: nothing to check
        with ctx.hold(str(run_dir), "extract", ttl_s=2.0) as hold:
            pool = ctx.server_pool(cfg, str(tmp_path / "model"))
            assert ctx.shard_lease(cfg, 0).under is hold.lock
            ctx.check_lock()
            (run_dir / LOCK_NAME).unlink()  # someone else removed (took) the lock
            deadline = time.monotonic() + 5
            while hold.lock.lost is None and time.monotonic() < deadline:
                time.sleep(0.05)
            with pytest.raises(RunLockLostError):
                ctx.check_lock()
        assert ctx.shard_lease(cfg, 0).under is None  # the hold ended with its block
        ctx.check_lock()
        assert ctx.server_pool(cfg, str(tmp_path / "model")) is not pool  # its servers closed before the lock went


def test_a_shared_hold_is_a_guard_only_and_leases_are_not_under_it(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    cfg = config(run_dir)
    with flow_context() as ctx, ctx.hold(str(run_dir), "extract", shared=True) as hold:
        assert hold.shared
        hold.opened()
        assert ctx.shard_lease(cfg, 0).under is None
        ctx.check_lock()


def test_each_flow_run_has_its_own_progress_board_shared_by_its_shard_tasks() -> None:
    ref = RunProgressRef(artifact_id="00000000-0000-0000-0000-000000000001", total=10, done_before=0)
    log = logging.getLogger("test")
    with flow_context() as a, flow_context() as b:
        assert a.board(ref, log) is a.board(ref, log)  # every shard task of the flow run feeds one board
        assert b.board(ref, log) is not a.board(ref, log)
