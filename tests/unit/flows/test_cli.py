"""The `eagle3` command: status of a store (shards, failed shards, lock holder), verify's table and exit code,
the demo model's path, the effective config, doctor's verdict, and the checks `run` and `retry` make before
they start a flow (a reachable Prefect server, implemented stages, a run directory with run.json)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from eagle3.config import PipelineConfig
from eagle3.extract.shard import extract_shard
from eagle3.store.lease import ShardLease
from eagle3.store.lock import RunLock
from eagle3.store.run_store import PreparedManifest, RunInfo, RunStore, SampleEntry, ShardManifest
from eagle3.store.verify import QUARANTINE
from flows import cli
from tests.unit.tiny_store import ScriptedEngine, make_store

REPO = Path(__file__).resolve().parents[3]


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


def test_status_names_the_lock_holder_and_lists_failed_shards_with_their_log(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "250")
    store = small_store(tmp_path / "run")
    assert cli.main(["status", str(store.root)]) == 0
    out = capsys.readouterr().out
    assert "lock: free" in out and "failed shards" in out and f"eagle3 retry {store.root}" in out
    failed = [line for line in out.splitlines() if line.count("│") > 2 and "token id out of range" in line]
    assert len(failed) == 2  # the shard table and the failed-shards table
    assert str(store.manifest_path(1)) in out.replace("\n", "")
    with RunLock(store.root, purpose="extract", flow_run_id="3f2c-run"):
        assert cli.main(["status", str(store.root)]) == 0
    out = capsys.readouterr().out
    assert "(extract, flow run 3f2c-run)" in out and "alive" in out
    with ShardLease(store.root, 1, flow_run_id="9e1d-run") as lease:
        assert lease.try_acquire()
        assert cli.main(["status", str(store.root)]) == 0
    out = capsys.readouterr().out
    assert "lease shard-00001: pid" in out and "(extract shard 1, flow run 9e1d-run)" in out


def test_verify_exits_0_on_a_sound_store_and_1_after_quarantining_a_bad_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "250")
    store, info = make_store(tmp_path / "run", [[6, 9], [5, 8]])
    for shard in (0, 1):
        assert extract_shard(store, shard, ScriptedEngine(info), info).status == "complete"
    assert cli.main(["verify", str(store.root)]) == 0
    assert "4 sound, 0 bad" in capsys.readouterr().out
    path = store.sample_path(1, "s1-001")
    path.write_bytes(path.read_bytes()[:-10])
    assert cli.main(["verify", str(store.root), "--shards", "0"]) == 0  # shard 1 not looked at
    assert cli.main(["verify", str(store.root), "--quick", "--shards", "0,1"]) == 1
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("│ 00001"))
    assert "complete -> partial" in row and "s1-001" in row
    assert "1 bad" in out and f"eagle3 retry {store.root}" in out.replace("\n", "")
    assert [p.name for p in (store.root / QUARANTINE / "shard-00001").iterdir()] == [path.name]
    assert cli.main(["verify", str(store.root)]) == 0  # quarantined: now only "not extracted"


def test_verify_exits_2_when_it_cannot_verify(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store, _ = make_store(tmp_path / "run", [[6]])
    assert cli.main(["verify", str(store.root), "--shards", "3"]) == 2
    assert "shards [3] do not exist" in capsys.readouterr().err
    with RunLock(store.root, purpose="extract"):
        assert cli.main(["verify", str(store.root)]) == 2
    assert "is in use: locked by" in capsys.readouterr().err


def test_shard_lists_are_parsed_and_bad_ones_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.shard_list("3, 7,0") == [3, 7, 0]
    for bad in ("a,b", "-1", ","):
        with pytest.raises(SystemExit):
            cli.main(["verify", "x", "--shards", bad])
    assert "comma-separated shard ids" in capsys.readouterr().err


def test_retry_refuses_a_directory_without_run_json_and_a_missing_server(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert cli.main(["retry", str(tmp_path)]) == 2
    assert "nothing to retry" in capsys.readouterr().err
    assert not (tmp_path / ".lock").exists()
    store = small_store(tmp_path / "run")
    monkeypatch.setattr(cli, "prefect_api_url", lambda: None)
    assert cli.main(["retry", str(store.root), "--shards", "1"]) == 2
    assert "PREFECT_API_URL is not set" in capsys.readouterr().err


def test_doctor_prints_the_report_and_exits_1_when_not_ready(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from eagle3.checks import doctor

    seen: dict[str, Any] = {}

    def fake(cfg: PipelineConfig, *, base_env: dict[str, str], launch: bool) -> doctor.DoctorReport:
        seen.update(cfg=cfg, launch=launch, env=base_env)
        report = doctor.DoctorReport()
        report.add("sglang", "fail", "not installed in .venv-sglang")
        return report

    monkeypatch.setattr(doctor, "run_doctor", fake)
    monkeypatch.setenv("EAGLE3_DOCTOR_TEST", "1")
    assert cli.main(["doctor", "--no-launch", "--set", "server.engine=sglang"]) == 1
    out = capsys.readouterr().out
    assert "FAIL  sglang" in out and "NOT READY" in out
    assert seen["launch"] is False and seen["cfg"].server.engine == "sglang"
    assert isinstance(seen["env"], dict) and seen["env"]["EAGLE3_DOCTOR_TEST"] == "1"


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


def test_model_tiny_names_the_architectures_it_can_build_when_given_another(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["model", "tiny", "FooForCausalLM", "--data-dir", str(tmp_path)]) == cli.EXIT_FAILED
    assert cli.main(["model", "tiny", "--data-dir", str(tmp_path)]) == cli.EXIT_FAILED
    err = capsys.readouterr().err
    assert "'FooForCausalLM'" in err and err.count("DeepseekV3ForCausalLM, GptOssForCausalLM") == 2
    assert not (tmp_path / "models").exists()  # nothing built


def test_a_failed_run_that_wrote_no_store_does_not_point_at_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from prefect.states import Completed, Failed

    from flows.cli import EXIT_FAILED, EXIT_OK, report_flow_state

    never = tmp_path / "never"
    assert report_flow_state(Failed(message="prepare failed: ..."), never, "data/runs/never") == EXIT_FAILED
    out = capsys.readouterr().out
    assert f"store:  none written (the run stopped before it created {never})" in out and "eagle3 status" not in out
    assert report_flow_state(Completed(), tmp_path, "data/runs/x") == EXIT_OK
    assert f"store:  {tmp_path}   (inspect: eagle3 status data/runs/x)" in capsys.readouterr().out
