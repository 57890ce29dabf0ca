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
from eagle3.convert.stage import convert
from eagle3.data.synthesize import synthesize
from eagle3.evaluate.offline import evaluate_offline
from eagle3.extract.engines.transformers_engine import TransformersEngine
from eagle3.extract.shard import extract_shard, open_run
from eagle3.release.export import export_draft
from eagle3.release.promote import EvalRecord, EvalSet, current_link, pointed, promote
from eagle3.store.run_store import RunStore
from eagle3.target.files import sha256_file
from eagle3.train.job import TrainJob
from eagle3.train.trainer import Trainer

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_torch_thread")]

FACTS = ["Paris is the capital of France.", "Bees make honey.", "Three times four is twelve.",
         "Hola means hello in Spanish.", "The sky is blue.", "A cat sat on a mat."]  # fmt: skip
TRAIN = {"batch_tokens": 256, "ttt_steps": 2, "warmup_steps": 2, "draft_vocab_size": 512, "precision": "fp32",
         "log_every": 1, "checkpoint_every": 100, "loader_threads": 1, "prefetch_batches": 2}  # fmt: skip


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory, demo_model: Path) -> PipelineConfig:
    """A converted demo store of twelve short conversations whose answers the target wrote itself (synthesize,
    greedy), so a trained draft can learn what the target says; the evaluation set is its first three prompts."""
    root = tmp_path_factory.mktemp("retrain")
    rows = [{"messages": [{"role": "user", "content": f"Tell me fact {i}."},
                          {"role": "assistant", "content": FACTS[i % len(FACTS)] + f" That is fact {i}."}]}
            for i in range(12)]  # fmt: skip
    (root / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = PipelineConfig.model_validate({
        "run_dir": str(root / "run"), "model": str(demo_model), "server": {"device": "cpu"},
        "data": {"dataset": str(root / "data.jsonl"), "max_length": 128}, "train": TRAIN,
        "synthesize": {"max_new_tokens": 24, "batch_size": 12},
        "evaluate": {"dataset": str(root / "data.jsonl"), "num_prompts": 3, "max_new_tokens": 8, "draft_steps": 2},
    })  # fmt: skip
    store = RunStore(cfg.run_dir)
    synthesize(cfg, store, demo_model)
    engine = TransformersEngine(demo_model, device="cpu", dtype="bfloat16", batch_tokens=512)
    info = open_run(cfg, store, demo_model, engine.info)
    assert extract_shard(store, 0, engine, info).status == "complete"
    convert(cfg, store, workers=1)
    return cfg


def train(cfg: PipelineConfig, model: Path, out: Path, init_from: Path | None = None, **over: object) -> Trainer:
    tc = TrainConfig.model_validate({**TRAIN, **over})
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


def test_draft_current_moves_to_a_better_draft_and_stays_when_the_new_one_is_worse(
    run: PipelineConfig, demo_model: Path
) -> None:
    root = Path(run.run_dir)
    bad = trained_export(run, demo_model, "bad", lr=1e-9, max_steps=2)
    first = promote(root, bad, evaluation(run, demo_model, "bad"))
    assert first.promoted and pointed(current_link(root)) == bad.resolve()  # the first draft: nothing to beat

    good = trained_export(run, demo_model, "good", lr=3e-3, max_steps=40)
    better = promote(root, good, evaluation(run, demo_model, "good"))
    assert better.promoted, better.reason
    assert better.candidate_eval.acceptance_length > first.candidate_eval.acceptance_length
    assert pointed(current_link(root)) == good.resolve()

    worse_dir = trained_export(run, demo_model, "bad-again", lr=1e-9, max_steps=2, seed=1)
    worse = promote(root, worse_dir, evaluation(run, demo_model, "bad-again"))
    assert not worse.promoted and "is worse than the current draft's" in worse.reason
    assert pointed(current_link(root)) == good.resolve()  # serving still gets the good draft
    decision = json.loads((root / "draft" / "promotion.json").read_text())
    assert decision["promoted"] is False and decision["reason"] == worse.reason


def test_a_warm_start_begins_from_the_previous_draft_and_learns_faster_than_a_fresh_one(
    run: PipelineConfig, demo_model: Path, tmp_path: Path
) -> None:
    previous = trained_export(run, demo_model, "previous", lr=3e-3, max_steps=30)
    weights = load_file(str(previous / "model.safetensors"))
    with train(run, demo_model, tmp_path / "warm", init_from=previous, lr=1e-4, max_steps=3) as warm:
        assert warm.warm is not None and warm.warm.lm_head_rows == warm.warm.draft_vocab  # same store, same vocab
        state = warm.model.trainable_state_dict()
        for key in ("fc.weight", "midlayer.self_attn.q_proj.weight", "norm.weight", "lm_head.weight"):
            assert torch.equal(state[key].to(torch.bfloat16), weights[key]), key
        warm_loss = warm.run().last_metrics["loss"]
    with train(run, demo_model, tmp_path / "fresh", lr=1e-4, max_steps=3) as fresh:
        assert fresh.warm is None
        fresh_loss = fresh.run().last_metrics["loss"]
    assert warm_loss < 0.8 * fresh_loss  # it continues from the trained draft, with its own 3-step schedule
