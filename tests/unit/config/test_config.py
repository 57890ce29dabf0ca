"""The config tree: strict, errors that name the key, overrides, and the schema Prefect renders as a form."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from eagle3.config import STAGES, ConfigError, PipelineConfig, config_to_yaml, load_config

REPO = Path(__file__).resolve().parents[3]


def write(tmp_path: Path, tree: object) -> Path:
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(tree))
    return path


def test_the_demo_config_loads_and_lists_every_stage() -> None:
    cfg = load_config(REPO / "configs" / "demo.yaml")
    assert cfg.stages == ["prepare", "synthesize", "extract", "convert", "train", "export", "evaluate"]
    assert cfg.model == "demo" and cfg.run_dir == "data/runs/demo"
    assert cfg.server.engine == "transformers" and cfg.server.device == "cpu"
    assert cfg.data.shard_size == 50 and cfg.data.dataset == "data/demo_prompts.jsonl"


def test_an_unknown_top_level_key_is_an_error_naming_it(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"(?s)cfg\.yaml.*run_dri: unknown key"):
        load_config(write(tmp_path, {"run_dri": "x"}))


def test_an_unknown_key_in_a_section_names_its_dotted_path(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"data\.shardsize: unknown key"):
        load_config(write(tmp_path, {"data": {"shardsize": 5}}))
    with pytest.raises(ConfigError, match=r"server\.batch_token: unknown key"):
        load_config(None, ["server.batch_token=5"])


def test_a_wrong_type_or_out_of_bounds_value_names_the_key_and_the_value(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"data\.shard_size: .*integer.*'many'"):
        load_config(write(tmp_path, {"data": {"shard_size": "many"}}))
    with pytest.raises(ConfigError, match=r"data\.shard_size: .*greater than 0"):
        load_config(None, ["data.shard_size=0"])
    with pytest.raises(ConfigError, match=r"server\.engine: .*'vllm'"):
        load_config(None, ["server.engine=vllm"])


def test_stages_must_be_known_unique_and_in_pipeline_order() -> None:
    assert load_config(None, ["stages=[prepare, extract, convert]"]).stages == ["prepare", "extract", "convert"]
    with pytest.raises(ConfigError, match="pipeline order"):
        load_config(None, ["stages=[extract, prepare]"])
    with pytest.raises(ConfigError, match="pipeline order"):
        load_config(None, ["stages=[extract, extract]"])
    with pytest.raises(ConfigError, match=r"stages\.0"):
        load_config(None, ["stages=[serve]"])


def test_overrides_apply_after_the_file_and_parse_as_yaml(tmp_path: Path) -> None:
    path = write(tmp_path, {"data": {"shard_size": 7, "max_length": 64}})
    cfg = load_config(path, ["data.shard_size=9", "extract.aux_layers=[1, 2, 3]", "server.url=null"])
    assert cfg.data.shard_size == 9 and cfg.data.max_length == 64
    assert cfg.extract.aux_layers == [1, 2, 3] and cfg.server.url is None
    with pytest.raises(ConfigError, match=r"must look like key\.sub=value"):
        load_config(path, ["data.shard_size"])
    with pytest.raises(ConfigError, match="'model' is not a section"):
        load_config(write(tmp_path, {"model": "demo"}), ["model.path=x"])
    with pytest.raises(ConfigError, match=r"model: Input should be a valid string"):
        load_config(None, ["model.path=x"])


def test_missing_or_malformed_files_are_reported_by_name(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("data: [1, 2\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)
    bad.write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match="top level must be a mapping"):
        load_config(bad)


def test_the_effective_yaml_round_trips() -> None:
    cfg = load_config(REPO / "configs" / "demo.yaml", ["data.shard_size=3"])
    again = PipelineConfig.model_validate(yaml.safe_load(config_to_yaml(cfg)))
    assert again == cfg


def test_the_flow_parameter_form_has_every_section_with_descriptions() -> None:
    from flows.extract import extract_flow
    from flows.pipeline import pipeline

    for flow in (extract_flow, pipeline):
        schema = flow.parameters.model_dump()
        assert schema["required"] == ["config"]
        assert schema["properties"]["config"]["$ref"] == "#/definitions/PipelineConfig"
        defs = schema["definitions"]
        top = defs["PipelineConfig"]
        assert top["additionalProperties"] is False
        for section in ("data", "synthesize", "server", "extract", "disk", "train", "evaluate"):
            assert section in top["properties"], section
            sub = defs[top["properties"][section]["$ref"].split("/")[-1]]
            assert sub.get("description"), f"{section} has no description"
            undocumented = [k for k, v in sub["properties"].items() if not v.get("description")]
            assert not undocumented, f"{section}: fields without a description: {undocumented}"
        engine = defs["ServerConfig"]["properties"]["engine"]
        assert engine["enum"] == ["transformers", "sglang"]  # a dropdown in the UI
        assert top["properties"]["stages"]["items"]["enum"] == list(STAGES)


def test_training_and_the_offline_evaluation_have_their_own_device(tmp_path: Path) -> None:
    """train.device and evaluate.device, not server.device (the extraction server's), decide where the draft
    trains and where the offline evaluation runs; both default to `auto` and the demo pins them to cpu."""
    from eagle3.evaluate.offline import offline_dtype
    from eagle3.release.retrain import TrainPlan
    from tasks.train import new_job

    default = PipelineConfig.model_validate({})
    assert (default.train.device, default.evaluate.device) == ("auto", "auto")
    demo = load_config(REPO / "configs" / "demo.yaml")
    assert (demo.train.device, demo.evaluate.device) == ("cpu", "cpu")
    cfg = PipelineConfig.model_validate(
        {"run_dir": str(tmp_path), "server": {"device": "cpu"}, "train": {"device": "cuda"},
         "evaluate": {"device": "cuda"}}
    )  # fmt: skip
    plan = TrainPlan(action="train", reason="test", data_key="k", data_tokens=1, new_tokens=1)
    assert new_job(cfg, "m", plan, tmp_path / "train").device == "cuda"
    assert offline_dtype(cfg.evaluate, "bfloat16") == "bfloat16"  # on cuda: the store's dtype, whatever the server's
    on_cpu = cfg.evaluate.model_copy(update={"device": "cpu"})
    assert offline_dtype(on_cpu, "bfloat16") == "float32"


def test_writer_threads_has_one_default_for_the_flow_and_for_callers_without_a_config() -> None:
    import inspect

    from pydantic import ValidationError

    from eagle3.config import ExtractConfig
    from eagle3.extract.shard import WRITER_THREADS, extract_shard

    assert ExtractConfig().writer_threads == WRITER_THREADS == 8
    assert inspect.signature(extract_shard).parameters["writer_threads"].default == WRITER_THREADS
    with pytest.raises(ValidationError, match="writer_threads"):
        ExtractConfig(writer_threads=0)


@pytest.mark.parametrize("key", ["evaluate.live", "train.compile"])
def test_every_auto_on_off_setting_takes_the_documented_words_and_yamls_booleans_through_set(key: str) -> None:
    """`--set evaluate.live=off` reaches the config as YAML's `false`: it means `off`, as it does for train.compile."""
    section, name = key.split(".")
    for written, meant in [("off", "off"), ("on", "on"), ("false", "off"), ("true", "on"), ("auto", "auto")]:
        cfg = load_config(None, [f"{key}={written}"])
        assert getattr(getattr(cfg, section), name) == meant, written
    with pytest.raises(ConfigError, match=rf"{key}: Input should be 'auto', 'on' or 'off'"):
        load_config(None, [f"{key}=sometimes"])
