"""On a CPU server, SGLang's scheduler and detokenizer are forked from the launcher instead of spawned.

SGLang starts its children with the `spawn` method (engine._set_envs_and_config), which a CUDA context needs: each
child starts a fresh interpreter and imports SGLang again. Without a GPU there is no context to protect, and the
re-import is most of a start: on 2 cores, a SmolLM2 server took 25.1 s to /health and 30.2 s of CPU spawned, 15.6 s
and 13.6 s forked (bench/sglang_start_bench.py, docs/performance.md). With EAGLE3_CPU_FORK=1 (set by
eagle3.serving.server.build_env on CPU only) an AFTER hook on `_set_envs_and_config` switches the start method to
`fork` when the server's device is CPU; on any other device it leaves SGLang's choice alone.

What a forked child inherits that a spawned one would rebuild: the plugins SGLang already loaded in the launcher
(the hooks are applied there, so `load_plugins()` in the child is a no-op and the hook state is the launcher's,
before any worker exists: hook.py starts its writer thread in the worker, after the fork), and the launcher's
zmq context (each child opens its own; pyzmq never terminates a context in a process that did not create it).
The launcher has run no torch kernel before the fork, so no OpenMP pool is copied half-alive.
"""

from __future__ import annotations

import logging
import multiprocessing
from typing import Any

log = logging.getLogger("eagle3.server_patch")
TARGET = "sglang.srt.entrypoints.engine._set_envs_and_config"


def install() -> None:
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register(TARGET, _fork_on_cpu, HookType.AFTER)


def _fork_on_cpu(result: Any, server_args: Any, *args: Any, **kwargs: Any) -> None:
    if getattr(server_args, "device", None) != "cpu":
        return None
    multiprocessing.set_start_method("fork", force=True)
    log.info("eagle3 cpu_fork: SGLang's scheduler and detokenizer are forked, not spawned (CPU server)")
    return None
