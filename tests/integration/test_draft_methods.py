"""Draft methods on real stores (docs/methods.md): EAGLE-3.1 trains on the demo store and its offline decoding is
exactly greedy; a store holding more layers than a method reads trains the same draft as one holding just those."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from eagle3.config import EvaluateConfig, PipelineConfig, TrainConfig
from eagle3.draft.synthetic import SyntheticSpec, write_run
from eagle3.evaluate.offline import evaluate_offline
from eagle3.release.export import export_draft
from eagle3.store.run_store import RunStore
from eagle3.store.sample_format import encode_sample, read_sample, write_sample
from eagle3.train.job import TrainJob
from eagle3.train.launch import read_metrics
from eagle3.train.trainer import Trainer, TrainError

pytestmark = pytest.mark.usefixtures("one_torch_thread")
EVALUATE = {"num_prompts": 3, "max_new_tokens": 12, "draft_steps": 2, "compare_steps": [2, 3], "device": "cpu"}


def test_eagle3_1_trains_on_the_demo_store_exports_its_flags_and_decodes_exactly_as_greedy(
    demo_store: PipelineConfig, demo_model: Path, tmp_path: Path
) -> None:
    out = tmp_path / "train"
    train = TrainConfig.model_validate({**demo_store.train.model_dump(), "method": "eagle3.1", "lr": 3e-3,
                                        "max_steps": 12, "loader_threads": 1})  # fmt: skip
    with Trainer.build(TrainJob(train=train, run_dir=demo_store.run_dir, model_dir=str(demo_model), out_dir=str(out),
                                device="cpu")) as trainer:  # fmt: skip
        trainer.run()
    losses = [r["loss"] for r in read_metrics(out / "metrics.jsonl")]
    assert all(x == x for x in losses) and losses[-1] < losses[0]  # finite, and it learns
    result = export_draft(out, Path(demo_store.run_dir), demo_model, tmp_path / "export")
    config = json.loads((tmp_path / "export" / "config.json").read_text())
    assert (result.method, config["fc_norm"], config["norm_output"]) == ("eagle3.1", True, True)
    evaluate = EvaluateConfig.model_validate({**demo_store.evaluate.model_dump(), **EVALUATE})
    off = evaluate_offline(evaluate, Path(demo_store.run_dir), demo_model, out, out=tmp_path / "offline.json")
    assert [(r.method, r.steps) for r in off.runs] == [("eagle3.1", 2), ("eagle3.1", 3)]
    for r in off.runs:
        assert r.identical_to_greedy == r.num_prompts == 3, r.mismatched_prompts
        assert r.modelled is not None and r.modelled.target_step_s > 0 and r.modelled.draft_s > 0
        assert r.modelled.speedup == pytest.approx(
            r.acceptance_length * r.modelled.target_step_s / (r.modelled.verify_s + r.modelled.draft_s)
        )


def three_of_five(five: Path, three: Path, layers: list[int]) -> None:
    """A copy of the 5-layer store holding only `layers`: the same samples, their other states dropped."""
    shutil.copytree(five, three)
    store = RunStore(three)
    info = store.read_run_info()
    assert info is not None
    picked = [info.aux_layers.index(x) for x in layers]
    for path in sorted((three / "shards").rglob("*.safetensors")):
        s = read_sample(path)
        write_sample(path, encode_sample(path.stem, layers, s.input_ids, s.loss_mask,
                                         s.aux_hidden_states[:, picked].contiguous(), s.last_hidden_state))  # fmt: skip
    store.write_run_info(info.model_copy(update={"aux_layers": layers, "engine_layer_ids": layers}))


def test_a_five_layer_store_trains_the_same_eagle3_draft_as_a_three_layer_store_of_its_layers(tmp_path: Path) -> None:
    write_run(tmp_path / "five", tmp_path / "target", SyntheticSpec(aux_layers=(1, 2, 4, 5, 6), lengths=(24, 40, 33,
              17, 48, 29, 36, 21) * 2))  # fmt: skip
    three_of_five(tmp_path / "five", tmp_path / "three", [2, 4, 6])
    base = {"batch_tokens": 128, "max_steps": 6, "lr": 3e-3, "warmup_steps": 2, "ttt_steps": 3, "draft_vocab_size": 96,
            "precision": "fp32", "log_every": 1, "checkpoint_every": 100, "loader_threads": 1}  # fmt: skip

    def losses(store: str, **train: object) -> list[float]:
        out = tmp_path / f"train-{store}-{len(list(tmp_path.glob('train-*')))}"
        job = TrainJob(train=TrainConfig.model_validate({**base, **train}), run_dir=str(tmp_path / store),
                       model_dir=str(tmp_path / "target"), out_dir=str(out), device="cpu")  # fmt: skip
        with Trainer.build(job) as t:
            t.run()
        return [r["loss"] for r in read_metrics(out / "metrics.jsonl")]

    three = losses("three")  # a 3-layer store: its layers as they are
    assert losses("five", aux_layers=[2, 4, 6]) == three  # step by step, bit for bit on one thread
    assert losses("five", aux_layers=[1, 4, 6], max_steps=2) != three[:2]  # other layers: another draft
    with pytest.raises(TrainError, match=r"the store holds aux layers \[1, 2, 4, 5, 6\], not \[3\]"):
        losses("five", aux_layers=[2, 3, 6])
    assert torch.get_num_threads() == 1
