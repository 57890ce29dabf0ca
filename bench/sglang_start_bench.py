"""What an SGLang start costs on CPU, with its children spawned (SGLang's own choice) or forked
(EAGLE3_CPU_FORK=1, server_patch/cpu_fork.py, what every CPU launch of ours sets).

    python3 bench/sglang_start_bench.py [--rounds 3] [--model DIR]

Each round launches the demo model's server both ways, alternating (the box is shared and noisy: compare ratios
within one run), with the command line and environment of eagle3.serving.server (build_command, build_env; no
capture), and measures the wall seconds from launch to a 200 on /health and the CPU seconds its processes used
by then (user + system of every process in its session, read from /proc just before it is killed). Then one
greedy request of 8 tokens: both ways must answer the same tokens. Prints a table; needs .venv-sglang.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx

from eagle3.config import ServerConfig
from eagle3.serving.server import build_command, build_env
from eagle3.store import dump_protocol as proto
from eagle3.target.demo import ensure_demo_model
from tests.ports import free_port

REPO = Path(__file__).resolve().parents[1]
TICKS = os.sysconf("SC_CLK_TCK")


def session_cpu_s(sid: int) -> float:
    """User + system CPU seconds of the live processes whose session is `sid`."""
    total = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == sid:  # stat field 6 (session), after the name
            total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / TICKS


def start_once(model: Path, fork: bool) -> tuple[float, float, list[int]]:
    server = ServerConfig(engine="sglang", device="cpu", python=str(REPO / ".venv-sglang/bin/python"),
                          max_total_tokens=16384)  # fmt: skip
    port = free_port()
    argv = build_command(server, model, None, port=port, device="cpu")
    env = build_env(server, os.environ, device="cpu", dump_dir=None, aux_layers=None)
    if not fork:
        env.pop(proto.ENV_CPU_FORK)
    log = Path(f"/tmp/sglang-start-{port}.log")
    t0 = time.perf_counter()
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        while True:
            if proc.poll() is not None:
                raise SystemExit(f"the server exited ({proc.returncode}); log: {log}")
            try:
                if httpx.get(f"{url}/health", timeout=1.0).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        wall = time.perf_counter() - t0
        cpu = session_cpu_s(proc.pid)
        body = {"input_ids": [1, 2, 3, 4, 5], "sampling_params": {"max_new_tokens": 8, "temperature": 0}}
        tokens = httpx.post(f"{url}/generate", json=body, timeout=60).json()["output_ids"]
        return wall, cpu, tokens
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--model", type=Path, default=None, help="model directory (default: the demo model)")
    args = ap.parse_args()
    model = args.model or ensure_demo_model(REPO / "data")
    runs: dict[str, list[tuple[float, float, list[int]]]] = {"spawn": [], "fork": []}
    for r in range(args.rounds):
        for name in ("spawn", "fork"):
            runs[name].append(start_once(model, fork=name == "fork"))
            wall, cpu, _ = runs[name][-1]
            print(f"round {r + 1} {name:5s} wall {wall:5.1f} s  cpu {cpu:5.1f} s", flush=True)
    answers = {tuple(t) for v in runs.values() for _, _, t in v}
    print("\n| children | starts | to /health, median (min-max) | CPU s, median (min-max) | same tokens |")
    print("|---|---:|---|---|---|")
    for name, v in runs.items():
        walls, cpus = [w for w, _, _ in v], [c for _, c, _ in v]
        print(f"| {name} | {len(v)} | {statistics.median(walls):.1f} s ({min(walls):.1f}-{max(walls):.1f}) | "
              f"{statistics.median(cpus):.1f} ({min(cpus):.1f}-{max(cpus):.1f}) | {len(answers) == 1} |")  # fmt: skip


if __name__ == "__main__":
    main()
