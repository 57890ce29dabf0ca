"""The trainer end to end on CPU over a tiny synthetic store in the exact store format."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from eagle3.config import TrainConfig
from eagle3.draft.data import plan_epoch
from eagle3.draft.distill import target_distribution
from eagle3.draft.eagle3.loss import ttt_loss
from eagle3.draft.synthetic import SyntheticSpec, write_run
from eagle3.store.sample_format import encode_sample, read_sample, write_sample
from eagle3.train.job import TrainJob, write_job
from eagle3.train.launch import read_metrics
from eagle3.train.trainer import NonFiniteLossError, Trainer

pytestmark = pytest.mark.usefixtures("one_torch_thread")

REPO = Path(__file__).resolve().parents[2]
SPEC = SyntheticSpec(lengths=tuple([24, 40, 33, 17, 48, 29, 36, 21] * 4))


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("synthetic")
    write_run(root / "store", root / "target", SPEC)
    return root


def job(store: Path, out: Path, **train: object) -> TrainJob:
    base: dict[str, object] = {"batch_tokens": 128, "max_steps": 8, "lr": 3e-3, "warmup_steps": 2, "ttt_steps": 3,
                               "draft_vocab_size": 96, "precision": "fp32", "log_every": 1, "checkpoint_every": 100,
                               "loader_threads": 2, "prefetch_batches": 2}  # fmt: skip
    cfg = TrainConfig.model_validate({**base, **train})
    return TrainJob(train=cfg, run_dir=str(store / "store"), model_dir=str(store / "target"), out_dir=str(out),
                    device="cpu")  # fmt: skip


def metrics(out: Path) -> dict[int, dict]:
    """The last record of each step, by step (eagle3.train.launch.read_metrics)."""
    return {r["step"]: r for r in read_metrics(out / "metrics.jsonl")}


def test_a_few_training_steps_lower_the_loss_and_raise_step0_accuracy(store: Path, tmp_path: Path) -> None:
    with Trainer.build(job(store, tmp_path, max_steps=40, log_every=5)) as t:
        # the untrained draft on the first batches, before any update
        first = next(t.stream.iterate(t.pos))[1]
        with torch.no_grad():
            m = t.model
            target = target_distribution(first.last_hidden, t.lm_head, m.d2t, m.t2d, 64)
            logits = m(first.input_ids, first.aux_hidden.float(), first.positions, first.remaining,
                       t.attend_for(first.doc), 3)  # fmt: skip
            before = ttt_loss(logits, target, first.loss_mask, first.remaining, m.d2t, 0.8)
        t.run()
    rec = metrics(tmp_path)
    assert rec[40]["loss"] < 0.8 * float(before.total)
    assert rec[40]["step_acc"][0] > float(before.step_hits[0] / before.step_labels[0]) + 0.2
    assert (tmp_path / "checkpoints" / "step-00000040" / "model.safetensors").is_file()
    assert list((tmp_path / "tb").glob("events.out.tfevents.*"))


def test_resume_after_a_kill_continues_with_the_same_next_step_loss(store: Path, tmp_path: Path) -> None:
    with Trainer.build(job(store, tmp_path / "straight")) as t:
        t.run()
    straight = metrics(tmp_path / "straight")

    killed = tmp_path / "killed"
    with Trainer.build(job(store, killed, checkpoint_every=3)) as t:
        t.run(stop_at_step=5)  # a kill after step 5: steps 4 and 5 are lost, checkpoint 3 survives
    stale = killed / "checkpoints" / ".step-00000006.tmp"  # a kill in the middle of writing a checkpoint
    stale.mkdir()
    (stale / "model.safetensors").write_bytes(b"partial")
    with Trainer.build(job(store, killed, checkpoint_every=3)) as t:
        assert t.step == 3 and t.checkpoint is not None and t.checkpoint.name == "step-00000003"
        t.run()
    resumed = metrics(killed)
    for step in range(4, 9):
        assert resumed[step]["loss"] == pytest.approx(straight[step]["loss"], abs=1e-5), step
        assert resumed[step]["step_loss"] == pytest.approx(straight[step]["step_loss"], abs=1e-5)
        assert resumed[step]["lr"] == pytest.approx(straight[step]["lr"], rel=1e-12)


@pytest.mark.slow  # inductor compiles the blocks and the loss for the CPU (C++): ~1 minute
def test_a_compiled_training_gives_the_eager_losses_step_by_step(store: Path, tmp_path: Path) -> None:
    """train.compile on (the blocks and the fused soft cross-entropy through inductor, as `auto` does on a GPU)
    against off: the same losses per step and per TTT step, to float rounding, over updates that feed back."""
    runs = {}
    for mode in ("off", "on"):
        with Trainer.build(job(store, tmp_path / mode, compile=mode, max_steps=4)) as t:
            assert t.compiled == (mode == "on")
            t.run()
        runs[mode] = metrics(tmp_path / mode)
    for step in range(1, 5):
        assert runs["on"][step]["loss"] == pytest.approx(runs["off"][step]["loss"], rel=1e-4), step
        assert runs["on"][step]["step_loss"] == pytest.approx(runs["off"][step]["step_loss"], rel=1e-4), step
    assert runs["off"][4]["loss"] < runs["off"][1]["loss"]  # the steps did train


def test_a_non_finite_loss_stops_the_run_naming_the_step(tmp_path: Path) -> None:
    spec = SyntheticSpec(lengths=(30, 31, 32, 33))
    paths = write_run(tmp_path / "store", tmp_path / "target", spec)
    for path in paths:  # a store with a NaN in every sample's final state, at a row a loss reads (labelled_rows)
        s = read_sample(path)
        s.last_hidden_state[int(torch.as_tensor(s.loss_mask)[1:].nonzero()[0])] = float("nan")
        write_sample(
            path,
            encode_sample(
                path.stem, list(spec.aux_layers), s.input_ids, s.loss_mask, s.aux_hidden_states, s.last_hidden_state
            ),
        )
    with (
        Trainer.build(job(tmp_path, tmp_path / "out")) as t,
        pytest.raises(NonFiniteLossError, match=r"^step 1: loss nan"),
    ):
        t.run()
    assert not (tmp_path / "out" / "checkpoints").exists()


def test_the_data_plan_is_deterministic_and_covers_each_sample_once_per_epoch() -> None:
    lengths = [int(x) for x in torch.randint(5, 90, (200,))]
    a, b = plan_epoch(lengths, 256, seed=3, epoch=1), plan_epoch(lengths, 256, seed=3, epoch=1)
    assert a == b and a != plan_epoch(lengths, 256, seed=3, epoch=2)
    assert sorted(i for row in a for i in row) == list(range(200))
    assert all(sum(min(lengths[i], 256) for i in row) <= 256 for row in a)
    fill = sum(lengths) / (len(a) * 256)
    assert fill > 0.9, f"length bucketing packs rows only {fill:.0%} full"


@pytest.mark.slow
def test_torchrun_with_two_gloo_processes_averages_the_gradient_of_one_process(store: Path, tmp_path: Path) -> None:
    two = job(store, tmp_path / "two", max_steps=6, log_every=1)
    write_job(tmp_path / "job.json", two)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", "29517",
           "-m", "eagle3.train.worker", str(tmp_path / "job.json")]  # fmt: skip
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert '"result"' in proc.stdout
    rec = metrics(tmp_path / "two")
    assert sorted(rec) == list(range(1, 7)) and rec[6]["loss"] < rec[1]["loss"]

    # one process over the same two rows of step 1: mean loss and norm of the mean gradient agree
    with Trainer.build(job(store, tmp_path / "one", max_steps=6)) as t:
        rows = t.stream.plan(0)[:2]
        losses = []
        for row in rows:
            b = t.stream._load(row)
            m = t.model
            target = target_distribution(b.last_hidden, t.lm_head, m.d2t, m.t2d, 64)
            logits = m(b.input_ids, b.aux_hidden.float(), b.positions, b.remaining, t.attend_for(b.doc), 3)
            out = ttt_loss(logits, target, b.loss_mask, b.remaining, m.d2t, 0.8)
            (out.total / 2).backward()
            losses.append(out.total.item())
        norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(p.grad) for p in t.params]))
    assert rec[1]["loss"] == pytest.approx(sum(losses) / 2, rel=1e-5)
    assert rec[1]["grad_norm"] == pytest.approx(float(norm), rel=1e-4)


@pytest.mark.slow
def test_a_worker_killed_at_a_random_moment_resumes_to_the_same_losses(store: Path, tmp_path: Path) -> None:
    with Trainer.build(job(store, tmp_path / "straight", max_steps=12)) as t:
        t.run()
    straight = metrics(tmp_path / "straight")

    out = tmp_path / "killed"
    write_job(tmp_path / "job.json", job(store, out, max_steps=12, checkpoint_every=2))
    cmd = [sys.executable, "-m", "eagle3.train.worker", str(tmp_path / "job.json")]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        for _ in range(1200):  # SIGKILL once step 5 is logged: wherever the worker is then, mid-step or mid-save
            if (out / "metrics.jsonl").is_file() and len((out / "metrics.jsonl").read_text().splitlines()) >= 5:
                break
            if proc.poll() is not None:
                pytest.fail(f"worker ended early: {proc.stderr.read().decode()[-2000:]}")  # type: ignore[union-attr]
            time.sleep(0.1)
        proc.kill()
    finally:
        proc.wait()
    assert proc.returncode == -9
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    resumed = metrics(out)
    assert sorted(resumed) == list(range(1, 13))
    for step in range(1, 13):
        assert resumed[step]["loss"] == pytest.approx(straight[step]["loss"], abs=1e-5), step


def as_kimi_k25(target: Path, out: Path) -> Path:
    """The synthetic target laid out as Kimi-K2.5 ships: a vision wrapper whose config.json keeps a DeepSeek-V3
    text backbone (MLA, yarn rope) under text_config, and weights under `language_model.`."""
    from safetensors.torch import load_file, save_file

    out.mkdir()
    text = json.loads((target / "config.json").read_text())
    text |= {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "kimi_k2", "kv_lora_rank": 16,
             "q_lora_rank": 32, "qk_rope_head_dim": 8, "head_dim": 8,  # MLA: config head_dim is the rope part
             "rope_parameters": None, "rope_theta": 50000.0,
             "rope_scaling": {"type": "yarn", "factor": 64.0, "original_max_position_embeddings": 4096,
                              "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0}}  # fmt: skip
    wrapper = {"architectures": ["KimiK25ForConditionalGeneration"], "model_type": "kimi_k25", "text_config": text}
    (out / "config.json").write_text(json.dumps(wrapper))
    weights = load_file(str(target / "model.safetensors"))
    save_file({f"language_model.{k}": v for k, v in weights.items()}, str(out / "model.safetensors"))
    return out


def test_a_draft_of_a_wrapped_mla_target_with_yarn_rope_trains_exports_and_loads_back(
    store: Path, tmp_path: Path
) -> None:
    """Kimi-K2.5's layout (the case study's model): the draft reads the wrapper's text_config, finds the embedding
    and lm_head under `language_model.`, trains with plain RoPE at the target's theta (yarn is not the draft's),
    and the exported config.json says so, as SGLang will build it."""
    from eagle3.draft.load import load_draft
    from eagle3.release.export import export_draft

    model = as_kimi_k25(store / "target", tmp_path / "kimi")
    out = tmp_path / "train"
    j = job(store, out, max_steps=3)
    j = TrainJob(train=j.train, run_dir=j.run_dir, model_dir=str(model), out_dir=str(out), device="cpu")
    with Trainer.build(j) as t:
        assert t.model.cfg.rope_theta == 50000.0 and t.model.cfg.rope_scaling is None
        assert "yarn" in t.model.cfg.note and "MLA" in t.model.cfg.note
        t.run()
    assert metrics(out)[3]["loss"] > 0

    export_draft(out, store / "store", model, tmp_path / "export")
    cfg = json.loads((tmp_path / "export" / "config.json").read_text())
    assert (cfg["rope_scaling"], cfg["rope_theta"], cfg["vocab_size"]) == (None, 50000.0, SPEC.vocab_size)
    assert cfg["num_attention_heads"] * cfg["head_dim"] == SPEC.hidden_size  # MLA: heads fill H

    draft = load_draft(model, out).model
    with Trainer.build(j) as t:  # the last checkpoint, resumed
        trained = t.model.trainable_state_dict()
    for key, value in draft.trainable_state_dict().items():
        torch.testing.assert_close(value, trained[key], msg=key)


def test_train_without_a_draft_vocab_size_takes_the_stores_map_and_a_mismatched_one_is_refused(
    store: Path, tmp_path: Path
) -> None:
    """train.draft_vocab_size unset: the draft's vocabulary is the map convert built (96 ids here), so the train
    deployment given only a run_dir trains on any converted store; set to another size, refused naming both."""
    with Trainer.build(job(store, tmp_path / "unset", draft_vocab_size=None, max_steps=1)) as t:
        assert t.model.cfg.draft_vocab_size == 96
        t.run()
    with pytest.raises(Exception, match=r"has 96 draft ids, train.draft_vocab_size asks 64; re-run convert"):
        Trainer.build(job(store, tmp_path / "other", draft_vocab_size=64))
