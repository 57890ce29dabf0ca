"""eagle3.serving.server's checks of a server the run attaches to (server.url): its /server_info, read here from a
stand-in (no SGLang server runs in a unit test), must show the flags extraction needs and not two-batch overlap,
which skips the capture of most layers in the MoE families (eagle3/serving/launch_args.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from eagle3.config import ServerConfig
from eagle3.serving.layers import SGLangLayers
from eagle3.serving.server import ServerError, SGLangServer

READY = {"version": "0.5.23", "disable_radix_cache": True, "enable_return_aux_hidden_states": True,
         "return_aux_hidden_state_layer_ids": [1, 3, 4]}  # fmt: skip


def attached(
    tmp_path: Path, info: dict[str, Any], monkeypatch: pytest.MonkeyPatch, prefix_cache: bool = False
) -> SGLangServer:
    cfg = ServerConfig(engine="sglang", url="http://node-b:30000", prefix_cache=prefix_cache)
    layers = SGLangLayers([2, 4, 5], [1, 3, 4], "sglang")
    server = SGLangServer(cfg, tmp_path, dump_dir=tmp_path / "d", layers=layers, log_dir=tmp_path, base_env={})
    monkeypatch.setattr(server, "_server_info", lambda: info)
    monkeypatch.setattr(server, "_check_hook", lambda: None)  # the hook's own report: its tests are elsewhere
    return server


def test_an_attached_server_running_two_batch_overlap_is_refused_naming_the_flag(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    attached(tmp_path, READY, monkeypatch)._check_attached()  # launched for extraction: taken
    with pytest.raises(
        ServerError, match=r"not launched for extraction: --enable-two-batch-overlap is on \(.*deepseek_v2"
    ):
        attached(tmp_path, {**READY, "enable_two_batch_overlap": True}, monkeypatch)._check_attached()


def test_an_attached_server_with_the_radix_cache_on_is_taken_only_with_server_prefix_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cached = {**READY, "disable_radix_cache": False}
    with pytest.raises(ServerError, match=r"--disable-radix-cache is off \(or set server.prefix_cache"):
        attached(tmp_path, cached, monkeypatch)._check_attached()
    attached(tmp_path, cached, monkeypatch, prefix_cache=True)._check_attached()  # extraction requests are salted
