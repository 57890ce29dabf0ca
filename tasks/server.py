"""SGLang server tasks: start (or attach), stop, and the node check (`eagle3 doctor`).

The extraction engine launches its own server on first use and stops it when the flow's engine session
closes (tasks/extract.py); these tasks are for flows that need a server on its own (evaluation against a
served draft, a long-lived extraction server shared by several flow runs) and for the doctor.
A launched server lives in this process: `start_server_task` and `stop_server_task` must run in the same
worker process, and `stop_server_task` belongs in the flow's `finally`. However this process ends (a crash, a
SIGKILL, a cancellation that kills it), its servers end with it (eagle3/keeper.py).

Helpers for every task that launches servers (extraction, evaluation, these):
    server_env()                    the environment to launch with: the worker's, plus the flow run id
    reap_orphan_servers(run_dir)    stop servers that dead runs left in the run directory; log + `eagle3.server.reaped`
"""

from __future__ import annotations

import os
from pathlib import Path

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.runtime import flow_run

from eagle3.config import PipelineConfig
from eagle3.doctor import run_doctor
from eagle3.engines.sglang_engine import run_id_of
from eagle3.layers import resolve_aux_layers
from eagle3.model_files import read_model_facts
from eagle3.server import FLOW_RUN_ENV, SGLangServer
from eagle3.server_record import reap_orphans_under
from eagle3.sglang_layers import sglang_layer_ids
from tasks.artifacts import markdown_artifact, run_key
from tasks.extract_report import emit_run_event

_SERVERS: dict[str, SGLangServer] = {}
STOP_TIMEOUT_S = 5 * 60
DOCTOR_TIMEOUT_S = 60 * 60  # launches the server: a large model loads for many minutes


def server_env() -> dict[str, str]:
    """The environment a server launched from this task gets: the worker's (NCCL_*/CUDA_*/HF_* pass through) and
    the flow run's id, which its record (<log dir>/server.json) and /proc/<pid>/environ then show."""
    env = dict(os.environ)
    run_id = flow_run.get_id()
    if run_id:
        env[FLOW_RUN_ENV] = str(run_id)
    return env


def reap_orphan_servers(run_dir: str) -> int:
    """Stop the servers that runs which died left in `run_dir` (their keeper died too: see eagle3/server_record.py);
    each one is a warning in this task's log and an `eagle3.server.reaped` event. Returns how many records."""
    reaped = reap_orphans_under(Path(run_dir))
    for r in reaped:
        get_run_logger().warning("%s", r.describe())
        emit_run_event(run_dir, "eagle3.server.reaped", r.event_payload())
    return len(reaped)


@task(name="start-sglang", retries=1, retry_delay_seconds=10, cache_policy=NO_CACHE)
def start_server_task(config: PipelineConfig, model_dir: str, capture: bool = True) -> str:
    """Launch SGLang (or attach to server.url) and wait for /health and the hook; returns its URL.
    The server log streams into this task's log; its timeout is server.startup_timeout_s (enforced there)."""
    logger = get_run_logger()
    reap_orphan_servers(config.run_dir)
    facts = read_model_facts(Path(model_dir))
    layers = None
    if capture:
        aux = resolve_aux_layers(config.extract.aux_layers, facts.num_layers)
        layers = sglang_layer_ids(facts.model_type, aux, facts.num_layers, config.extract.sglang_layer_ids)
    dump_dir = Path(config.extract.dump_dir) if config.extract.dump_dir else Path(config.run_dir) / "dump"
    server = SGLangServer(
        config.server,
        Path(model_dir),
        dump_dir=dump_dir if capture else None,
        layers=layers,
        log_dir=Path(config.run_dir) / "server",
        base_env=server_env(),  # the task is the edge: NCCL_*/CUDA_* of the worker pass through
        on_line=lambda line: logger.info("sglang | %s", line),
    )
    server.start()
    _SERVERS[server.url] = server
    logger.info("SGLang %s ready at %s (log %s, run id %s)", server.version, server.url, server.log_path,
                run_id_of(Path(config.run_dir)))  # fmt: skip
    return server.url


@task(name="stop-sglang", retries=0, timeout_seconds=STOP_TIMEOUT_S, cache_policy=NO_CACHE)
def stop_server_task(url: str) -> None:
    """SIGTERM to the server's process group, SIGKILL after the grace period; a no-op for attached servers."""
    server = _SERVERS.pop(url, None)
    if server is not None:
        server.stop()
        get_run_logger().info("SGLang at %s stopped", url)


@task(name="doctor", retries=0, timeout_seconds=DOCTOR_TIMEOUT_S, cache_policy=NO_CACHE)
def doctor_task(config: PipelineConfig, launch: bool = True) -> bool:
    """Run the node checks; the report becomes a markdown artifact and the verdict a log line."""
    report = run_doctor(config, base_env=dict(os.environ), launch=launch)
    md = ["| check | status | detail |", "|---|---|---|"]
    md += [f"| {c.name} | {c.status} | {c.detail.replace('|', '/')} |" for c in report.checks]
    markdown_artifact(run_key(config.run_dir, "doctor"), "\n".join([*md, "", f"**{report.verdict}**"]), "eagle3 doctor")
    (get_run_logger().info if report.ok else get_run_logger().error)("doctor: %s", report.verdict)
    return report.ok
