"""The servers of a flow run's extraction (eagle3.serving.specs), built once per config and lent to shard tasks.
Prefect-free: the flow's context (tasks/flow_context.py) holds the pools and passes the environment servers
launch with (`base_env`: the worker's, plus the flow run id).

A flow run submits its shard tasks to a thread pool as wide as its server list (tasks/extract/shards.py `run_shards`),
so at most that many shard tasks run at once and `checkout()` always finds a server free: the pool only binds
a running task to an idle server, it decides nothing about order. Engines are cheap to build (weights load and
servers launch on first use), so a run whose shards are all complete never loads the model or starts a server.
A flow run's pools are its FlowContext's `servers` (tasks/flow_context.py): the pipeline's synthesize and extract
share them; `ServerPools.close()` closes every engine (a launched SGLang server stops) when the flow is done.
"""

from __future__ import annotations

import json
import logging
import queue
import socket
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from eagle3.config import PipelineConfig
from eagle3.extract.engines import Engine, EngineInfo, build_engine
from eagle3.serving.server import LineFn, SGLangServer
from eagle3.serving.specs import ServerSpec, server_specs

if TYPE_CHECKING:
    from eagle3.extract.engines.transformers_engine import LoadedModels


def build_server_engine(
    spec: ServerSpec,
    model_dir: Path,
    *,
    base_env: Mapping[str, str],
    on_line: LineFn | None = None,
    models: LoadedModels | None = None,
) -> Engine:
    """The engine of one server (eagle3/extract/engines' build_engine with this server's device, dump and log
    directories). Loading weights or launching happens on its first `extract`; `close` stops a launched server.
    `models` (transformers): the weights this engine shares with the other engines of its pool."""
    return build_engine(
        spec.config,
        model_dir,
        device=spec.device,
        dump_dir=spec.dump_dir,
        log_dir=spec.log_dir,
        base_env=base_env,
        on_line=on_line,
        models=models,
    )


class ServerPool:
    """The engines of one (model, server list) of a flow run; one shard task at a time on each. Transformers
    engines on one device share one copy of the weights (`models`), dropped when the pool closes."""

    def __init__(self, config: PipelineConfig, model_dir: Path, base_env: dict[str, str]):
        self.model_dir, self.base_env = model_dir, base_env
        self.specs = server_specs(config, host=socket.gethostname(), separate_dumps=config.extract.share_run_dir)
        self._engines: dict[int, Engine] = {}
        self._models: LoadedModels | None = None
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
                    base_env=self.base_env,
                    on_line=server_log(spec.label),
                    models=self._shared_models(spec),
                )
            return self._engines[index]

    def _shared_models(self, spec: ServerSpec) -> LoadedModels | None:
        """The weights the pool's transformers engines share (imported only for that engine: it needs torch)."""
        if spec.config.server.engine != "transformers":
            return None
        if self._models is None:
            from eagle3.extract.engines.transformers_engine import LoadedModels

            self._models = LoadedModels()
        return self._models

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
            models, self._models = self._models, None
        for engine in engines:
            engine.close()
        if models is not None:
            models.clear()


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


class ServerPools:
    """The server pools a flow run opened, one per (model, run directory, server settings), built on first use;
    `close()` closes every engine (launched SGLang servers stop). Shard tasks in several threads ask at once."""

    def __init__(self, base_env: dict[str, str]) -> None:
        self.base_env = base_env  # NCCL_*/CUDA_* of the worker pass through to the servers
        self._pools: dict[str, ServerPool] = {}
        self._lock = threading.Lock()

    def pool(self, config: PipelineConfig, model_dir: Path) -> ServerPool:
        key = pool_key(config, str(model_dir))
        with self._lock:
            if key not in self._pools:
                self._pools[key] = ServerPool(config, Path(model_dir), self.base_env)
            return self._pools[key]

    def close(self) -> None:
        with self._lock:
            pools, self._pools = list(self._pools.values()), {}
        for pool in pools:
            pool.close()


def server_count(config: PipelineConfig) -> int:
    """How many servers (so how many shards at once) this config has."""
    return max(1, len(config.server.servers))
