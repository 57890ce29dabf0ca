"""run_dir templates: {date} and {model_sha} filled in once at run start, the template kept; others refused."""

from __future__ import annotations

import datetime as dt

import pytest

from eagle3.config import ConfigError, PipelineConfig, load_config, resolve_run_dir


def test_date_and_model_sha_are_filled_in_and_the_template_kept() -> None:
    cfg = PipelineConfig.model_validate({"run_dir": "data/runs/{model_sha}/{date}"})
    calls: list[int] = []

    def sha() -> str:
        calls.append(1)
        return "0123456789abcdef" * 4

    resolved = resolve_run_dir(cfg, today=dt.date(2026, 12, 1), model_sha=sha)
    assert resolved.run_dir == "data/runs/0123456789ab/2026-12-01"
    assert resolved.run_dir_template == "data/runs/{model_sha}/{date}" and calls == [1]
    again = resolve_run_dir(resolved, today=dt.date(2027, 1, 1), model_sha=sha)
    assert again is resolved and calls == [1]  # resolved once: a later stage or subflow changes nothing


def test_the_model_is_hashed_only_when_the_template_names_it() -> None:
    cfg = PipelineConfig.model_validate({"run_dir": "runs/{date}"})

    def no_hash() -> str:
        raise AssertionError("the model was hashed for a template without {model_sha}")

    assert resolve_run_dir(cfg, today=dt.date(2026, 1, 2), model_sha=no_hash).run_dir == "runs/2026-01-02"
    plain = PipelineConfig()
    assert resolve_run_dir(plain, today=dt.date(2026, 1, 2), model_sha=no_hash) is plain


def test_an_unknown_placeholder_is_refused_naming_it() -> None:
    with pytest.raises(ConfigError, match=r"run_dir: .*unknown placeholder\(s\) \['day'\].*\{date\} or \{model_sha\}"):
        load_config(None, ["run_dir=runs/{day}"])
    with pytest.raises(ConfigError, match=r"run_dir"):
        load_config(None, ["run_dir=runs/{date"])
