"""EAGLE-3 hidden-state hook for SGLang, loaded as a plugin (entry point group `sglang.srt.plugins`).

SGLang calls `load_plugin()` early in every process it spawns (scheduler = TP worker, detokenizer,
main). The plugin is inert unless EAGLE3_DUMP_DIR names a dump directory (or EAGLE3_CPU_SPEC=1
asks for the CPU speculative fallback, or EAGLE3_CPU_FORK=1 for forked children on CPU), so installing it never
changes a plain server. The hook and the CPU fallback require SGLang 0.5.23 (the capture-only mode and the
internals hook.py and cpu_spec.py rely on) and otherwise refuse to load, saying which versions work; the fork
switch needs no check (on a release without its target, SGLang logs the hook it could not apply and spawns).

Environment (names in eagle3/store/dump_protocol.py):
  EAGLE3_DUMP_DIR      where per-request dumps go (the hook's only switch)
  EAGLE3_RID_PREFIX    capture only rids with this prefix (default "e3-": health checks and the
                       warm-up request also run the model and are never captured)
  EAGLE3_AUX_LAYERS    HF hidden_states indices the run expects, e.g. "2,15,27" (checked at start-up)
  EAGLE3_WRITER_QUEUE  finished requests waiting for the writer thread (default 8)
  EAGLE3_CPU_SPEC      "1": on a CPU server, install cpu_spec.py, the fallback that lets SGLang serve EAGLE3
                       chain drafting on CPU (the live evaluation sets it; independent of EAGLE3_DUMP_DIR)
  EAGLE3_CPU_FORK      "1": on a CPU server, fork SGLang's scheduler and detokenizer instead of spawning them
                       (cpu_fork.py; every launch on CPU sets it: a start costs half the CPU)

Install: deploy/sglang_env.sh (pip-installs deploy/server_patch_pkg with this package).
"""

from __future__ import annotations

import logging
import os
import socket
import time
from pathlib import Path

from eagle3.store.dump_protocol import ENV_CPU_FORK, ENV_CPU_SPEC, SUPPORTED_SGLANG

__all__ = ["SUPPORTED_SGLANG", "UnsupportedSGLang", "load_plugin"]
log = logging.getLogger("eagle3.server_patch")


class UnsupportedSGLang(RuntimeError):
    pass


def load_plugin() -> None:
    from eagle3.store import dump_protocol as proto

    if os.environ.get(ENV_CPU_FORK) == "1":
        from server_patch import cpu_fork

        cpu_fork.install()

    # Opt-in, independent of the hook below: EAGLE3_CPU_SPEC=1 installs the CPU fallback that lets SGLang
    # serve EAGLE3 chain drafting with --device cpu (server_patch/cpu_spec.py). Without the switch it is
    # never imported. A failure is logged and re-raised; SGLang then fails as it would without it.
    if os.environ.get(ENV_CPU_SPEC) == "1":
        from server_patch import cpu_spec

        try:
            cpu_spec.install()
        except Exception as e:
            log.error("eagle3 cpu_spec refused to load: %s", e)
            raise

    raw = os.environ.get(proto.ENV_DUMP_DIR)
    if not raw:
        return
    dump_dir = Path(raw)
    dump_dir.mkdir(parents=True, exist_ok=True)
    status = {"pid": os.getpid(), "host": socket.gethostname(), "time": time.time()}
    name = f"{socket.gethostname()}-{os.getpid()}-load"
    try:
        from importlib.metadata import PackageNotFoundError, version

        try:
            found = version("sglang")
        except PackageNotFoundError:
            found = "not installed"
        if found not in SUPPORTED_SGLANG:
            raise UnsupportedSGLang(
                f"eagle3 server_patch supports sglang {', '.join(SUPPORTED_SGLANG)}, found {found}; "
                "rebuild the environment with deploy/sglang_env.sh (or unset EAGLE3_DUMP_DIR)"
            )
        from server_patch import hook

        layers = proto.parse_layers(os.environ.get(proto.ENV_AUX_LAYERS))
        depth = int(os.environ.get(proto.ENV_WRITER_QUEUE, "8"))
        hook.install(dump_dir, os.environ.get(proto.ENV_RID_PREFIX, proto.RID_PREFIX), layers, depth)
    except Exception as e:
        proto.write_status(dump_dir, name, {**status, "status": "refused", "problem": str(e)})
        log.error("eagle3 server_patch refused to load: %s", e)
        raise
    proto.write_status(dump_dir, name, {**status, "status": "loaded", "sglang": found})
    log.info("eagle3 server_patch loaded (sglang %s): dumps to %s", found, dump_dir)
