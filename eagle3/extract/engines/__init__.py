"""Engines turn prepared samples into hidden states; `build_engine` picks one from the config.

Each engine module is imported only when chosen: the SGLang one talks to another interpreter, and
neither should cost an import to a caller that uses the other.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from eagle3.config import PipelineConfig
from eagle3.extract.engines.base import Captured, Dumped, Engine, EngineInfo, Failed, Outcome
from eagle3.target.files import check_target

if TYPE_CHECKING:
    from eagle3.extract.engines.transformers_engine import LoadedModels

__all__ = ["Captured", "Dumped", "Engine", "EngineInfo", "Failed", "Outcome", "build_engine"]


def build_engine(
    cfg: PipelineConfig,
    model_dir: Path,
    *,
    device: str | None = None,
    dump_dir: Path | None = None,
    log_dir: Path | None = None,
    base_env: Mapping[str, str] | None = None,
    on_line: Callable[[str], None] | None = None,
    models: LoadedModels | None = None,
) -> Engine:
    """The engine named by `server.engine`, for the model in `model_dir`: the one place an engine is built (one
    server of several comes here too, through eagle3/extract/pool.py's build_server_engine). Loading weights or
    launching a server happens on first use, so building one is cheap. One server of several gives its own `device`
    (transformers), or its own `dump_dir` and `log_dir` (sglang); None: the section's (`server.device`,
    `eagle3.store.paths.dump_root`, `<run_dir>/server`). `base_env` and `on_line` are the sglang server's
    environment (required there: the caller reads it, the library never reads os.environ) and log line sink.
    `models` (transformers): the weights this engine shares with others (a server pool's engines: one copy); None:
    its own."""
    check_target(model_dir, cfg.server.engine)  # an unsupported architecture or a foreign tokenizer: refused here
    if cfg.server.engine == "transformers":
        from eagle3.extract.engines.transformers_engine import TransformersEngine

        return TransformersEngine(
            model_dir,
            aux_layers=cfg.extract.aux_layers,
            device=device or cfg.server.device,
            dtype=cfg.server.dtype,
            batch_tokens=cfg.server.batch_tokens,
            store_dtype=cfg.extract.store_dtype,
            models=models,
        )
    if cfg.server.engine == "sglang":
        sglang_engine = importlib.import_module("eagle3.extract.engines.sglang_engine")
        if base_env is None:
            raise ValueError("build_engine: server.engine sglang launches a server; pass base_env (e.g. os.environ)")
        engine: Engine = sglang_engine.build_sglang_engine(
            cfg, model_dir, dump_dir=dump_dir, log_dir=log_dir, base_env=base_env, on_line=on_line
        )
        return engine
    raise ValueError(f"server.engine {cfg.server.engine!r}: expected 'transformers' or 'sglang'")
