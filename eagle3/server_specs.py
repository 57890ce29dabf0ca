"""The servers of one extraction: one engine per entry of `server.servers` (or the one the section describes).

    server_specs(cfg, host=..., separate_dumps=...)   what each server is: label, its own config, dump and log dirs
    build_server_engine(spec, model_dir, ...)         its engine (cheap: weights load and servers launch on first use)

A launched SGLang server of several gets its own port (`port`, else `server.port` + its position), its own GPUs
(CUDA_VISIBLE_DEVICES = `gpus`), its own dump directory (`<extract.dump_dir or run_dir/dump>/<host>-<port>`) and
log (`<run_dir>/server/<host>-<port>/sglang.log`): servers never clear or read each other's files, on one host or
on several sharing the run directory. One server in a run directory that no other flow run shares keeps the
plain layout (`<run_dir>/dump`, `<run_dir>/server`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from eagle3.config import PipelineConfig, ServerSlot
from eagle3.engines import Engine, EngineInfo, Outcome, build_engine
from eagle3.fsio import safe_name
from eagle3.sglang_server import LineFn, SGLangServer
from eagle3.store import PreparedSample


@dataclass(frozen=True)
class ServerSpec:
    index: int
    label: str  # for logs and the shard table: "sglang host:30001 (GPUs 4,5)", "sglang http://b:30000", ...
    config: PipelineConfig  # the run's config with `server` narrowed to this one server
    dump_dir: Path | None  # sglang: where this server's dumps appear; None: the engine's default
    log_dir: Path | None  # sglang launched: where its log goes; None: the engine's default
    device: str  # transformers: the torch device


def server_specs(cfg: PipelineConfig, *, host: str, separate_dumps: bool = False) -> list[ServerSpec]:
    """One spec per server. `separate_dumps`: give even a single launched server its own dump directory (another
    flow run, maybe on another node, shares the run directory and its default dump directory)."""
    slots = cfg.server.servers or [ServerSlot(url=cfg.server.url)]  # type: ignore[call-arg]
    separate = separate_dumps or len(slots) > 1
    base_dump = Path(cfg.extract.dump_dir) if cfg.extract.dump_dir else Path(cfg.run_dir) / "dump"
    specs = []
    for i, slot in enumerate(slots):
        port = slot.port if slot.port is not None else cfg.server.port + i
        env = dict(cfg.server.env)
        if slot.gpus is not None and cfg.server.engine == "sglang":
            env["CUDA_VISIBLE_DEVICES"] = slot.gpus
        server = cfg.server.model_copy(update={"url": slot.url, "port": port, "env": env, "servers": []})
        one = cfg.model_copy(update={"server": server})
        name = safe_name(f"{host}-{port}")
        dump_dir: Path | None = None
        log_dir: Path | None = None
        if separate and slot.url is not None:
            dump_dir = Path(slot.dump_dir) if slot.dump_dir else base_dump
        elif separate:
            dump_dir = Path(slot.dump_dir) if slot.dump_dir else base_dump / name
            log_dir = Path(cfg.run_dir) / "server" / name
        label = label_of(cfg, slot, host, port)
        if len(slots) > 1:
            label = f"#{i} {label}"
        specs.append(ServerSpec(i, label, one, dump_dir, log_dir, device_of(cfg, slot)))
    return specs


def label_of(cfg: PipelineConfig, slot: ServerSlot, host: str, port: int) -> str:
    """How logs and the shard table name a server: `sglang node-a:30001 (GPUs 4,5)`, `sglang http://b:30000`."""
    gpus = f" (GPUs {slot.gpus})" if slot.gpus is not None else ""
    if cfg.server.engine == "transformers":
        return f"transformers {device_of(cfg, slot)} on {host}"
    if slot.url is not None:
        return f"sglang {slot.url}"
    return f"sglang {host}:{port}{gpus}"


def device_of(cfg: PipelineConfig, slot: ServerSlot) -> str:
    if cfg.server.engine == "transformers" and slot.gpus is not None:
        return f"cuda:{slot.gpus}"
    return cfg.server.device


def build_server_engine(
    spec: ServerSpec, model_dir: Path, *, base_env: Mapping[str, str], on_line: LineFn | None = None
) -> Engine:
    """The engine of one server. Loading weights or launching happens on its first `extract`."""
    cfg = spec.config
    if cfg.server.engine == "transformers":
        from eagle3.engines.transformers_engine import TransformersEngine

        return TransformersEngine(
            model_dir,
            aux_layers=cfg.extract.aux_layers,
            device=spec.device,
            dtype=cfg.server.dtype,
            batch_tokens=cfg.server.batch_tokens,
        )
    if spec.dump_dir is None:  # the single-server layout
        if cfg.server.engine == "sglang":
            from eagle3.engines.sglang_engine import build_sglang_engine

            return build_sglang_engine(cfg, model_dir, base_env=base_env)
        return build_engine(cfg, model_dir)
    return _sglang_engine(spec, model_dir, base_env=base_env, on_line=on_line)


def _sglang_engine(spec: ServerSpec, model_dir: Path, *, base_env: Mapping[str, str], on_line: LineFn | None) -> Engine:
    from eagle3.aux_layers import resolve_aux_layers
    from eagle3.engines.sglang_engine import SGLangEngine, run_id_of
    from eagle3.model_files import read_model_facts
    from eagle3.sglang_layers import sglang_layer_ids

    assert spec.dump_dir is not None
    cfg = spec.config
    facts = read_model_facts(model_dir)
    aux = resolve_aux_layers(cfg.extract.aux_layers, facts.num_layers)
    layers = sglang_layer_ids(facts.model_type, aux, facts.num_layers, cfg.extract.sglang_layer_ids)
    server = SGLangServer(
        cfg.server,
        model_dir,
        dump_dir=spec.dump_dir,
        layers=layers,
        log_dir=spec.log_dir or Path(cfg.run_dir) / "server",
        base_env=base_env,
        on_line=on_line,
    )
    engine = SGLangEngine(cfg, model_dir, run_id_of(Path(cfg.run_dir)), spec.dump_dir, server=server)
    return ServerOwningEngine(engine, server)


class ServerOwningEngine:
    """An engine built around a server it was handed, that stops that server on `close` (a launched one)."""

    def __init__(self, engine: Engine, server: SGLangServer):
        self.engine, self.server = engine, server
        self.info: EngineInfo = engine.info

    def extract(self, samples: Sequence[PreparedSample]) -> Iterator[Outcome]:
        return self.engine.extract(samples)

    def close(self) -> None:
        try:
            self.server.stop()  # first (a no-op for an attached server): no late dump can appear after the sweep
        finally:
            self.engine.close()  # closes its client, sweeps the dump directory
