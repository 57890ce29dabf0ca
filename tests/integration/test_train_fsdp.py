"""train.parallel = fsdp (FSDP2) against ddp: two gloo processes under torchrun on CPU, and checkpoints that move
between the two. Each run is one torchrun of a few seconds over the tiny synthetic store of test_train.py."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors.torch import load_file

from eagle3.draft.checkpoint import WEIGHTS
from eagle3.draft.synthetic import write_run
from eagle3.train.job import write_job
from tests.integration.test_train import REPO, SPEC, job, metrics
from tests.ports import free_port

pytestmark = pytest.mark.usefixtures("one_torch_thread")

STEPS = 6
#: ddp all-reduces whole gradients, fsdp reduce-scatters them and takes the clipping norm from per-shard norms:
#: the same math in another summation order. Seen on CPU (torch 2.13, fp32): at most 2.1e-7 relative over the
#: six steps' losses, per-step losses and grad norms; checkpoint tensors 6e-8 of their largest value
TOL = 1e-6


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("synthetic")
    write_run(root / "store", root / "target", SPEC)
    return root


def torchrun(store: Path, out: Path, parallel: str) -> dict[int, dict]:
    """Two gloo processes train STEPS steps into `out` (checkpoints after steps 3 and 6, or resume from out's)."""
    path = out.parent / f"{out.name}-job.json"
    write_job(path, job(store, out, max_steps=STEPS, checkpoint_every=3, parallel=parallel))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port()),
           "-m", "eagle3.train.worker", str(path)]  # fmt: skip
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert '"result"' in proc.stdout
    return metrics(out)


def killed_after_step_3(src: Path, dst: Path) -> Path:
    """A copy of run `src` as a kill after its step-3 checkpoint would leave it (steps 4-6 to be redone)."""
    shutil.copytree(src, dst)
    shutil.rmtree(dst / "checkpoints" / "step-00000006")
    (dst / "checkpoints" / "latest.json").unlink()  # resume then takes the newest complete step-*
    return dst


def assert_same(a: dict[int, dict], b: dict[int, dict], steps: range) -> None:
    for step in steps:
        assert a[step]["loss"] == pytest.approx(b[step]["loss"], rel=TOL), step
        assert a[step]["step_loss"] == pytest.approx(b[step]["step_loss"], rel=TOL), step
        assert a[step]["grad_norm"] == pytest.approx(b[step]["grad_norm"], rel=TOL), step
        assert a[step]["lr"] == pytest.approx(b[step]["lr"], rel=1e-12), step


@pytest.mark.slow
def test_fsdp_gives_ddp_losses_and_checkpoints_move_between_them(store: Path, tmp_path: Path) -> None:
    fsdp = torchrun(store, tmp_path / "fsdp", "fsdp")
    ddp = torchrun(store, tmp_path / "ddp", "ddp")
    assert sorted(fsdp) == sorted(ddp) == list(range(1, STEPS + 1))
    assert fsdp[STEPS]["loss"] < fsdp[1]["loss"]
    assert_same(fsdp, ddp, range(1, STEPS + 1))

    # the same checkpoint either way: whole tensors by parameter name, not shards
    for name in (WEIGHTS, "optimizer.safetensors"):
        a = load_file(str(tmp_path / "fsdp" / "checkpoints" / "step-00000003" / name))
        b = load_file(str(tmp_path / "ddp" / "checkpoints" / "step-00000003" / name))
        assert sorted(a) == sorted(b) and a
        for k in b:
            assert a[k].shape == b[k].shape and a[k].dtype == b[k].dtype, k
            assert (a[k].float() - b[k].float()).abs().max() <= TOL * max(1.0, float(b[k].float().abs().max())), k

    # a run checkpointed under one resumes under the other, with the uninterrupted run's next losses
    to_ddp = torchrun(store, killed_after_step_3(tmp_path / "fsdp", tmp_path / "fsdp-then-ddp"), "ddp")
    to_fsdp = torchrun(store, killed_after_step_3(tmp_path / "ddp", tmp_path / "ddp-then-fsdp"), "fsdp")
    for resumed in (to_ddp, to_fsdp):
        assert_same(resumed, ddp, range(4, STEPS + 1))
        assert_same(resumed, fsdp, range(4, STEPS + 1))
