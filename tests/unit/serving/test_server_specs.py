"""eagle3.serving.specs: what each server of one extraction is (port, GPUs, dump and log directories, label), and the
config rules that keep several servers from colliding. Nothing is launched here."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from eagle3.config import PipelineConfig
from eagle3.serving.specs import ServerArgsError, server_specs


def config(**server: object) -> PipelineConfig:
    return PipelineConfig.model_validate({"run_dir": "/runs/r1", "server": {"engine": "sglang", **server}})


def test_one_server_keeps_the_plain_layout_unless_the_run_directory_is_shared() -> None:
    (spec,) = server_specs(config(), host="node-a")
    assert spec.dump_dir is None and spec.log_dir is None  # the engine's defaults: run_dir/dump, run_dir/server
    assert spec.label == "sglang node-a:30000"
    (spec,) = server_specs(config(), host="node-a", separate_dumps=True)
    assert spec.dump_dir == Path("/runs/r1/dump/node-a-30000")
    assert spec.log_dir == Path("/runs/r1/server/node-a-30000")


def test_launched_servers_get_their_own_port_gpus_dump_and_log_directories() -> None:
    cfg = config(port=31000, env={"NCCL_DEBUG": "INFO"}, servers=[{"gpus": "0,1,2,3"}, {"gpus": "4,5,6,7"}])
    a, b = server_specs(cfg, host="node-a")
    assert (a.config.server.port, b.config.server.port) == (31000, 31001)
    assert a.config.server.env == {"NCCL_DEBUG": "INFO", "CUDA_VISIBLE_DEVICES": "0,1,2,3"}
    assert b.config.server.env["CUDA_VISIBLE_DEVICES"] == "4,5,6,7"
    assert a.dump_dir == Path("/runs/r1/dump/node-a-31000") and b.dump_dir == Path("/runs/r1/dump/node-a-31001")
    assert a.log_dir != b.log_dir
    assert a.label == "#0 sglang node-a:31000 (GPUs 0,1,2,3)" and b.label.startswith("#1 ")
    assert a.config.server.servers == [] and cfg.server.env == {"NCCL_DEBUG": "INFO"}  # the run's config is untouched


def test_attached_servers_use_the_dump_directory_they_were_launched_with() -> None:
    cfg = config(servers=[{"url": "http://b:30000", "dump_dir": "/shared/dump/b"}, {"url": "http://c:30000",
                 "dump_dir": "/shared/dump/c"}])  # fmt: skip
    a, b = server_specs(cfg, host="node-a")
    assert (a.config.server.url, b.config.server.url) == ("http://b:30000", "http://c:30000")
    assert (a.dump_dir, b.dump_dir) == (Path("/shared/dump/b"), Path("/shared/dump/c"))
    assert a.label == "#0 sglang http://b:30000"


def test_transformers_servers_run_on_one_gpu_each_or_on_the_section_device() -> None:
    cfg = PipelineConfig.model_validate({"server": {"engine": "transformers", "servers": [{"gpus": "2"}, {}]}})
    a, b = server_specs(cfg, host="h")
    assert (a.device, b.device) == ("cuda:2", "auto")
    with pytest.raises(ValidationError, match="one GPU"):
        PipelineConfig.model_validate({"server": {"engine": "transformers", "servers": [{"gpus": "0,1"}]}})
    with pytest.raises(ValidationError, match="for the sglang engine"):
        PipelineConfig.model_validate({"server": {"engine": "transformers", "servers": [{"url": "http://x:1"}]}})


@pytest.mark.parametrize(
    ("server", "message"),
    [
        ({"url": "http://a:1", "servers": [{}]}, "server.url and server.servers are both set"),
        ({"port": 30000, "servers": [{}, {"port": 30000}]}, "share a port"),
        ({"servers": [{"gpus": "0;1"}]}, "pattern"),
        ({"servers": [{"url": "http://a:1"}, {"url": "http://b:1"}]}, "share a dump directory"),
    ],
)
def test_server_lists_that_would_collide_are_refused_naming_the_key(server: dict[str, object], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        config(**server)


def test_the_extract_section_shares_nothing_by_default_and_bounds_the_lease_ttl() -> None:
    cfg = PipelineConfig()
    assert cfg.extract.share_run_dir is False and cfg.extract.lease_ttl_s == 600.0 and cfg.server.servers == []
    with pytest.raises(ValidationError, match="lease_ttl_s"):
        PipelineConfig.model_validate({"extract": {"lease_ttl_s": 1}})


def _model_dir(tmp_path: Path) -> Path:
    (tmp_path / "config.json").write_text(
        '{"model_type": "llama", "num_hidden_layers": 30, "hidden_size": 64, "vocab_size": 100}'
    )
    return tmp_path


def test_one_of_several_servers_gets_the_engine_the_one_builder_makes(tmp_path: Path) -> None:
    """build_server_engine is build_engine with the server's own device, dump and log directories: the store
    dtype reaches a transformers server too, and a launched sglang server of several owns its own files."""
    from eagle3.extract.engines.sglang_engine import SGLangEngine
    from eagle3.extract.engines.transformers_engine import TransformersEngine
    from eagle3.extract.pool import build_server_engine

    model = _model_dir(tmp_path)
    cfg = PipelineConfig.model_validate({"run_dir": "/runs/r1", "server": {"engine": "transformers", "device": "cpu",
                                         "servers": [{}]}, "extract": {"store_dtype": "float8_e4m3"}})  # fmt: skip
    (spec,) = server_specs(cfg, host="h")
    engine = build_server_engine(spec, model, base_env={})
    assert isinstance(engine, TransformersEngine) and engine.fp8 and str(engine.device) == "cpu"

    a, _ = server_specs(config(servers=[{}, {}]), host="node-a")
    sglang = build_server_engine(a, model, base_env={})
    assert isinstance(sglang, SGLangEngine)
    assert sglang.dump_dir == Path("/runs/r1/dump/node-a-30000")
    assert sglang.server.log_dir == Path("/runs/r1/server/node-a-30000")
    assert sglang.info.engine_layer_ids == [1, 14, 26]  # llama: HF index - 1 (extraction_layers)


def test_servers_that_capture_refuse_two_batch_overlap_and_servers_that_only_generate_take_it() -> None:
    cfg = config(extra_args=["--enable-two-batch-overlap"], servers=[{"gpus": "0"}, {"url": "http://b:30000"}])
    with pytest.raises(ServerArgsError, match=r"server.extra_args has '--enable-two-batch-overlap'.*deepseek_v2.py"):
        server_specs(cfg, host="node-a")
    assert len(server_specs(cfg, host="node-a", capture=False)) == 2  # synthesize: generation only
    attached = config(extra_args=["--enable-two-batch-overlap"], url="http://b:30000")
    assert len(server_specs(attached, host="node-a")) == 1  # launched elsewhere: its flags are not these
