"""`eagle3 doctor`: is this node ready to extract with SGLang? Run it on the GPU node before a big run.

  run_doctor(cfg) -> DoctorReport   checks in order, each ok / warn / fail / skip, and a one-line verdict

1. the SGLang environment: server.python, sglang's version, our plugin's entry point
2. the layer mapping for this model family (HF indices -> SGLang ids)
3. free space on the store's filesystem and on the dump directory (/dev/shm is RAM)
4. launch the server (or attach to server.url): /health, the hook loaded in every TP worker, with the
   layers the run expects and a writer on attention-TP rank 0
5. one sample through SGLang against the transformers engine, per token (when the model fits in RAM)
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from eagle3.config import ExtractConfig, PipelineConfig, ServerConfig
from eagle3.extract.disk import GB
from eagle3.serving.layers import LayerMappingError, SGLangLayers, extraction_layers
from eagle3.serving.server import ServerError, SGLangServer, server_device
from eagle3.store import dump_protocol as proto
from eagle3.store.paths import RunPaths, dump_root
from eagle3.store.run_store import PreparedSample
from eagle3.target.demo import resolve_model
from eagle3.target.files import read_model_facts

Status = Literal["ok", "warn", "fail", "skip"]
PROBE_TEXT = (
    "Speculative decoding drafts a few tokens with a small model and lets the target model check them all "
    "in one forward pass; the draft learns from the target's own hidden states."
)


@dataclass
class Check:
    name: str
    status: Status
    detail: str


@dataclass
class DoctorReport:
    checks: list[Check] = field(default_factory=list)

    def add(self, name: str, status: Status, detail: str) -> Check:
        c = Check(name, status, detail)
        self.checks.append(c)
        return c

    @property
    def ok(self) -> bool:
        return not any(c.status == "fail" for c in self.checks)

    @property
    def verdict(self) -> str:
        fails = [c for c in self.checks if c.status == "fail"]
        warns = [c for c in self.checks if c.status == "warn"]
        if fails:
            return f"NOT READY: {fails[0].name}: {fails[0].detail}" + (
                f" (+{len(fails) - 1} more)" if len(fails) > 1 else ""
            )
        if warns:
            return f"READY with {len(warns)} warning(s): " + "; ".join(f"{c.name}: {c.detail}" for c in warns)
        return "READY: SGLang, the hook, the layers and the disk are set for extraction"

    def render(self) -> str:
        width = max((len(c.name) for c in self.checks), default=0)
        lines = [f"{c.status.upper():4}  {c.name:{width}}  {c.detail}" for c in self.checks]
        return "\n".join([*lines, "", self.verdict])


def run_doctor(
    cfg: PipelineConfig,
    *,
    base_env: Mapping[str, str],
    launch: bool = True,
    parity_max_gb: float = 16.0,
    min_free_gb: float = 10.0,
) -> DoctorReport:
    """Every check runs even when an earlier one failed, unless it needs what failed."""
    report = DoctorReport()
    env = dict(base_env)  # the caller's (the CLI passes os.environ): the server launched here starts from it
    model_dir = _check_model(cfg, report)
    _check_environment(cfg.server, report, env)
    layers = _check_layers(cfg.extract, report, model_dir) if model_dir else None
    dump_dir = dump_root(cfg.run_dir, cfg.extract.dump_dir)
    _check_space(report, "store space", Path(cfg.run_dir), min_free_gb)
    _check_space(report, "dump space", dump_dir, min_free_gb)
    if not launch:
        report.add("server", "skip", "not launched (launch=False)")
    elif model_dir is None or layers is None or not report.ok:
        report.add("server", "skip", "skipped: fix the failures above first")
    else:
        _check_server(cfg, report, model_dir, layers, dump_dir, env, parity_max_gb)
    return report


def _check_model(cfg: PipelineConfig, report: DoctorReport) -> Path | None:
    try:
        model_dir = resolve_model(cfg.model, Path(cfg.data_dir))
        facts = read_model_facts(model_dir)
    except Exception as e:  # ModelError and friends: the message says what to do
        report.add("model", "fail", str(e))
        return None
    size = sum(p.stat().st_size for p in model_dir.glob("*.safetensors"))
    report.add(
        "model",
        "ok",
        f"{model_dir}: {facts.model_type}, {facts.num_layers} layers, hidden {facts.hidden_size}, {size / GB:.1f} GB",
    )
    return model_dir


def _check_environment(server: ServerConfig, report: DoctorReport, env: Mapping[str, str]) -> None:
    if server.url:
        report.add("sglang env", "skip", f"attaching to {server.url}: the server's own environment is checked live")
        return
    python = server.python
    if not Path(python).exists():
        report.add("sglang env", "fail", f"server.python {python} missing: run deploy/sglang_env.sh")
        return
    probe = (
        "import importlib.metadata as m; print(m.version('sglang')); "
        "print(','.join(e.value for e in m.entry_points(group='sglang.srt.plugins')))"
    )
    try:
        out = subprocess.run(
            [os.path.abspath(python), "-c", probe],
            capture_output=True,
            text=True,
            timeout=120,
            cwd="/",
            env=dict(env),
            check=True,
        ).stdout.splitlines()
    except (subprocess.SubprocessError, OSError) as e:
        report.add("sglang env", "fail", f"{python} cannot report sglang's version: {e}")
        return
    version, plugins = [*out, "", ""][:2]
    if version not in proto.SUPPORTED_SGLANG:
        supported = ", ".join(proto.SUPPORTED_SGLANG)
        report.add("sglang env", "fail", f"sglang {version} in {python}; supported: {supported}")
    elif "server_patch:load_plugin" not in plugins.split(","):
        report.add(
            "sglang env",
            "fail",
            f"sglang {version}, but the server_patch plugin is not installed: run deploy/sglang_env.sh",
        )
    else:
        device = server_device(server)
        report.add("sglang env", "ok", f"sglang {version} + server_patch plugin in {python} (device {device})")


def _check_layers(extract: ExtractConfig, report: DoctorReport, model_dir: Path) -> SGLangLayers | None:
    try:
        layers = extraction_layers(model_dir, extract)
    except (ValueError, LayerMappingError) as e:
        report.add("layers", "fail", str(e))
        return None
    report.add(
        "layers", "ok", f"HF hidden_states {layers.aux_layers} -> SGLang ids {layers.layer_ids} ({layers.convention})"
    )
    return layers


def _check_space(report: DoctorReport, name: str, path: Path, min_free_gb: float) -> None:
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    usage = shutil.disk_usage(probe)
    ram = " (RAM-backed: dumps use memory)" if str(path.resolve()).startswith("/dev/shm") else ""
    detail = f"{usage.free / GB:.1f} GB free of {usage.total / GB:.1f} GB at {path}{ram}"
    report.add(name, "ok" if usage.free / GB >= min_free_gb else "warn", detail)


def _check_server(
    cfg: PipelineConfig,
    report: DoctorReport,
    model_dir: Path,
    layers: SGLangLayers,
    dump_dir: Path,
    env: Mapping[str, str],
    parity_max_gb: float,
) -> None:
    server = SGLangServer(
        cfg.server,
        model_dir,
        dump_dir=dump_dir,
        layers=layers,
        log_dir=RunPaths(cfg.run_dir).doctor_log_dir,
        base_env=env,
    )
    try:
        try:
            server.start()  # waits for /health and checks the hook's reports
        except ServerError as e:
            report.add("server", "fail", str(e).splitlines()[0])
            return
        workers = [s for s in proto.read_statuses(dump_dir) if s.get("status") == "worker"]
        report.add(
            "server",
            "ok",
            f"SGLang {server.version} at {server.url}: hook in {len(workers)} worker(s) "
            f"(tp {cfg.server.tp}), capturing {workers[0].get('layers_to_capture') if workers else '?'}",
        )
        if not server.attached and len(workers) < cfg.server.tp:
            report.add("hook", "fail", f"{len(workers)} of {cfg.server.tp} TP workers reported the hook")
        _check_parity(cfg, report, model_dir, dump_dir, server, parity_max_gb)
    finally:
        server.stop()


def _check_parity(
    cfg: PipelineConfig, report: DoctorReport, model_dir: Path, dump_dir: Path, server: SGLangServer, max_gb: float
) -> None:
    from transformers import AutoTokenizer

    from eagle3.extract.engines import build_engine
    from eagle3.extract.engines.base import Captured, Dumped
    from eagle3.extract.engines.sglang_engine import SGLangEngine
    from eagle3.store.sample_format import read_sample

    size_gb = sum(p.stat().st_size for p in model_dir.glob("*.safetensors")) / GB
    if size_gb > max_gb:
        report.add("parity", "skip", f"model is {size_gb:.0f} GB > {max_gb:.0f} GB: no transformers reference here")
        return
    ids = AutoTokenizer.from_pretrained(model_dir)(PROBE_TEXT).input_ids
    sample = PreparedSample("doctor-probe", ids, [1] * len(ids), "doctor")
    # The probe checks layers and rows in the model's dtype: an FP8 store's quantization is not what it measures.
    probe = cfg.model_copy(update={"extract": cfg.extract.model_copy(update={"store_dtype": "bfloat16"})})
    (got,) = SGLangEngine(probe, model_dir, "doctor", dump_dir, server=server).extract([sample])
    if not isinstance(got, Dumped):
        report.add("parity", "fail", f"the probe sample did not come back: {getattr(got, 'reason', got)}")
        return
    dumped = read_sample(got.path)
    got.path.unlink(missing_ok=True)
    reference = probe.model_copy(update={"server": probe.server.model_copy(update={"engine": "transformers"})})
    (ref,) = build_engine(reference, model_dir, device="cpu").extract([sample])
    assert isinstance(ref, Captured)
    worst = []
    for name, a, b in (
        ("aux", dumped.aux_hidden_states, ref.aux_hidden_states),
        ("last", dumped.last_hidden_state, ref.last_hidden_state),
    ):
        e = (a.float() - b.float()).norm(dim=-1) / b.float().norm(dim=-1).clamp_min(1e-6)  # per token (and layer)
        worst.append((name, float(e.median()), float(e.max())))
    bad = [w for w in worst if w[1] > 0.03 or w[2] > 0.2]
    detail = ", ".join(f"{n}: median token {m:.3f}, worst {x:.3f}" for n, m, x in worst)
    report.add("parity", "fail" if bad else "ok", f"{len(ids)} tokens vs the transformers engine: {detail}")
