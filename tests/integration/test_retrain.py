"""Retraining a grown store on the demo model: a warm start begins from the promoted draft's weights, and
`draft/current` moves to a better draft and stays when the new one is worse (a deliberately bad training:
a learning rate of 1e-9 leaves the draft at its random initialisation). Real training, export and offline
evaluation; the library calls the train, export, evaluate and promote tasks make."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from eagle3.config import EvaluateConfig, PipelineConfig, TrainConfig
from eagle3.evaluate.offline import evaluate_offline
from eagle3.release.export import export_draft
from eagle3.release.promote import EvalRecord, EvalSet, current_link, pointed, promote
from eagle3.target.files import sha256_file
from eagle3.train.job import TrainJob
from eagle3.train.trainer import Trainer

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_torch_thread")]


def train(cfg: PipelineConfig, model: Path, out: Path, init_from: Path | None = None, **over: object) -> Trainer:
    tc = TrainConfig.model_validate({**cfg.train.model_dump(), **over})
    job = TrainJob(train=tc, run_dir=cfg.run_dir, model_dir=str(model), out_dir=str(out), device="cpu",
                   init_from=str(init_from) if init_from else None)  # fmt: skip
    return Trainer.build(job)


def trained_export(cfg: PipelineConfig, model: Path, name: str, **over: object) -> Path:
    out = Path(cfg.run_dir) / "trains" / name
    with train(cfg, model, out, **over) as t:
        t.run()
    dest = Path(cfg.run_dir) / "draft" / "exports" / name
    export_draft(out, Path(cfg.run_dir), model, dest, speculative_tokens=cfg.evaluate.draft_steps)
    return dest


def evaluation(cfg: PipelineConfig, model: Path, name: str) -> EvalRecord:
    ev: EvaluateConfig = cfg.evaluate.model_copy(update={"device": "cpu"})
    off = evaluate_offline(ev, Path(cfg.run_dir), model, Path(cfg.run_dir) / "trains" / name)
    eval_set = EvalSet(dataset_sha256=sha256_file(Path(ev.dataset)), num_prompts=off.num_prompts,
                       max_new_tokens=off.max_new_tokens, draft_steps=off.steps, offline_dtype=off.dtype)  # fmt: skip
    return EvalRecord(eval_set=eval_set, acceptance_length=off.acceptance_length)


@pytest.fixture(scope="module")
def good(demo_store: PipelineConfig, demo_model: Path) -> Path:
    """A trained draft's export (40 steps at 3e-3), for both tests: the better draft, and the warm start's source."""
    return trained_export(demo_store, demo_model, "good", lr=3e-3, max_steps=40)


def test_draft_current_moves_to_a_better_draft_and_stays_when_the_new_one_is_worse(
    demo_store: PipelineConfig, demo_model: Path, good: Path
) -> None:
    root = Path(demo_store.run_dir)
    bad = trained_export(demo_store, demo_model, "bad", lr=1e-9, max_steps=2)
    first = promote(root, bad, evaluation(demo_store, demo_model, "bad"))
    assert first.promoted and pointed(current_link(root)) == bad.resolve()  # the first draft: nothing to beat

    better = promote(root, good, evaluation(demo_store, demo_model, "good"))
    assert better.promoted, better.reason
    assert better.candidate_eval.acceptance_length > first.candidate_eval.acceptance_length
    assert pointed(current_link(root)) == good.resolve()

    worse_dir = trained_export(demo_store, demo_model, "bad-again", lr=1e-9, max_steps=2, seed=1)
    worse = promote(root, worse_dir, evaluation(demo_store, demo_model, "bad-again"))
    assert not worse.promoted and "is worse than the current draft's" in worse.reason
    assert pointed(current_link(root)) == good.resolve()  # serving still gets the good draft
    decision = json.loads((root / "draft" / "promotion.json").read_text())
    assert decision["promoted"] is False and decision["reason"] == worse.reason


def test_a_warm_start_begins_from_the_previous_draft_and_learns_faster_than_a_fresh_one(
    demo_store: PipelineConfig, demo_model: Path, tmp_path: Path, good: Path
) -> None:
    previous = good
    weights = load_file(str(previous / "model.safetensors"))
    with train(demo_store, demo_model, tmp_path / "warm", init_from=previous, lr=1e-4, max_steps=3) as warm:
        assert warm.warm is not None and warm.warm.lm_head_rows == warm.warm.draft_vocab  # same store, same vocab
        state = warm.model.trainable_state_dict()
        for key in ("fc.weight", "midlayer.self_attn.q_proj.weight", "norm.weight", "lm_head.weight"):
            assert torch.equal(state[key].to(torch.bfloat16), weights[key]), key
        warm_loss = warm.run().last_metrics["loss"]
    with train(demo_store, demo_model, tmp_path / "fresh", lr=1e-4, max_steps=3) as fresh:
        assert fresh.warm is None
        fresh_loss = fresh.run().last_metrics["loss"]
    assert warm_loss < 0.8 * fresh_loss  # it continues from the trained draft, with its own 3-step schedule
