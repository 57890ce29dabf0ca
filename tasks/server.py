"""What every task that launches SGLang servers (extraction, the live evaluation) does around the launch.

    server_env()                    the environment to launch with: the worker's, plus the flow run id
    reap_orphan_servers(run_dir)    stop servers that dead runs left in the run directory; log + `eagle3.server.reaped`

However the launching process ends (a crash, a SIGKILL, a cancellation that kills it), its servers end with it
(eagle3/serving/keeper.py).
"""

from __future__ import annotations

import os
from pathlib import Path

from prefect import get_run_logger
from prefect.runtime import flow_run

from eagle3.serving.record import reap_orphans_under
from eagle3.serving.server import FLOW_RUN_ENV
from tasks.events import emit_run_event


def server_env() -> dict[str, str]:
    """The environment a server launched from this task gets: the worker's (NCCL_*/CUDA_*/HF_* pass through) and
    the flow run's id, which its record (<log dir>/server.json) and /proc/<pid>/environ then show."""
    env = dict(os.environ)
    run_id = flow_run.get_id()
    if run_id:
        env[FLOW_RUN_ENV] = str(run_id)
    return env


def reap_orphan_servers(run_dir: str) -> int:
    """Stop the servers that runs which died left in `run_dir` (their keeper died too: see eagle3/serving/record.py);
    each one is a warning in this task's log and an `eagle3.server.reaped` event. Returns how many records."""
    reaped = reap_orphans_under(Path(run_dir))
    for r in reaped:
        get_run_logger().warning("%s", r.describe())
        emit_run_event(run_dir, "eagle3.server.reaped", r.event_payload())
    return len(reaped)
