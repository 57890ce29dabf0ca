"""A partial `config` given to a deployment's run keeps the deployment's own settings (issue 34): Prefect merges
a run's parameters over the deployment's one level deep, so the flows merge `config` again, key by key."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from eagle3.config import PipelineConfig
from eagle3.config_merge import deep_merge, merge_config
from tests.deploy_module import deployments_module

REPO = Path(__file__).resolve().parents[2]
#: Settings each deployment sets itself, which a run giving only run_dir (and one other key) keeps.
KEPT = {
    "train": {"stages"},  # devices `auto`: they follow the worker the run lands on
    "convert": {"stages"},
    "extract-node": {"extract.share_run_dir"},
    "grow": {"stages", "data.dataset", "train.init", "train.min_new_tokens"},
}
DEVICE_KEYS = ("stages", "server.device", "train.device", "evaluate.device", "extract.share_run_dir")


def config_deployments() -> list[dict[str, Any]]:
    d = deployments_module()
    return [e for e in d.load_spec()["deployments"] if e["entrypoint"] != "flows/retry.py:retry_failed_flow"
            and e["entrypoint"] != "flows/verify.py:verify_flow"]  # fmt: skip


def value(config: PipelineConfig, dotted: str) -> Any:
    out: Any = config
    for part in dotted.split("."):
        out = getattr(out, part)
    return out


@pytest.mark.parametrize("entry", config_deployments(), ids=lambda e: e["name"])
def test_a_partial_config_keeps_the_deployments_stages_and_devices(entry: dict[str, Any]) -> None:
    from prefect.flows import load_flow_from_entrypoint

    d = deployments_module()
    flow: Any = load_flow_from_entrypoint(str(REPO / entry["entrypoint"]))
    where = entry["name"]
    stored = d.form_parameters(d.full_parameters(flow.fn, entry.get("parameters"), where), entry)  # as `apply` stores
    intended = PipelineConfig.model_validate(deep_merge(stored["config"], {"run_dir": "data/runs/x"}))
    given = {"config": {"run_dir": "data/runs/x", "extract": {"window": 3}}}
    run_params = {**stored, **given}  # what Prefect's server does with `--params`: the whole `config` replaced
    config, sources = merge_config(stored["config"], run_params["config"], f"f/{where}")
    for key in DEVICE_KEYS:
        assert value(config, key) == value(intended, key), key
    assert config.run_dir == "data/runs/x" and config.extract.window == 3
    assert sources.given == ["extract.window", "run_dir"]
    assert KEPT.get(where, set()) <= set(sources.kept)


def test_the_summary_says_which_keys_the_run_gave_kept_from_the_deployment_and_replaced() -> None:
    own = {"stages": ["train", "export", "evaluate"], "train": {"device": "cuda", "init": "previous"}}
    config, sources = merge_config(own, {"run_dir": "r", "train": {"device": "cpu"}}, "train/train")
    assert config.stages == ["train", "export", "evaluate"] and config.train.device == "cpu"
    assert config.train.init == "previous"  # a sibling of a given key is kept too: the merge is deep
    assert sources.given == ["run_dir", "train.device"]
    assert sources.kept == ["stages", "train.init"] and sources.overridden == ["train.device"]
    lines = sources.lines()
    assert "run_dir, train.device (replacing the deployment's train.device)" in lines[0]
    assert lines[1] == "Settings of the deployment `train/train` kept: stages, train.init"


def test_a_run_without_a_deployment_says_its_config_is_its_own() -> None:
    from eagle3.config_merge import ConfigSources

    assert "defaults of eagle3/config/" in ConfigSources().lines()[0]


def test_a_bad_given_key_is_refused_naming_it() -> None:
    with pytest.raises(ValueError, match=r"train\.devic"):
        merge_config({}, {"train": {"devic": "cuda"}}, "train/train")


def test_overrides_set_the_keys_a_form_does_not_show_and_count_as_given() -> None:
    own = {"stages": ["train", "export", "evaluate"], "train": {"device": "cuda"}}
    config, sources = merge_config(own, {"run_dir": "r"}, "train/train", ["train.lr=0.001", "data_dir=d2"])
    assert config.train.lr == 0.001 and config.data_dir == "d2" and config.train.device == "cuda"
    assert sources.given == ["data_dir", "run_dir", "train.lr"]
    from eagle3.config import ConfigError

    with pytest.raises(ConfigError, match=r"must look like key\.sub=value"):
        merge_config(own, {}, "train/train", ["train.lr 0.001"])


def test_the_run_summary_lists_where_the_settings_came_from(tmp_path: Path) -> None:
    from eagle3.store.run_store import RunStore
    from tasks.summary import summary_markdown

    own = {"stages": ["train", "export", "evaluate"], "train": {"device": "cuda"}}
    config, sources = merge_config(own, {"run_dir": str(tmp_path)}, "train/train")
    text = summary_markdown(config, RunStore(tmp_path), sources)
    assert "Stages of this flow run: train, export, evaluate" in text
    assert "- Settings given by this run: run_dir" in text
    assert "- Settings of the deployment `train/train` kept: stages, train.device" in text
