"""The block drafters (train.method dflash, dspark) through the shared trainer, export, SGLang 0.5.23's loader and
the offline evaluator, on CPU: a synthetic 5-layer store for training and export, the demo target for exact
decoding."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from eagle3.config import TrainConfig
from eagle3.data.chat import ChatTokenizer
from eagle3.draft.checkpoint import save_checkpoint
from eagle3.draft.dflash import default_layers
from eagle3.draft.methods import method_named
from eagle3.draft.shape import DraftConfig
from eagle3.draft.synthetic import SyntheticSpec, write_run
from eagle3.evaluate.offline import load_eval_prompts, offline_acceptance
from eagle3.release.export import export_draft
from eagle3.store.fsio import read_json
from eagle3.train.job import TrainJob
from eagle3.train.launch import read_metrics
from eagle3.train.trainer import Trainer
from tests.integration.sglang_support import SGLANG_PYTHON, require_sglang_env
from tests.ports import free_port

pytestmark = pytest.mark.usefixtures("one_torch_thread")

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
LAYERS = (2, 3, 4, 5, 6)  # SGLang's build_target_layer_ids(8, 5) = [1..5], as HF indices
SPEC = SyntheticSpec(aux_layers=LAYERS, lengths=tuple([24, 40, 33, 17, 48, 29, 36, 21] * 4))
BLOCK = 4
METHODS = ("dflash", "dspark")
ALGORITHM = {"dflash": "DFLASH", "dspark": "DSPARK"}


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("dflash")
    write_run(root / "store", root / "target", SPEC)
    return root


def job(store: Path, out: Path, method: str = "dflash", **train: object) -> TrainJob:
    base: dict[str, object] = {"method": method, "block_size": BLOCK, "markov_rank": 8, "batch_tokens": 128,
                               "max_steps": 8, "lr": 3e-3, "warmup_steps": 2, "draft_vocab_size": 96,
                               "precision": "fp32", "log_every": 1, "checkpoint_every": 100, "loader_threads": 1,
                               "prefetch_batches": 2}  # fmt: skip
    cfg = TrainConfig.model_validate({**base, **train})
    return TrainJob(train=cfg, run_dir=str(store / "store"), model_dir=str(store / "target"), out_dir=str(out),
                    device="cpu")  # fmt: skip


def metrics(out: Path) -> dict[int, dict]:
    return {r["step"]: r for r in read_metrics(out / "metrics.jsonl")}


@pytest.fixture(scope="module", params=METHODS)
def trained(request: pytest.FixtureRequest, store: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    method = request.param
    out = tmp_path_factory.mktemp(f"{method}-train")
    with Trainer.build(job(store, out, method, max_steps=30)) as t:
        assert t.aux_layers == list(LAYERS) and t.method.positions(t.cfg) == BLOCK - 1
        t.run()
    return method, out


def test_a_few_block_drafter_steps_on_a_5_layer_store_lower_a_finite_loss(trained: tuple[str, Path]) -> None:
    method, out = trained
    rec = metrics(out)
    losses = [rec[s]["loss"] for s in range(1, 31)]
    assert all(torch.isfinite(torch.tensor(losses)))
    assert sum(losses[-5:]) / 5 < 0.95 * sum(losses[:5]) / 5
    assert len(rec[30]["step_loss"]) == BLOCK - 1 and len(rec[30]["step_acc"]) == BLOCK - 1
    state = json.loads((out / "checkpoints" / "step-00000030" / "state.json").read_text())
    assert state["method"] == method and state["aux_layers"] == list(LAYERS)


@pytest.mark.parametrize("method", METHODS)
def test_a_block_drafter_resumed_after_a_kill_gives_the_uninterrupted_losses(
    method: str, store: Path, tmp_path: Path
) -> None:
    with Trainer.build(job(store, tmp_path / "straight", method)) as t:
        t.run()
    straight = metrics(tmp_path / "straight")
    killed = tmp_path / "killed"
    with Trainer.build(job(store, killed, method, checkpoint_every=3)) as t:
        t.run(stop_at_step=5)
    with Trainer.build(job(store, killed, method, checkpoint_every=3)) as t:
        assert t.step == 3
        t.run()
    resumed = metrics(killed)
    for step in range(4, 9):
        assert resumed[step]["loss"] == pytest.approx(straight[step]["loss"], abs=1e-5), step
        assert resumed[step]["step_loss"] == pytest.approx(straight[step]["step_loss"], abs=1e-5), step


def test_a_store_without_the_methods_layers_is_refused_before_training(tmp_path: Path) -> None:
    write_run(tmp_path / "store", tmp_path / "target", SyntheticSpec(lengths=(24, 40)))  # layers 2, 4, 5
    with pytest.raises(Exception, match=r"default layers \[2, 3, 4, 5, 6\].*not \[3, 6\].*extract.aux_layers"):
        Trainer.build(job(tmp_path, tmp_path / "out"))


def sglang_view(
    draft: Path, store: Path, tmp_path: Path, algorithm: str
) -> tuple[dict[str, Any], list[str], list[str], list[tuple[str, torch.Tensor, torch.Tensor]]]:
    """The exported draft through SGLang 0.5.23's own loader in draft mode next to the store's target: what it made
    of the config (metadata), the keys it wanted and we lack, ours it did not take, and (key, theirs, ours) pairs."""
    out, cwd = tmp_path / "sglang_view.safetensors", tmp_path / "cwd"
    cwd.mkdir()
    env = {**os.environ, "SGLANG_USE_CPU_ENGINE": "1", "LD_LIBRARY_PATH": str(SGLANG_PYTHON.parent.parent / "stub"),
           # DSpark's confidence head is built (and its weights read) only when the verify is ragged; SGLang's
           # default, static, skips confidence_head.* silently
           "SGLANG_RAGGED_VERIFY_MODE": "cap-accept"}  # fmt: skip
    proc = subprocess.run(
        [str(SGLANG_PYTHON), str(HERE / "sglang_load_block_draft.py"), "--draft", str(draft),
         "--target", str(store / "target"), "--out", str(out), "--port", str(free_port()), "--block-size", str(BLOCK),
         "--algorithm", algorithm],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    with safe_open(str(out), "pt") as f:
        meta: dict[str, Any] = json.loads(f.metadata()["result"])
    theirs = {k.removeprefix("param."): v for k, v in load_file(str(out)).items()}
    ours = load_file(str(draft / "model.safetensors"))
    fused = (("qkv_proj", ("q_proj", "k_proj", "v_proj")), ("gate_up_proj", ("gate_proj", "up_proj")))

    def stacked(name: str) -> torch.Tensor | None:
        """Our tensor(s) for one of SGLang's parameters (it stacks q/k/v and gate/up)."""
        for f, parts in fused:
            if f".{f}." in name:
                got = [ours.get(name.replace(f, p)) for p in parts]
                return None if any(g is None for g in got) else torch.cat(got)  # type: ignore[misc]
        return ours.get(name)

    missing = sorted(k for k in theirs if stacked(k) is None)
    used = {k.replace(f, p) for k in theirs for f, ps in fused for p in ps if f".{f}." in k} | set(theirs)
    pairs = [(k, v, t) for k, v in theirs.items() if (t := stacked(k)) is not None]
    return meta, missing, sorted(set(ours) - used), pairs


@pytest.mark.sglang
@pytest.mark.parametrize("head", ["gated", "rnn"])
def test_sglangs_loader_builds_the_dspark_markov_head_the_config_names_and_takes_its_weights(
    store: Path, head: str, tmp_path: Path
) -> None:
    """train.markov_head gated / rnn: markov_head_type in config.json, and SGLang's GatedMarkovHead / RNNHead take
    gate_proj / joint_proj (bias included) as trained."""
    require_sglang_env()
    out = tmp_path / "train"
    with Trainer.build(job(store, out, "dspark", max_steps=2, markov_head=head)) as t:
        t.run()
    export_draft(out, store / "store", store / "target", tmp_path / "draft")
    assert read_json(tmp_path / "draft" / "config.json")["markov_head_type"] == head
    meta, missing, unexpected, pairs = sglang_view(tmp_path / "draft", store, tmp_path, "DSPARK")
    assert missing == [] and unexpected == ["d2t", "t2d"]
    own = {"gated": "markov_head.gate_proj.", "rnn": "markov_head.joint_proj."}[head]
    assert {k for k, _, _ in pairs if k.startswith(own)} == {own + "weight", own + "bias"}
    for k, theirs, ours in pairs:
        torch.testing.assert_close(theirs.float(), ours.float(), msg=k)
    assert meta["class"] == "DSparkDraftModel"


@pytest.mark.sglang
def test_sglangs_loader_takes_every_weight_of_the_block_drafters_export_and_captures_the_stores_layers(
    store: Path, trained: tuple[str, Path], tmp_path: Path
) -> None:
    require_sglang_env()
    method, out_dir = trained
    result = export_draft(out_dir, store / "store", store / "target", tmp_path / "draft")
    assert result.method == method and result.speculative_algorithm == ALGORITHM[method]
    assert any("no speculators copy" in n for n in result.notes)
    assert result.sglang_args[2:4] == ["--speculative-algorithm", ALGORITHM[method]]
    assert result.sglang_args[6:] == ["--speculative-num-draft-tokens", str(BLOCK)]  # the block, not a chain
    config = read_json(tmp_path / "draft" / "config.json")
    gamma = BLOCK if method == "dflash" else BLOCK - 1  # DSpark's block_size counts the drafted tokens
    assert config["dflash_config"] == {"block_size": gamma, "mask_token_id": SPEC.vocab_size - 1,
                                       "target_layer_ids": [1, 2, 3, 4, 5]}  # fmt: skip
    meta, missing, unexpected, pairs = sglang_view(tmp_path / "draft", store, tmp_path, ALGORITHM[method])
    assert missing == [] and unexpected == ["d2t", "t2d"]  # the trainer's vocab map; SGLang's loader skips it
    for k, theirs, ours in pairs:
        torch.testing.assert_close(theirs.float(), ours.float(), msg=k)
    assert meta["class"] == {"dflash": "DFlashDraftModel", "dspark": "DSparkDraftModel"}[method]
    assert meta["block_size"] == gamma
    assert meta["num_context_features"] == len(LAYERS) and meta["mask_token_id"] == SPEC.vocab_size - 1
    assert meta["target_layers_to_capture"] == list(LAYERS) == result.aux_layers
    # live serving on CPU is out of reach: SGLang 0.5.23 refuses the algorithm before any model loads
    assert (
        meta["cpu_serving_refusal"]
        == {
            "dflash": "DFLASH speculative decoding is not supported by CpuSRTPlatform on device 'cpu'.",
            "dspark": "DSpark speculative decoding only supports CUDA, NPU or XPU device.",
        }[method]
    )


@pytest.mark.parametrize("method", METHODS)
def test_speculative_decoding_with_a_block_draft_is_identical_to_greedy(
    method: str, demo_model: Path, tmp_path: Path
) -> None:
    """An untrained block draft of the demo target (its default 5 layers) in the shared evaluator: every output
    equals plain greedy decoding, at a block's full length."""
    layers = default_layers(read_json(demo_model / "config.json")["num_hidden_layers"])
    cfg = DraftConfig.from_target(read_json(demo_model / "config.json"), num_aux=len(layers), draft_vocab_size=8)
    train = TrainConfig(method=method, block_size=BLOCK, markov_rank=8)  # type: ignore[arg-type]
    torch.manual_seed(0)
    draft: Any = method_named(method).build(cfg, train=train)
    draft.set_vocab_map(torch.zeros(8, dtype=torch.int64), torch.arange(cfg.vocab_size) < 8)
    opt = torch.optim.AdamW([p for p in draft.parameters() if p.requires_grad])
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    state = {"method": method, "aux_layers": layers, "config": train.model_dump(mode="json")}
    ckpt = save_checkpoint(tmp_path / "checkpoints", 0, draft, opt, sched, state, keep=1)
    prompts = load_eval_prompts(REPO / "data" / "demo_eval_prompts.jsonl", ChatTokenizer.from_model_dir(demo_model),
                                limit=2)  # fmt: skip
    result = offline_acceptance(demo_model, ckpt, layers, prompts, steps=BLOCK - 1, max_new_tokens=12, device="cpu")
    assert result.method == method and result.aux_layers == layers
    assert result.identical_to_greedy == 2 and result.mismatched_prompts == []
    assert 1.0 <= result.acceptance_length <= BLOCK and result.rounds >= 2


def test_speculators_own_converter_takes_the_dflash_export_and_loads_it_back(
    store: Path, trained: tuple[str, Path], tmp_path: Path
) -> None:
    """speculators (pinned in .venv-speculators) has a DFlash layout and a converter from the SGLang / z-lab layout our
    export writes: its DFlashConverter, validate on, reads the export with the target beside it and loads the result
    with its own DFlashDraftModel.from_pretrained; its config names the store's layers and the block. DSpark: no
    converter in speculators (the export's note says so)."""
    from bench.peers.speculators_peer import PYTHON as SPECULATORS_PYTHON

    method, out_dir = trained
    if method != "dflash":
        pytest.skip("speculators converts DFlash checkpoints only")
    if not SPECULATORS_PYTHON.is_file():
        pytest.skip(f"speculators' environment is absent ({SPECULATORS_PYTHON}): `make speculators-env` builds it")
    result = export_draft(out_dir, store / "store", store / "target", tmp_path / "draft")
    script = (
        "import sys\nfrom speculators.convert.dflash.converter import DFlashConverter\n"
        "DFlashConverter().convert(sys.argv[1], sys.argv[2], base_model=sys.argv[3], validate=True)\n"
    )
    proc = subprocess.run(
        [str(SPECULATORS_PYTHON), "-c", script, str(tmp_path / "draft"), str(tmp_path / "spec"), str(store / "target")],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    config = read_json(tmp_path / "spec" / "config.json")
    assert config["speculators_model_type"] == "dflash" and config["block_size"] == BLOCK
    assert config["aux_hidden_state_layer_ids"] == [x for x in result.aux_layers if x != SPEC.num_layers]
    assert any("speculators" in n and "DFlashConverter" in n for n in result.notes)
