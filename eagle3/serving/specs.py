"""The servers of one extraction: one engine per entry of `server.servers` (or the one the section describes).

    server_specs(cfg, host=..., separate_dumps=...)   what each server is: label, its own config, dump and log dirs

A launched SGLang server of several gets its own port (`port`, else `server.port` + its position), its own GPUs
(CUDA_VISIBLE_DEVICES = `gpus`), its own dump directory (`<extract.dump_dir or run_dir/dump>/<host>-<port>`) and
log (`<run_dir>/server/<host>-<port>/sglang.log`): servers never clear or read each other's files, on one host or
on several sharing the run directory. One server in a run directory that no other flow run shares keeps the
plain layout (`<run_dir>/dump`, `<run_dir>/server`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from eagle3.config import PipelineConfig, ServerConfig, ServerSlot
from eagle3.serving.launch_args import capture_args_problem
from eagle3.store.fsio import safe_name
from eagle3.store.paths import RunPaths, dump_root


@dataclass(frozen=True)
class ServerSpec:
    index: int
    label: str  # for logs and the shard table: "sglang host:30001 (GPUs 4,5)", "sglang http://b:30000", ...
    config: PipelineConfig  # the run's config with `server` narrowed to this one server
    dump_dir: Path | None  # sglang: where this server's dumps appear; None: the engine's default
    log_dir: Path | None  # sglang launched: where its log goes; None: the engine's default
    device: str  # transformers: the torch device


class ServerArgsError(ValueError):
    """`server.extra_args` has a flag that would make a capturing SGLang server skip layers (launch_args.py)."""


def server_specs(
    cfg: PipelineConfig, *, host: str, separate_dumps: bool = False, capture: bool = True
) -> list[ServerSpec]:
    """One spec per server. `separate_dumps`: give even a single launched server its own dump directory (another
    flow run, maybe on another node, shares the run directory and its default dump directory). `capture`: the
    servers capture hidden states (extraction), so a launch flag that skips the capture is refused (ServerArgsError)."""
    slots = cfg.server.servers or [ServerSlot(url=cfg.server.url)]  # type: ignore[call-arg]
    launches = cfg.server.engine == "sglang" and any(s.url is None for s in slots)
    if capture and launches and (problem := capture_args_problem(cfg.server)):
        raise ServerArgsError(problem)
    separate = separate_dumps or len(slots) > 1
    base_dump = dump_root(cfg.run_dir, cfg.extract.dump_dir)
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
            log_dir = RunPaths(cfg.run_dir).server_log_dir / name
        label = label_of(cfg.server, slot, host, port)
        if len(slots) > 1:
            label = f"#{i} {label}"
        specs.append(ServerSpec(i, label, one, dump_dir, log_dir, device_of(cfg.server, slot)))
    return specs


def label_of(server: ServerConfig, slot: ServerSlot, host: str, port: int) -> str:
    """How logs and the shard table name a server: `sglang node-a:30001 (GPUs 4,5)`, `sglang http://b:30000`."""
    gpus = f" (GPUs {slot.gpus})" if slot.gpus is not None else ""
    if server.engine == "transformers":
        return f"transformers {device_of(server, slot)} on {host}"
    if slot.url is not None:
        return f"sglang {slot.url}"
    return f"sglang {host}:{port}{gpus}"


def device_of(server: ServerConfig, slot: ServerSlot) -> str:
    """The torch device of one transformers server (its GPU), else the section's `server.device`."""
    if server.engine == "transformers" and slot.gpus is not None:
        return f"cuda:{slot.gpus}"
    return server.device
