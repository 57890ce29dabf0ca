"""preflight: refuse before the first stage what a later stage would refuse (eagle3.checks.preflight.check_run); the
flows other than the pipeline ask the same of the stages they run, on the worker they run on (check_stages: SGLang
can serve what they make, the devices set to cuda are there, the vocabulary map fits train.draft_vocab_size); a
fan-out asks check_run of its nodes' stages, less the devices, before it starts a node."""

from __future__ import annotations

from pathlib import Path

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from eagle3.checks.preflight import check_run, check_stages
from eagle3.config import PipelineConfig

PREFLIGHT_TIMEOUT_S = 10 * 60  # hashes the model directory's small files and reads a few JSON files


@task(name="preflight", retries=0, timeout_seconds=PREFLIGHT_TIMEOUT_S, cache_policy=NO_CACHE)
def preflight_task(config: PipelineConfig, model_dir: str, on_nodes: bool = False) -> None:
    """Check the run's settings against each other, the model and the store's records; fails naming the keys and
    the fix. `on_nodes`: the stages run on other workers (a fan-out's nodes), which check their own devices.
    Deterministic, so never retried."""
    check_run(config, Path(model_dir), on_nodes=on_nodes)
    get_run_logger().info("preflight: stages %s fit %s", config.stages, config.run_dir)


@task(name="preflight-stages", retries=0, timeout_seconds=PREFLIGHT_TIMEOUT_S, cache_policy=NO_CACHE)
def stages_preflight_task(
    config: PipelineConfig, model_dir: str, stages: list[str], train_here: bool | None = None
) -> None:
    """Refuse, before the first of `stages` (those this flow runs), what they would refuse on this worker: a target
    SGLang cannot serve an EAGLE-3 draft of as the pipeline stores it, a device set to cuda where there is none, a
    vocabulary map built for another train.draft_vocab_size. `train_here`: training runs on this worker (None: when
    train.nodes is 1)."""
    check_stages(config.model_copy(update={"stages": stages}), Path(model_dir), train_here=train_here)
    get_run_logger().info("preflight: stages %s fit %s on this worker", stages, config.run_dir)
