"""Held-out measurement and best-checkpoint selection in the real trainer, on CPU over a tiny synthetic store."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from eagle3.draft.checkpoint import read_best, read_latest, read_state, resolve_checkpoint, step_dir
from eagle3.draft.data import load_index, read_row
from eagle3.draft.distill import target_distribution
from eagle3.draft.heldout import split_heldout
from eagle3.draft.synthetic import write_run
from eagle3.release.export import export_draft
from eagle3.release.promote import export_dir_for
from eagle3.store.paths import RunPaths
from eagle3.train.job import TrainJob, write_job
from eagle3.train.launch import read_heldout_metrics, read_metrics
from eagle3.train.trainer import Trainer, TrainError
from tests.integration import test_train
from tests.integration.test_train import REPO, SPEC
from tests.ports import free_port

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("synthetic")
    write_run(root / "store", root / "target", SPEC)
    return root


def job(store: Path, out: Path, **train: object) -> TrainJob:
    """test_train's job, with a fifth of the store held out unless a test says otherwise."""
    return test_train.job(store, out, **{"heldout_fraction": 0.2, **train})


def test_training_never_reads_a_heldout_sample_and_the_steps_count_only_the_rest(store: Path, tmp_path: Path) -> None:
    everything = load_index(store / "store")
    train, held = split_heldout(everything, 0.2, RunPaths(store / "store").index_path)
    assert held and train
    with Trainer.build(job(store, tmp_path, max_steps=None, epochs=1.0)) as t:
        trained = {s.sample_id for s in t.stream.samples}
        measured = {s.sample_id for row in t.heldout for s in row}
        assert trained == {s.sample_id for s in train} and measured == {s.sample_id for s in held}
        assert trained.isdisjoint(measured)
        per_epoch = t.stream.steps_per_epoch(0)
        assert t.total_steps == per_epoch
        planned = {i for row in t.stream.plan(0) for i in row}
        assert {t.stream.samples[i].sample_id for i in planned} == trained


def test_heldout_metrics_in_state_json_and_metrics_jsonl_equal_a_direct_computation(
    store: Path, tmp_path: Path
) -> None:
    with Trainer.build(job(store, tmp_path, max_steps=12, checkpoint_every=6)) as t:
        t.run()
        # the final weights, measured here by hand: per position, step i predicts x[t+2+i] from the draft's own
        # chain; correct when its argmax (a target id) is the target's argmax there
        k, m = 3, t.model
        hits, labels, accepted, starts, tokens = [0] * k, [0] * k, 0, 0, 0
        with torch.no_grad():
            for row in t.heldout:
                b = read_row([s.path for s in row], 128)
                target = target_distribution(b.last_hidden, t.lm_head, m.d2t, m.t2d, 64)
                logits = m(b.input_ids, b.aux_hidden.float(), b.positions, b.remaining, t.attend_for(b.doc), k)
                pred = [z.argmax(-1) + m.d2t[z.argmax(-1)] for z in logits]
                tokens += b.num_tokens
                n = b.num_tokens
                for pos in range(n):
                    run, chain = 0, True
                    for i in range(k):
                        ahead = pos + 2 + i
                        has_label = int(b.remaining[pos]) >= 2 + i and ahead < n and bool(b.loss_mask[ahead])
                        ok = has_label and int(pred[i][pos]) == int(target.argmax[pos + 1 + i])
                        hits[i] += ok
                        labels[i] += has_label
                        if i == 0 and not has_label:
                            chain = False
                        if chain and ok and run == i:
                            run += 1
                    if chain:
                        accepted, starts = accepted + 1 + run, starts + 1
    state = read_state(tmp_path / "checkpoints" / "step-00000012")["heldout"]
    assert state["k"] == 3 and state["tokens"] == tokens and state["positions"] == starts
    assert state["acc"] == pytest.approx([h / n for h, n in zip(hits, labels, strict=True)], abs=1e-12)
    assert state["acceptance_length"] == pytest.approx(accepted / starts, abs=1e-12)
    lines = read_heldout_metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in lines] == [6, 12]
    assert lines[-1]["heldout"] == {k_: v for k_, v in state.items() if k_ != "step"}
    assert [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl")] == list(range(1, 13))  # training lines only
    assert "step_acc" not in (tmp_path / "metrics.jsonl").read_text().splitlines()[-1]


def test_a_checkpoint_from_before_the_heldout_keys_does_not_resume_with_a_heldout_slice(
    store: Path, tmp_path: Path
) -> None:
    with Trainer.build(job(store, tmp_path, max_steps=2, heldout_fraction=0.0)) as t:
        t.run()
    state_json = tmp_path / "checkpoints" / "step-00000002" / "state.json"
    state = json.loads(state_json.read_text())
    for key in ("heldout_fraction", "heldout_max_tokens", "select_steps", "select"):  # as written before they existed
        del state["config"][key]
    state_json.write_text(json.dumps(state))
    with pytest.raises(TrainError, match=r"\(heldout_fraction 0\.0 -> 0\.2\); resuming would mix two trainings"):
        Trainer.build(job(store, tmp_path, max_steps=4))
    with Trainer.build(job(store, tmp_path, max_steps=4, heldout_fraction=0.0)) as t:  # its own settings resume
        assert t.step == 2


def test_a_checkpoint_from_the_sample_by_sample_split_does_not_resume_with_a_heldout_slice(
    store: Path, tmp_path: Path
) -> None:
    with Trainer.build(job(store, tmp_path, max_steps=2)) as t:
        t.run()
    state_json = tmp_path / "checkpoints" / "step-00000002" / "state.json"
    state = json.loads(state_json.read_text())
    assert state.pop("heldout_split") == "by-prompt"  # as written before the split was by prompt
    state_json.write_text(json.dumps(state))
    with pytest.raises(TrainError, match=r"step-00000002: its held-out slice was chosen sample by sample.*away"):
        Trainer.build(job(store, tmp_path, max_steps=4))


def wreck(t: Trainer) -> None:
    """Weights no optimizer step can repair: every later checkpoint measures worse than the trained ones."""
    with torch.no_grad():
        g = torch.Generator().manual_seed(1)
        t.model.lm_head.weight.copy_(100 * torch.randn(t.model.lm_head.weight.shape, generator=g))


def test_select_best_keeps_and_exports_the_best_checkpoint_through_a_kill_and_a_resume(
    store: Path, tmp_path: Path
) -> None:
    out = tmp_path / "train"
    settings = {"max_steps": 40, "checkpoint_every": 10, "keep_checkpoints": 1, "select": "best"}
    with Trainer.build(job(store, out, **settings)) as t:
        t.run(stop_at_step=20)  # trained: checkpoints 10, 20
        wreck(t)
        t.run(stop_at_step=30)  # checkpoint 30 is worse; then a kill
    root = out / "checkpoints"
    held = {r["step"]: r["heldout"]["acceptance_length"] for r in read_heldout_metrics(out / "metrics.jsonl")}
    assert held[30] < min(held[10], held[20]), held
    best_step = max((10, 20), key=lambda s: (held[s], -s))
    assert read_best(root) == (best_step, step_dir(root, best_step))
    assert step_dir(root, best_step).is_dir() and read_latest(root) == (30, step_dir(root, 30))  # kept though old
    assert {p.name for p in root.glob("step-*")} == {step_dir(root, best_step).name, "step-00000030"}

    (root / "best.json").write_text(json.dumps({"step": 30, "dir": "step-00000030", "acceptance_length": 9, "k": 3}))
    with Trainer.build(job(store, out, **settings)) as t:  # a kill had left best.json wrong: resume repairs it
        assert t.step == 30
        assert read_best(root) == (best_step, step_dir(root, best_step))
        t.run()
    held = {r["step"]: r["heldout"]["acceptance_length"] for r in read_heldout_metrics(out / "metrics.jsonl")}
    assert held[40] < held[best_step]
    assert read_best(root) == (best_step, step_dir(root, best_step)) and read_latest(root) == (40, step_dir(root, 40))
    assert resolve_checkpoint(out) == step_dir(root, best_step)

    run_dir = store / "store"
    result = export_draft(out, run_dir, store / "target", tmp_path / "export")
    assert result.checkpoint_step == best_step
    assert export_dir_for(run_dir, out).name.startswith(step_dir(root, best_step).name)


@pytest.mark.slow
def test_ddp_and_fsdp_ranks_measure_the_same_heldout_record_and_keep_training(store: Path, tmp_path: Path) -> None:
    records, losses = {}, {}
    for parallel in ("ddp", "fsdp"):
        out = tmp_path / parallel
        path = tmp_path / f"{parallel}-job.json"
        write_job(path, job(store, out, max_steps=6, checkpoint_every=3, parallel=parallel, select="best"))
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
               str(free_port()), "-m", "eagle3.train.worker", str(path)]  # fmt: skip
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        losses[parallel] = [r["loss"] for r in read_metrics(out / "metrics.jsonl")]
        assert len(losses[parallel]) == 6
        records[parallel] = {r["step"]: r["heldout"] for r in read_heldout_metrics(out / "metrics.jsonl")}
        assert sorted(records[parallel]) == [3, 6] and read_best(out / "checkpoints") is not None
    assert losses["fsdp"] == pytest.approx(losses["ddp"], rel=1e-6)  # the measurement leaves FSDP2 training intact
    for step in (3, 6):
        a, b = records["ddp"][step], records["fsdp"][step]
        assert a["tokens"] == b["tokens"] and a["acc"] == pytest.approx(b["acc"], abs=1e-9)
        assert a["acceptance_length"] == pytest.approx(b["acceptance_length"], abs=1e-9)
