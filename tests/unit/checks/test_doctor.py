"""eagle3 doctor without a server: the checks it can make from files, and its one-line verdict."""

from __future__ import annotations

import json
from pathlib import Path

from eagle3.checks.doctor import DoctorReport, run_doctor
from eagle3.config import PipelineConfig


def tiny_model(tmp_path: Path, model_type: str) -> Path:
    d = tmp_path / "model"
    d.mkdir()
    (d / "config.json").write_text(
        json.dumps({"model_type": model_type, "num_hidden_layers": 30, "hidden_size": 64, "vocab_size": 100})
    )
    return d


def config(tmp_path: Path, model: Path, **server: object) -> PipelineConfig:
    return PipelineConfig.model_validate(
        {"run_dir": str(tmp_path / "run"), "model": str(model), "server": {"engine": "sglang", **server}}
    )


def test_a_missing_sglang_environment_is_not_ready_and_says_how_to_build_it(tmp_path: Path) -> None:
    cfg = config(tmp_path, tiny_model(tmp_path, "llama"), python=str(tmp_path / "none" / "python"))
    r = run_doctor(cfg, base_env={}, launch=False)
    assert not r.ok and r.verdict.startswith("NOT READY: sglang env") and "deploy/sglang_env.sh" in r.verdict
    layers = next(c for c in r.checks if c.name == "layers")
    assert layers.status == "ok" and "[1, 14, 26]" in layers.detail


def test_an_unknown_model_family_fails_the_layer_check(tmp_path: Path) -> None:
    cfg = config(tmp_path, tiny_model(tmp_path, "falcon"), url="http://127.0.0.1:9")
    r = run_doctor(cfg, base_env={}, launch=False)
    layers = next(c for c in r.checks if c.name == "layers")
    assert layers.status == "fail" and "falcon" in layers.detail
    assert [c.status for c in r.checks if c.name == "server"] == ["skip"]


def test_the_verdict_is_one_line_and_names_warnings() -> None:
    r = DoctorReport()
    r.add("a", "ok", "fine")
    assert r.verdict.startswith("READY:") and "\n" not in r.verdict
    r.add("dump space", "warn", "3.0 GB free")
    assert r.ok and r.verdict.startswith("READY with 1 warning") and "dump space" in r.verdict
    assert r.render().splitlines()[-1] == r.verdict
