"""The plugin's entry point: inert without EAGLE3_DUMP_DIR, refuses an unsupported SGLang with a message."""

from __future__ import annotations

from pathlib import Path

import pytest

import server_patch
from eagle3.store import dump_protocol as proto


def test_without_the_dump_dir_the_plugin_does_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(proto.ENV_DUMP_DIR, raising=False)
    assert server_patch.load_plugin() is None


def test_an_unsupported_sglang_is_refused_with_the_versions_that_work(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(proto.ENV_DUMP_DIR, str(tmp_path))
    monkeypatch.setattr(server_patch, "SUPPORTED_SGLANG", ("0.0.0-never",))
    with pytest.raises(server_patch.UnsupportedSGLang, match=r"supports sglang 0\.0\.0-never, found"):
        server_patch.load_plugin()
    (status,) = proto.read_statuses(tmp_path)
    assert status["status"] == "refused" and "deploy/sglang_env.sh" in status["problem"]
