"""The servers of this process's extraction (eagle3.server_specs), built once per config and lent to shard tasks.

A flow run submits its shard tasks to a thread pool as wide as its server list (tasks/extract/shards.py `run_shards`),
so at most that many shard tasks run at once and `checkout()` always finds a server free: the pool only binds
a running task to an idle server, it decides nothing about order. Engines are cheap to build (weights load and
servers launch on first use), so a run whose shards are all complete never loads the model or starts a server.
`engine_session()` closes every engine (a launched SGLang server stops) when the flow is done with them.
"""

from __future__ import annotations

import json
import logging
import queue
import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from eagle3.config import PipelineConfig
from eagle3.engines import Engine, EngineInfo
from eagle3.server_specs import ServerSpec, build_server_engine, server_specs
from eagle3.sglang_server import SGLangServer
from tasks.server import server_env

_POOLS: dict[str, ServerPool] = {}
_POOLS_LOCK = threading.Lock()


class ServerPool:
    """The engines of one (model, server list) in this process; one shard task at a time on each."""

    def __init__(self, config: PipelineConfig, model_dir: Path):
        self.model_dir = model_dir
        self.specs = server_specs(config, host=socket.gethostname(), separate_dumps=config.extract.share_run_dir)
        self._engines: dict[int, Engine] = {}
        self._build_lock = threading.Lock()
        self._free: queue.Queue[int] = queue.Queue()
        for spec in self.specs:
            self._free.put(spec.index)

    @property
    def size(self) -> int:
        return len(self.specs)

    @property
    def info(self) -> EngineInfo:
        """What the first server captures (all servers run the same engine on the same model)."""
        return self.engine(0).info

    def engine(self, index: int) -> Engine:
        with self._build_lock:
            if index not in self._engines:
                spec = self.specs[index]
                self._engines[index] = build_server_engine(
                    spec,
                    self.model_dir,
                    base_env=server_env(),  # the task is the edge: NCCL_*/CUDA_* of the worker pass through
                    on_line=server_log(spec.label),
                )
            return self._engines[index]

    @contextmanager
    def checkout(self) -> Iterator[tuple[ServerSpec, Engine]]:
        """An idle server and its engine, for one shard."""
        index = self._free.get()
        try:
            yield self.specs[index], self.engine(index)
        finally:
            self._free.put(index)

    def sglang_servers(self) -> list[SGLangServer]:
        """The SGLang server of each engine (synthesize sends its generation requests to them, so a pipeline run
        launches each server once for synthesize and extract). Building them launches nothing."""
        servers = [getattr(self.engine(spec.index), "server", None) for spec in self.specs]
        if not all(isinstance(s, SGLangServer) for s in servers):
            raise TypeError("sglang_servers: the pool's engines are not SGLang engines (server.engine)")
        return [s for s in servers if isinstance(s, SGLangServer)]

    def built(self) -> list[Engine]:
        """The engines built so far (a server is launched only once its engine first extracts)."""
        with self._build_lock:
            return list(self._engines.values())

    def close(self) -> None:
        with self._build_lock:
            engines, self._engines = list(self._engines.values()), {}
        for engine in engines:
            engine.close()


def server_log(label: str) -> Callable[[str], None]:
    """The server log, line by line, to the `eagle3.sglang` logger, prefixed with the server's label."""
    log = logging.getLogger("eagle3.sglang")

    def on_line(line: str) -> None:
        log.info("%s | %s", label, line)

    return on_line


def pool_key(config: PipelineConfig, model_dir: str) -> str:
    return json.dumps(
        [
            str(Path(model_dir).resolve()),
            str(Path(config.run_dir).resolve()),
            config.server.model_dump(mode="json"),
            config.extract.aux_layers,
            config.extract.dump_dir,
            config.extract.share_run_dir,
        ]
    )


def server_pool(config: PipelineConfig, model_dir: str) -> ServerPool:
    """The server pool for this config in this process, built on first use."""
    key = pool_key(config, model_dir)
    with _POOLS_LOCK:
        if key not in _POOLS:
            _POOLS[key] = ServerPool(config, Path(model_dir))
        return _POOLS[key]


def server_count(config: PipelineConfig) -> int:
    """How many servers (so how many shards at once) this config has."""
    return max(1, len(config.server.servers))


def close_engines() -> None:
    """Close every engine of this process (launched SGLang servers stop; cached weights stay)."""
    with _POOLS_LOCK:
        pools = list(_POOLS.values())
        _POOLS.clear()
    for pool in pools:
        pool.close()


@contextmanager
def engine_session() -> Iterator[None]:
    try:
        yield
    finally:
        close_engines()
