"""Engines turn prepared samples into hidden states; `build_engine` picks one from the config.

Each engine module is imported only when chosen: the SGLang one talks to another interpreter, and
neither should cost an import to a caller that uses the other.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from pathlib import Path

from eagle3.config import PipelineConfig
from eagle3.engines.base import Captured, Dumped, Engine, EngineInfo, Failed, Outcome

__all__ = ["Captured", "Dumped", "Engine", "EngineInfo", "Failed", "Outcome", "build_engine"]


def build_engine(cfg: PipelineConfig, model_dir: Path, base_env: Mapping[str, str] | None = None) -> Engine:
    """The engine named by `server.engine`, for the model in `model_dir`. Loading weights or
    launching a server happens on first use, so building one is cheap. `base_env` (sglang: required) is the
    environment a launched server starts from; the caller reads it (the library never reads os.environ)."""
    if cfg.server.engine == "transformers":
        from eagle3.engines.transformers_engine import TransformersEngine

        return TransformersEngine(
            model_dir,
            aux_layers=cfg.extract.aux_layers,
            device=cfg.server.device,
            dtype=cfg.server.dtype,
            batch_tokens=cfg.server.batch_tokens,
            store_dtype=cfg.extract.store_dtype,
        )
    if cfg.server.engine == "sglang":
        sglang_engine = importlib.import_module("eagle3.engines.sglang_engine")
        if base_env is None:
            raise ValueError("build_engine: server.engine sglang launches a server; pass base_env (e.g. os.environ)")
        engine: Engine = sglang_engine.build_sglang_engine(cfg, model_dir, base_env)
        return engine
    raise ValueError(f"server.engine {cfg.server.engine!r}: expected 'transformers' or 'sglang'")
