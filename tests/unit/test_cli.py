"""The `eagle3` command: status of a store, the demo model's path, the effective config, and the
checks `run` makes before it starts a flow (a reachable Prefect server, implemented stages)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from eagle3 import cli
from eagle3.store import PreparedManifest, RunInfo, RunStore, SampleEntry, ShardManifest

REPO = Path(__file__).resolve().parents[2]


def small_store(root: Path) -> RunStore:
    """Three shards of two samples: complete, partial (one error), never started."""
    store = RunStore(root)
    store.write_prepared_manifest(
        PreparedManifest(
            dataset="test.jsonl", dataset_fingerprint="f" * 64, tokenizer_sha256="t" * 64, num_samples=6,
            num_tokens=60, num_loss_tokens=30, shards=[2, 2, 2], shard_tokens=[20, 20, 20], config={},
        )
    )  # fmt: skip
    store.write_run_info(
        RunInfo(
            model_path="/models/tiny", model_sha256="a" * 64, tokenizer_sha256="t" * 64, engine="transformers",
            engine_version="5.19.0", dtype="bfloat16", hidden_size=8, num_layers=6, vocab_size=100,
            aux_layers=[2, 3, 3 + 1], engine_layer_ids=[2, 3, 4], engine_layer_convention="hf_hidden_states",
            dataset_fingerprint="f" * 64, versions={}, config={},
        )
    )  # fmt: skip
    entry = SampleEntry(num_tokens=10, num_bytes=500_000_000, crc32="00000000")
    store.write_manifest(ShardManifest(shard=0, status="complete", expected=2, samples={"a": entry, "b": entry}))
    store.write_manifest(
        ShardManifest(
            shard=1, status="partial", expected=2, samples={"c": entry}, errors={"d": "token id out of range"}
        )
    )
    return store


def test_status_shows_each_shard_and_the_run_facts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "200")  # rich wraps at 80 columns when not on a terminal
    small_store(tmp_path / "run")
    assert cli.main(["status", str(tmp_path / "run")]) == 0
    out = capsys.readouterr().out
    lines = {line.split("│")[1].strip(): line for line in out.splitlines() if line.count("│") > 2}
    assert "complete" in lines["00000"] and "2/2" in lines["00000"] and "1.000" in lines["00000"]
    assert "partial" in lines["00001"] and "1/2" in lines["00001"] and "d: token id out of range" in lines["00001"]
    assert "pending" in lines["00002"] and "0/2" in lines["00002"]
    assert "3/6" in lines["total"] and "1.500" in lines["total"]
    assert "engine transformers 5.19.0" in out.replace("\n", " ") and "[2, 3, 4]" in out


def test_status_of_a_directory_that_is_not_a_run_fails(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["status", str(tmp_path)]) == 1
    assert "not a run directory" in capsys.readouterr().err


@pytest.mark.slow
def test_model_demo_prints_an_installed_model_directory(demo_model: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["model", "demo", "--data-dir", str(demo_model.parents[1])]) == 0
    printed = Path(capsys.readouterr().out.strip())
    assert printed == demo_model.resolve() and (printed / "config.json").is_file()


def test_model_that_is_not_a_model_directory_fails_with_the_reason(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["model", str(tmp_path)]) == 1
    assert "no config.json" in capsys.readouterr().err


def test_config_show_prints_the_effective_yaml(capsys: pytest.CaptureFixture[str]) -> None:
    demo = str(REPO / "configs" / "demo.yaml")
    assert cli.main(["config", "show", demo, "--set", "data.shard_size=3", "--stages", "prepare,extract"]) == 0
    shown = yaml.safe_load(capsys.readouterr().out)
    assert shown["data"]["shard_size"] == 3 and shown["stages"] == ["prepare", "extract"]
    assert shown["synthesize"]["max_new_tokens"] == 48  # from the file; every other key from the defaults
    assert set(shown) >= {"data", "synthesize", "server", "extract", "disk", "train", "evaluate"}


def test_a_bad_override_exits_2_naming_the_key(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["config", "show", "--set", "extract.windw=2"]) == 2
    assert "extract.windw: unknown key" in capsys.readouterr().err


def test_run_refuses_to_start_without_a_prefect_server(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(cli, "prefect_api_url", lambda: None)
    assert cli.main(["run", str(REPO / "configs" / "demo.yaml")]) == 2
    assert "PREFECT_API_URL is not set" in capsys.readouterr().err
    assert "does not answer" in (cli.check_server("http://127.0.0.1:9/api") or "")


def test_run_refuses_stages_that_are_not_implemented(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(cli, "prefect_api_url", lambda: "http://127.0.0.1:9/api")
    monkeypatch.setattr(cli, "check_server", lambda url: None)
    assert cli.main(["run", str(REPO / "configs" / "demo.yaml"), "--stages", "prepare,extract,evaluate"]) == 2
    assert "['evaluate'] are not implemented" in capsys.readouterr().err
