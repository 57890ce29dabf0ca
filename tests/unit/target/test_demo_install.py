"""The demo model's install under concurrency (two test workers, two runs on a fresh clone): one installs, the
others wait and find it installed; the directory appears under its name complete, install.json included.

The GGUF conversion itself (about 25 s) is replaced by a stub that writes a small model directory slowly and
counts its calls: what is under test is the lock and the rename, which the real conversion goes through too.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from eagle3.target import demo


def test_concurrent_installs_install_once_and_every_caller_gets_the_complete_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[int] = []
    seen: list[set[str]] = []

    def slow_stub_install(target: Path) -> None:  # the conversion replaced: writes a model dir the same way
        calls.append(1)
        tmp = target.parent / ".stub-install"
        tmp.mkdir()
        (tmp / "config.json").write_text("{}")
        time.sleep(0.5)  # the other callers arrive while this one works
        (tmp / "model.safetensors").write_bytes(b"weights")
        rec = {"gguf_sha256": demo.DEMO_GGUF_SHA256, "install_version": demo.DEMO_INSTALL_VERSION,
               "model_sha256": demo.model_fingerprint(tmp)}  # fmt: skip
        demo.atomic_write_json(tmp / "install.json", rec)
        tmp.rename(target)

    monkeypatch.setattr(demo, "_install_demo_model", slow_stub_install)

    def install() -> None:
        seen.append({p.name for p in demo.ensure_demo_model(tmp_path).iterdir()})

    threads = [threading.Thread(target=install) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert len(calls) == 1
    assert seen == [{"config.json", "model.safetensors", "install.json"}] * 4
    assert demo.ensure_demo_model(tmp_path) == demo.demo_model_dir(tmp_path) and len(calls) == 1
