"""The dump directory shared by the SGLang hook (server_patch) and the extraction client.

Standard library + eagle3.store.fsio only: server_patch imports this inside SGLang's processes, the client
imports it in the pipeline, so both sides name and parse the files with one piece of code. It also holds what
else the two sides agree on: the SGLang release (SUPPORTED_SGLANG) and the server's environment variables.

    <dump_dir>/<safe rid>.req.json      client -> hook, written before the request is sent:
                                        {"rid", "sample_id", "num_tokens", "aux_layers", "loss_mask": "0110..",
                                         "store_dtype": "bfloat16" | "float8_e4m3" (absent: bfloat16)}
    <dump_dir>/<safe rid>.safetensors   hook -> client: a complete sample in the store format
                                        (eagle3.store.sample_format), loss mask taken from the .req.json
    <dump_dir>/<safe rid>.error.json    hook -> client: {"rid", "reason"} when the request cannot be dumped
    <dump_dir>/.plugin/<pid>.json       hook status per process: {"status": "loaded"|"refused"|"worker", ...}

The loss mask travels in the .req.json because /generate has no field for it, and rewriting a finished
dump to add it would double the write volume; the hook therefore writes the final store file once.
All files are written atomically (temporary name, fsync, rename): a file that exists is complete.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eagle3.store.fsio import atomic_write_json, safe_name

#: The SGLang release the plugin is written against (hook.py and cpu_spec.py use its internals; both refuse any
#: other) and the pipeline checks for. The one place it is written: deploy/sglang_env.sh installs `sglang==` the
#: first entry, read from this line.
SUPPORTED_SGLANG = ("0.5.23",)

# Environment of the SGLang server process (set by eagle3/serving/server.py and eagle3/evaluate/live.py, read by
# server_patch only).
ENV_DUMP_DIR = "EAGLE3_DUMP_DIR"  # the hook is inert unless this names a directory
ENV_RID_PREFIX = "EAGLE3_RID_PREFIX"  # capture only requests whose rid starts with this (default "e3-")
ENV_AUX_LAYERS = "EAGLE3_AUX_LAYERS"  # HF indices "2,15,27": the hook checks SGLang captures exactly these
ENV_WRITER_QUEUE = "EAGLE3_WRITER_QUEUE"  # finished requests waiting for the writer thread (default 8)
ENV_CPU_SPEC = "EAGLE3_CPU_SPEC"  # "1": on a CPU server, install the EAGLE3 fallback (server_patch/cpu_spec.py)
ENV_CPU_FORK = "EAGLE3_CPU_FORK"  # "1": on a CPU server, fork SGLang's children instead of spawning them
ENV_PREFIX = "EAGLE3_"  # every variable above: a server launched without capture gets none of them

RID_PREFIX = "e3-"
STATUS_DIR = ".plugin"


def dump_path(dump_dir: Path, rid: str) -> Path:
    return Path(dump_dir) / f"{safe_name(rid)}.safetensors"


def error_path(dump_dir: Path, rid: str) -> Path:
    return Path(dump_dir) / f"{safe_name(rid)}.error.json"


def request_path(dump_dir: Path, rid: str) -> Path:
    return Path(dump_dir) / f"{safe_name(rid)}.req.json"


def status_dir(dump_dir: Path) -> Path:
    return Path(dump_dir) / STATUS_DIR


def run_id_of(run_dir: Path) -> str:
    """A short stable id of a run directory, part of every rid (two runs never share a dump name)."""
    return hashlib.sha256(os.path.abspath(run_dir).encode()).hexdigest()[:10]


def make_rid(run_id: str, sample_id: str, attempt: int = 0) -> str:
    """The request id of one attempt at one sample of one run, file-name safe:

        e3-<run id>-<sample id>            the first attempt
        e3-<run id>.<attempt>-<sample id>  a resend (attempt >= 1, after a timeout or a dead server)

    Every attempt has its own rid, so a timed-out attempt that the server still finishes later writes its
    dump (or error file) under its own name: never adopted in place of the resend's, never a refused
    duplicate in-flight rid. Within one run id the names are distinct (the character after the run id is
    '-' or '.'), and one attempt's rid is never a prefix of another attempt's (SGLang aborts by rid prefix)."""
    if attempt < 0:
        raise ValueError(f"attempt {attempt} < 0")
    run = f"{run_id}.{attempt}" if attempt else run_id
    return safe_name(f"{RID_PREFIX}{run}-{sample_id}")


@dataclass(frozen=True)
class RequestInfo:
    rid: str
    sample_id: str
    num_tokens: int
    aux_layers: list[int]
    loss_mask: list[int]
    store_dtype: str = "bfloat16"  # "float8_e4m3": the hook quantizes on the device (sample_format.quantize_fp8)


def write_request(dump_dir: Path, info: RequestInfo) -> Path:
    if len(info.loss_mask) != info.num_tokens:
        raise ValueError(f"{info.sample_id}: loss mask has {len(info.loss_mask)} entries, sample {info.num_tokens}")
    path = request_path(dump_dir, info.rid)
    atomic_write_json(
        path,
        {
            "rid": info.rid,
            "sample_id": info.sample_id,
            "num_tokens": info.num_tokens,
            "aux_layers": list(info.aux_layers),
            "loss_mask": "".join("1" if m else "0" for m in info.loss_mask),
            "store_dtype": info.store_dtype,
        },
    )
    return path


def read_request(dump_dir: Path, rid: str) -> RequestInfo:
    """Raises FileNotFoundError when the client wrote none, ValueError when it is malformed."""
    path = request_path(dump_dir, rid)
    raw: dict[str, Any] = json.loads(path.read_text())
    mask = raw["loss_mask"]
    if set(mask) - {"0", "1"}:
        raise ValueError(f"{path}: loss_mask must be a string of 0/1")
    info = RequestInfo(
        rid=str(raw["rid"]),
        sample_id=str(raw["sample_id"]),
        num_tokens=int(raw["num_tokens"]),
        aux_layers=[int(x) for x in raw["aux_layers"]],
        loss_mask=[1 if c == "1" else 0 for c in mask],
        store_dtype=str(raw.get("store_dtype", "bfloat16")),
    )
    if info.rid != rid or len(info.loss_mask) != info.num_tokens:
        raise ValueError(
            f"{path}: rid {info.rid!r} / mask length {len(info.loss_mask)} do not match {rid!r} / {info.num_tokens}"
        )
    return info


def write_error(dump_dir: Path, rid: str, reason: str) -> Path:
    path = error_path(dump_dir, rid)
    atomic_write_json(path, {"rid": rid, "reason": reason})
    return path


def read_error(dump_dir: Path, rid: str) -> str | None:
    path = error_path(dump_dir, rid)
    try:
        return str(json.loads(path.read_text()).get("reason", "no reason given"))
    except FileNotFoundError:
        return None
    except (json.JSONDecodeError, AttributeError):
        return f"unreadable error file {path}"


def write_status(dump_dir: Path, name: str, status: dict[str, Any]) -> Path:
    path = status_dir(dump_dir) / f"{safe_name(name)}.json"
    atomic_write_json(path, status)
    return path


def read_statuses(dump_dir: Path) -> list[dict[str, Any]]:
    out = []
    d = status_dir(dump_dir)
    if d.is_dir():
        for p in sorted(d.glob("*.json")):
            try:
                out.append(json.loads(p.read_text()))
            except (OSError, json.JSONDecodeError):
                continue
    return out


def parse_layers(text: str | None) -> list[int] | None:
    if not text:
        return None
    return [int(x) for x in text.replace(" ", "").split(",") if x]
