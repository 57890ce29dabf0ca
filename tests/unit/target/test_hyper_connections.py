"""A target whose decoder layers mix hyper-connection streams (GLM-5-Next: config.json hc_mult) is refused by the
transformers engine before any model loads, naming the streams: its layers' inputs are no single residual stream."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from eagle3.target.files import ModelError, check_target

TEXT = {"hidden_size": 64, "num_hidden_layers": 8, "vocab_size": 1024}


def write_config(tmp_path: Path, text: dict[str, object]) -> Path:
    tmp_path.mkdir(parents=True, exist_ok=True)
    cfg = {"model_type": "glm5_next", "architectures": ["Glm5NextForConditionalGeneration"], "text_config": text}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    return tmp_path


def test_a_target_with_hyper_connection_streams_is_refused_by_the_transformers_engine(tmp_path: Path) -> None:
    model = write_config(tmp_path, {**TEXT, "hc_mult": 4, "mhc": True})
    with pytest.raises(ModelError, match=r"mixes 4 hyper-connection streams .*hc_mult 4.*not one residual stream"):
        check_target(model, "transformers")


def test_one_stream_is_no_hyper_connection(tmp_path: Path) -> None:
    model = write_config(tmp_path, {**TEXT, "hc_mult": 1})
    assert check_target(model, "transformers").num_layers == 8


def test_preflight_refuses_it_before_the_first_stage_naming_the_stages_that_run_it(tmp_path: Path) -> None:
    from eagle3.checks.preflight import PreflightError, check_stages
    from eagle3.config import PipelineConfig

    model = write_config(tmp_path / "model", {**TEXT, "hc_mult": 4, "mhc": True})
    cfg = PipelineConfig.model_validate(
        {"run_dir": str(tmp_path / "run"), "model": str(model), "data": {"dataset": "rows.jsonl"},
         "stages": ["prepare", "extract", "convert", "train", "evaluate"],
         "server": {"engine": "transformers", "device": "cpu"}, "train": {"device": "cpu"},
         "evaluate": {"device": "cpu", "live": "off"}}
    )  # fmt: skip
    with pytest.raises(
        PreflightError, match=r"(?s)Refused before the first stage.*hyper-connection.*stages evaluate, extract"
    ):
        check_stages(cfg, model, cuda=lambda: False, gpu_node=lambda: False)
    check_stages(cfg.model_copy(update={"stages": ["prepare"]}), model, cuda=lambda: False, gpu_node=lambda: False)
