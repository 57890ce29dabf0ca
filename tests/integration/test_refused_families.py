"""A family SGLang feeds something else than the residual stream (Gemma-3: docs/models.md, "What SGLang feeds the
draft"), on its tiny target: a store from the transformers engine trains a draft and is evaluated offline (both read
the residual stream), while every way to a draft SGLang would serve is refused with the reason: before the first
stage when export is in the stages, by the export itself, and by the SGLang engine before any server starts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from eagle3.checks.preflight import PreflightError, check_run
from eagle3.convert import convert
from eagle3.draft.checkpoint import resolve_checkpoint
from eagle3.evaluate.offline import evaluate_offline
from eagle3.extract.engines import build_engine
from eagle3.release.export import ExportError, export_draft
from eagle3.serving.layers import LayerMappingError
from eagle3.store.run_store import RunStore
from eagle3.target.families import REFUSED_ARCHITECTURES
from eagle3.target.tiny import ensure_tiny_model
from eagle3.train.job import TrainJob
from eagle3.train.trainer import Trainer
from tests.integration.test_architectures import REPO, pipeline_config, prepare_and_extract

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_torch_thread")]


@pytest.mark.parametrize("arch", REFUSED_ARCHITECTURES)
def test_a_transformers_store_trains_but_no_stage_gives_sglang_a_draft_of_another_tap(
    arch: str, demo_model: Path, tmp_path: Path
) -> None:
    model = ensure_tiny_model(REPO / "data", arch)
    cfg = pipeline_config(tmp_path, model, arch)  # stages prepare ... export, evaluate
    with pytest.raises(PreflightError, match=r"not the residual stream.*export \(") as refused:
        check_run(cfg, model)
    assert "before the first stage" in str(refused.value)
    served = cfg.model_copy(update={"server": cfg.server.model_copy(update={"engine": "sglang", "python": "/none"})})
    with pytest.raises(LayerMappingError, match=r"not the residual stream"):
        build_engine(served, model, base_env={})  # refused while building: no interpreter is ever run

    trained_only = cfg.model_copy(update={"stages": ["prepare", "extract", "convert", "train", "evaluate"]})
    check_run(trained_only, model)  # nothing served: the residual stream is trained on and evaluated offline
    store = RunStore(cfg.run_dir)
    prepare_and_extract(cfg, store, model)
    assert json.loads((Path(cfg.run_dir) / "run.json").read_text())["tap"] == "residual"
    convert(cfg, store)
    out = tmp_path / "train"
    job = TrainJob(train=cfg.train, run_dir=cfg.run_dir, model_dir=str(model), out_dir=str(out), device="cpu")
    with Trainer.build(job) as t:
        t.run()
    ckpt = resolve_checkpoint(out / "checkpoints")
    offline = evaluate_offline(cfg.evaluate, Path(cfg.run_dir), model, ckpt)
    assert offline.identical_to_greedy == offline.num_prompts == 2

    dest = Path(cfg.run_dir) / "draft" / "exports" / "x"
    with pytest.raises(ExportError, match=r"not the residual stream.*cannot give SGLang a draft"):
        export_draft(ckpt, Path(cfg.run_dir), model, dest)
    assert not dest.exists()
