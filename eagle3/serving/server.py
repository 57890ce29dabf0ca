"""The SGLang server's lifecycle: command line, launch, health wait, log, stop, restart; or attach.

    SGLangServer(server_cfg, model_dir, dump_dir=..., layers=..., log_dir=..., base_env=os.environ)
        .start()      launch (or attach to server.url), wait for /health, check the hook reported in
        .stop()       SIGTERM to the process group, SIGKILL after a grace period (safe to call twice)
        .record_path  <log_dir>/server.json while the launched server may run (eagle3/serving/record.py)
        .restart()    stop + start, at most server.max_restarts times
        .is_alive()   the launched process is running (attach: /health answers)
        .log_tail(n)  the last lines of the server log, quoted in every error

The server runs with `server.python` (SGLang's own environment, deploy/sglang_env.sh) from a working
directory with no `server_patch` folder, so Python imports the installed plugin, never a source folder.
The environment is passed in (`base_env`), never read here; on CPU we add SGLANG_USE_CPU_ENGINE=1 and the
stub libcuda on LD_LIBRARY_PATH. Each start gets a fresh `<dump_dir>/.plugin/` where the hook reports.

A launched server is bound to the process that launched it (eagle3/serving/keeper.py): it runs under a keeper that ends
its whole process group when this process dies, however it dies. Before launching, `start()` stops an orphan
that a dead owner left in the same log directory (`self.reaped` says what it found) and refuses a port that
another process listens on, naming that process and the setting to change. The flow run id (for the record and
the logs) comes from `base_env[FLOW_RUN_ENV]`, which Prefect sets in a deployment's flow-run process and the
task layer adds otherwise.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import socket
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import httpx

from eagle3.config import ServerConfig
from eagle3.device import nvidia_smi_present, resolve_device
from eagle3.serving import procs
from eagle3.serving.keeper import OwnedProcess
from eagle3.serving.launch_args import CAPTURE_SKIPPING_FLAGS
from eagle3.serving.layers import SGLangLayers
from eagle3.serving.record import (
    Reaped,
    ServerRecord,
    port_taken_message,
    reap_orphan,
    record_path,
    remove_record,
    write_record,
)
from eagle3.store import dump_protocol as proto

FLOW_RUN_ENV = "PREFECT__FLOW_RUN_ID"
PORT_FREE_WAIT_S = 15.0
LineFn = Callable[[str], None]
#: A Python exception's own line: `ValueError: ...`, `torch.OutOfMemoryError: ...`, `KeyboardInterrupt`, as a
#: traceback ends, possibly behind a logger's prefix (SGLang's `[2026-12-05 02:05:30] `).
_EXCEPTION_LINE = re.compile(
    r"^(?:\[[^\]]*\]\s*)?((?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception|Exit|Interrupt)(?::\s.*)?)$"
)


class ServerError(RuntimeError):
    """The server did not start, died, or is not set up for extraction; the message quotes its log."""


def last_exception(log_text: str) -> str | None:
    """The last exception line of a log (`RuntimeError: ...`), for the first line of an error, where a reader
    (a flow run's state message, a failure artifact) sees it; the tail below it keeps the traceback."""
    for line in reversed(log_text.splitlines()):
        if m := _EXCEPTION_LINE.match(line.strip()):
            return m.group(1)[:500]
    return None


def server_device(server: ServerConfig, which: Callable[[str], str | None] = shutil.which) -> str:
    """The device of a launched server: `auto` -> cuda when the node has nvidia-smi (the server runs in another
    interpreter, so this process's torch does not speak for it), else cpu."""
    return resolve_device(server.device, cuda=lambda: nvidia_smi_present(which))


def venv_dir(python: str) -> Path:
    """The environment of an interpreter path such as .venv-sglang/bin/python (symlinks kept)."""
    return Path(os.path.abspath(python)).parent.parent


def build_command(
    server: ServerConfig,
    model_dir: Path,
    layers: SGLangLayers | None,
    *,
    port: int,
    device: str,
) -> list[str]:
    """argv of `sglang.launch_server`. `layers=None` launches without capture (the benchmark's baseline)."""
    argv = [
        os.path.abspath(server.python),
        "-m",
        "sglang.launch_server",
        "--model-path",
        os.path.abspath(model_dir),
        "--tp-size",
        str(server.tp),
        "--dtype",
        server.dtype,
        "--host",
        server.host,
        "--port",
        str(port),
        "--skip-tokenizer-init",  # the client sends token ids
    ]
    if not server.prefix_cache:
        # cached prefix rows are never computed, so never captured; with the cache on (server.prefix_cache), each
        # extraction request is salted into a namespace of its own instead (eagle3/extract/engines/sglang_engine.py)
        argv.append("--disable-radix-cache")
    if layers is not None:
        argv += ["--enable-return-aux-hidden-states", "--speculative-algorithm", "EAGLE3", *layers.cli_args()]
    if server.mem_fraction is not None:
        argv += ["--mem-fraction-static", str(server.mem_fraction)]
    if server.chunked_prefill_size is not None:
        argv += ["--chunked-prefill-size", str(server.chunked_prefill_size)]
    if server.max_total_tokens is not None:
        argv += ["--max-total-tokens", str(server.max_total_tokens)]
    if device == "cpu":
        # An idle SGLang scheduler otherwise spins a whole core, which a 2-core box cannot spare.
        argv += ["--device", "cpu", "--sleep-on-idle"]
    return argv + list(server.extra_args)


def build_env(
    server: ServerConfig,
    base_env: Mapping[str, str],
    *,
    device: str,
    dump_dir: Path | None,
    aux_layers: list[int] | None,
) -> dict[str, str]:
    """The server's environment: the caller's (NCCL_*, CUDA_*, HF_* pass through), server.env, the hook's
    switches when capturing, and the CPU engine + stub libcuda on CPU."""
    env = {k: v for k, v in base_env.items() if not k.startswith(proto.ENV_PREFIX)}
    env.update(server.env)
    env["PYTHONUNBUFFERED"] = "1"  # the log file shows progress as it happens
    if dump_dir is not None:
        env[proto.ENV_DUMP_DIR] = os.path.abspath(dump_dir)
        env[proto.ENV_RID_PREFIX] = proto.RID_PREFIX
        if aux_layers is not None:
            env[proto.ENV_AUX_LAYERS] = ",".join(map(str, aux_layers))
    if device == "cpu":
        stub = venv_dir(server.python) / "stub"
        env["SGLANG_USE_CPU_ENGINE"] = "1"
        env[proto.ENV_CPU_FORK] = "1"  # no CUDA context to protect: children forked, not spawned (cpu_fork.py)
        env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (str(stub), env.get("LD_LIBRARY_PATH", "")) if p)
        # Our stop SIGTERMs the whole group, so SGLang's watchdog takes every stop for a scheduler crash and sleeps 5 s
        # "to let GPU activity settle" before a py-spy / CUDA core dump; on CPU there is no GPU to wait for.
        for diagnostics in ("SGLANG_PYSPY_DUMP_BEFORE_CRASH", "SGLANG_CUDA_COREDUMP_BEFORE_CRASH"):
            env.setdefault(diagnostics, "0")
    return env


def shell_line(argv: list[str], env: Mapping[str, str], base_env: Mapping[str, str]) -> str:
    """The launch as one shell line (only the variables that differ from base_env), for logs and docs."""
    changed = {k: v for k, v in env.items() if base_env.get(k) != v}
    return " ".join([*(f"{k}={shlex.quote(v)}" for k, v in sorted(changed.items())), *map(shlex.quote, argv)])


#: uvicorn's log line when SGLang's HTTP server cannot listen on its port.
BIND_FAILED = "error while attempting to bind on address"


class SGLangServer:
    port_free_wait_s = PORT_FREE_WAIT_S
    _launch_offset = 0  # where this launch's lines start in the (appended) log

    def __init__(
        self,
        server: ServerConfig,
        model_dir: Path,
        *,
        dump_dir: Path | None,
        layers: SGLangLayers | None,
        log_dir: Path,
        base_env: Mapping[str, str],
        port: int | None = None,
        on_line: LineFn | None = None,
        stop_grace_s: float = 30.0,
    ):
        self.cfg = server
        self.model_dir = Path(model_dir)
        self.dump_dir = Path(dump_dir) if dump_dir is not None else None
        self.layers = layers
        self.log_dir = Path(log_dir)
        self.base_env = dict(base_env)
        self.port = port if port is not None else server.port
        self.on_line = on_line
        self.stop_grace_s = stop_grace_s
        self.device = server_device(server)
        self.attached = server.url is not None
        self.url = (server.url or f"http://{server.host}:{self.port}").rstrip("/")
        self.log_path = self.log_dir / "sglang.log"
        self.record_path = record_path(self.log_dir)
        self.restarts = 0
        self.version: str | None = None
        self.reaped: list[Reaped] = []  # orphans of dead owners this object stopped before launching
        self._proc: OwnedProcess | None = None
        self._follower: _LogFollower | None = None

    # lifecycle -----------------------------------------------------------------------------
    def start(self) -> None:
        if self.attached:
            self._wait_healthy(min(self.cfg.startup_timeout_s, 60.0))
            self._check_attached()
            return
        if self._proc is not None and self._proc.poll() is None:
            return
        self.stop()  # one that died: its pipe closed, its stragglers gone, its record removed
        self._check_launchable()
        self._reap_orphan()
        self._check_port()
        argv = build_command(self.cfg, self.model_dir, self.layers, port=self.port, device=self.device)
        env = build_env(
            self.cfg,
            self.base_env,
            device=self.device,
            dump_dir=self.dump_dir if self.layers is not None else None,
            aux_layers=self.layers.aux_layers if self.layers is not None else None,
        )
        if self.dump_dir is not None:
            shutil.rmtree(proto.status_dir(self.dump_dir), ignore_errors=True)  # this server's reports only
            self.dump_dir.mkdir(parents=True, exist_ok=True)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        cwd = self.log_dir / "cwd"  # empty: `import server_patch` must find the installed plugin
        cwd.mkdir(exist_ok=True)
        with open(self.log_path, "ab") as log:
            offset = self._launch_offset = log.tell()
            log.write(
                f"\n==== eagle3: launching SGLang {time.ctime()}\n{shell_line(argv, env, self.base_env)}\n".encode()
            )
            log.flush()
            # Under a keeper, in a process group of its own: stop() reaches the scheduler children too, and
            # the whole group ends when this process dies.
            self._proc = OwnedProcess.launch(
                argv, cwd=cwd, env=env, stdout=log, grace_s=self.stop_grace_s, record=self.record_path
            )
        if self.on_line is not None and self._follower is None:
            self._follower = _LogFollower(self.log_path, self.on_line, offset)
        try:
            self._write_record()
            self._wait_healthy(self.cfg.startup_timeout_s)
            self._write_record()  # now with the server's own process
            self.version = self._server_info().get("version")
            if self.layers is not None:
                self._check_hook()
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            proc.stop()  # the keeper ends the group (SIGTERM, grace, SIGKILL) and exits
            remove_record(self.record_path, proc.pid)
        if self._follower is not None:
            self._follower.close()
            self._follower = None

    def restart(self, reason: str) -> None:
        """After a crash during extraction; raises ServerError past server.max_restarts."""
        if self.attached:
            raise ServerError(f"the attached server {self.url} stopped answering ({reason}); restart it and re-run")
        if self.restarts >= self.cfg.max_restarts:
            raise ServerError(
                f"SGLang failed again ({reason}) after {self.restarts} restarts (server.max_restarts); "
                f"log {self.log_path}:\n{self.log_tail()}"
            )
        self.restarts += 1
        self.stop()
        self.start()

    @property
    def pgid(self) -> int | None:
        """Process group of a launched server (its keeper's pid); None when attached or stopped."""
        return self._proc.pgid if self._proc is not None else None

    def is_alive(self) -> bool:
        if self.attached:
            return self.healthy()
        return self._proc is not None and self._proc.poll() is None

    def healthy(self, timeout_s: float = 10.0) -> bool:
        try:
            return httpx.get(f"{self.url}/health", timeout=timeout_s).status_code == 200
        except httpx.HTTPError:
            return False

    def log_tail(self, n: int = 40) -> str:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(max(0, f.seek(0, 2) - 64 * 1024))
                lines = f.read().decode(errors="replace").splitlines()
        except OSError:
            return "(no log)"
        # SGLang prints its whole server_args dict on one line; it would drown the tail.
        return "\n".join(line if len(line) < 2000 else line[:2000] + " ..." for line in lines[-n:])

    def __enter__(self) -> SGLangServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # checks --------------------------------------------------------------------------------
    def _check_launchable(self) -> None:
        if not Path(self.cfg.python).exists():
            raise ServerError(
                f"server.python {self.cfg.python} does not exist: build the SGLang environment with "
                "deploy/sglang_env.sh (or point server.python at an interpreter with "
                f"sglang=={proto.SUPPORTED_SGLANG[0]})"
            )
        if self.device == "cpu" and not (venv_dir(self.cfg.python) / "stub" / "libcuda.so.1").exists():
            raise ServerError(
                f"no stub libcuda under {venv_dir(self.cfg.python) / 'stub'}; SGLang on CPU needs it: "
                "run deploy/sglang_env.sh on this machine"
            )

    def _reap_orphan(self) -> None:
        """Stop the server a dead owner left in this log directory (eagle3/serving/record.py)."""
        reaped = reap_orphan(self.record_path, grace_s=self.stop_grace_s)
        if reaped is None:
            return
        self.reaped.append(reaped)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "a", encoding="utf-8") as log:
            log.write(f"\n==== eagle3: {reaped.describe()}\n")
        if self.on_line is not None:
            self.on_line(f"eagle3: {reaped.describe()}")

    def _check_port(self) -> None:
        """ServerError naming the process that listens on this server's port (it is not ours: we launch next).
        Waits `port_free_wait_s` first: a server killed a moment ago may hold its socket while it exits."""
        deadline = time.monotonic() + self.port_free_wait_s
        while holders := procs.port_holders(self.port):
            if time.monotonic() > deadline:
                setting = "server.port (server.servers[].port for one of several servers)"
                raise ServerError(port_taken_message(self.port, self.cfg.host, holders, setting=setting))
            time.sleep(0.5)

    def _write_record(self) -> None:
        assert self._proc is not None
        keeper = procs.identity(self._proc.pid)
        owner = procs.identity(os.getpid())
        if keeper is None or owner is None:  # the keeper already exited: _wait_healthy says why
            return
        children = [p for p in procs.descendants(keeper.pid) if procs.parent(p) == keeper.pid]
        server = procs.identity(children[0]) if children else None
        record = ServerRecord(
            host=socket.gethostname(),
            port=self.port,
            url=self.url,
            pgid=self._proc.pgid,
            keeper=keeper,
            server=server,
            owner=owner,
            flow_run_id=self.base_env.get(FLOW_RUN_ENV),
            started_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            log=str(self.log_path.resolve()),
        )
        write_record(self.record_path, record)

    def _wait_healthy(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not self.attached and self._proc is not None and self._proc.poll() is not None:
                tail = self.log_tail()
                cause = last_exception(self._launch_log())
                raise ServerError(
                    f"SGLang exited with code {self._proc.returncode} while starting"
                    + (f": {cause}" if cause else "")
                    + f"; log {self.log_path}, its last lines:\n{tail}"
                )
            if not self.attached and BIND_FAILED in self._launch_log():
                self._port_lost()
            if self.healthy(timeout_s=5.0):
                return
            time.sleep(0.25)  # refused or 503 until it is up: cheap to ask, and every start waits on this
        where = f"log {self.log_path}:\n{self.log_tail()}" if not self.attached else f"url {self.url}"
        raise ServerError(f"SGLang did not answer /health within {timeout_s:.0f}s (server.startup_timeout_s); {where}")

    def _launch_log(self) -> str:
        """What this launch wrote to the log so far (its last 64 KiB): not an earlier launch's lines."""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(max(self._launch_offset, f.seek(0, 2) - 64 * 1024))
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    def _port_lost(self) -> None:
        """SGLang's HTTP server could not listen: a process took the port between _check_port and the bind.
        SGLang itself would only notice 120 s later (its warm-up gives up, then it SIGKILLs itself, exit 137)."""
        holders = procs.port_holders(self.port) or [(None, "a process that has let it go since")]
        setting = "server.port (server.servers[].port for one of several servers)"
        raise ServerError(
            "SGLang could not bind its port: it was free when this run checked it, then taken before SGLang "
            f"listened. {port_taken_message(self.port, self.cfg.host, holders, setting=setting)} Log {self.log_path}."
        )

    def _server_info(self) -> dict[str, Any]:
        try:
            r = httpx.get(f"{self.url}/server_info", timeout=30.0)
            r.raise_for_status()
            info: dict[str, Any] = r.json()
            return info
        except (httpx.HTTPError, ValueError) as e:
            raise ServerError(f"{self.url}/server_info failed: {e}") from None

    def _check_hook(self) -> None:
        """The hook reported from a worker, with the layers we asked for and a writer on."""
        assert self.dump_dir is not None
        statuses = proto.read_statuses(self.dump_dir)
        problems = [s.get("problem") for s in statuses if s.get("problem")]
        workers = [s for s in statuses if s.get("status") == "worker"]
        where = f"(hook reports in {proto.status_dir(self.dump_dir)}; SGLang log {self.log_path})"
        if problems:
            raise ServerError(f"the eagle3 hook refused: {problems[0]} {where}\n{self.log_tail(20)}")
        if not workers:
            raise ServerError(
                f"SGLang at {self.url} is up but the eagle3 hook never reported from a worker: is the plugin "
                f"installed in {self.cfg.python}'s environment (deploy/sglang_env.sh) and was the server started "
                f"with {proto.ENV_DUMP_DIR}={self.dump_dir}? {where}"
            )
        if not any(w.get("writes") for w in workers):
            raise ServerError(f"no worker writes dumps (no attention-TP rank 0 reported) {where}")
        if self.version not in proto.SUPPORTED_SGLANG:
            raise ServerError(
                f"SGLang {self.version} at {self.url}; the hook supports {', '.join(proto.SUPPORTED_SGLANG)}"
            )

    def _check_attached(self) -> None:
        info = self._server_info()
        self.version = info.get("version")
        want_ids = self.layers.layer_ids if self.layers is not None else None
        bad = []
        if not info.get("disable_radix_cache") and not self.cfg.prefix_cache:
            bad.append("--disable-radix-cache is off (or set server.prefix_cache: extraction requests are salted)")
        if not info.get("enable_return_aux_hidden_states"):
            bad.append("--enable-return-aux-hidden-states is off")
        if info.get("enable_two_batch_overlap"):
            bad.append(f"--enable-two-batch-overlap is on ({CAPTURE_SKIPPING_FLAGS['--enable-two-batch-overlap']})")
        if want_ids is not None and info.get("return_aux_hidden_state_layer_ids") != want_ids:
            bad.append(f"layer ids {info.get('return_aux_hidden_state_layer_ids')}, this run needs {want_ids}")
        if bad:
            raise ServerError(f"the server at {self.url} is not launched for extraction: {'; '.join(bad)}")
        if self.layers is not None:
            self._check_hook()


class _LogFollower:
    """Feeds each new line of the server log to a callback (a Prefect task streams it to its logger)."""

    def __init__(self, path: Path, on_line: LineFn, offset: int, poll_s: float = 0.5):
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(path, on_line, offset, poll_s), daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def _run(self, path: Path, on_line: LineFn, offset: int, poll_s: float) -> None:
        with open(path, "rb") as f:
            f.seek(offset)
            buf = b""
            while True:
                chunk = f.read(1 << 16)
                if chunk:
                    buf += chunk
                    *lines, buf = buf.split(b"\n")
                    for line in lines:
                        on_line(line.decode(errors="replace")[:2000])
                    continue
                if self._stop.wait(poll_s):
                    return
