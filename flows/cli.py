"""The `eagle3` command: parse, build, run, close. No pipeline logic lives here.

    eagle3 run CONFIG [--stages a,b,c] [--set key.sub=value ...]   the pipeline flow on the Prefect server
    eagle3 status RUN_DIR                                         shards, failed shards, lock holder, run.json facts
    eagle3 verify RUN_DIR [--quick] [--shards 0,3]                recheck sample files; exit 1 when bad ones were found
    eagle3 retry RUN_DIR [--shards 3,7]                           the retry-failed flow on the Prefect server
    eagle3 doctor [CONFIG] [--set ...] [--no-launch]              is this node ready to extract with SGLang?
    eagle3 model demo | MODEL_DIR                                 install/check a model, print its path
    eagle3 model tiny ARCH                                        a tiny random-weight target (docs/models.md)
    eagle3 config show [CONFIG] [--set ...]                       the effective config as YAML

The environment is read here and only here: Prefect's settings pick the server that `run` and `retry` report to
(PREFECT_API_URL, else, in the project directory, the project profile that the local server's start wrote:
prefect.toml); `doctor` passes the environment to the server it launches.
Prefect and the flows are imported inside the commands that use them, so the library's commands (status, verify,
doctor, model, config) run without importing Prefect. The console script `eagle3` (pyproject.toml) is this module's
`main`; it sits in flows/ because its commands run flows, and eagle3/ never imports flows/.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from eagle3.config import STAGES, ConfigError, PipelineConfig, config_to_yaml, load_config, run_dir_placeholders
from eagle3.progress import Progress, ProgressFn

if TYPE_CHECKING:
    from rich.console import Console

    from eagle3.store.run_store import RunStore

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2  # verify: 1 = bad files found, 2 = could not verify
SERVER_HINT = (
    "start the project's local server with `make serve` (or `make serve-prefect`): commands run in the project "
    "directory then reach it with nothing exported (prefect.toml); from another directory, "
    "`source <project>/deploy/env.sh` first, or export PREFECT_API_URL=<a server's /api URL>"
)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="eagle3", description="EAGLE-3 draft training data from a target model.")
    sub = p.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run the pipeline flow (prepare -> [synthesize] -> extract -> ...)")
    run.add_argument("config", type=Path, help="YAML config (see configs/demo.yaml)")
    _add_overrides(run)

    status = sub.add_parser("status", help="show the shards, failed shards, lock holder and run.json facts")
    status.add_argument("run_dir", type=Path)

    verify = sub.add_parser("verify", help="recheck every sample file; quarantine bad ones; exit 1 if any")
    verify.add_argument("run_dir", type=Path)
    verify.add_argument("--quick", action="store_true", help="headers, shapes and sizes only (no values, no checksum)")
    verify.add_argument("--shards", type=shard_list, help="comma-separated shard ids (default: all)")

    retry = sub.add_parser("retry", help="run the retry-failed flow: redo failed/partial shards, only missing samples")
    retry.add_argument("run_dir", type=Path)
    retry.add_argument("--shards", type=shard_list, help="comma-separated shard ids (default: failed and partial)")

    doctor = sub.add_parser("doctor", help="check this node for SGLang extraction (environment, layers, disk, server)")
    doctor.add_argument("config", type=Path, nargs="?", help="YAML config (default: built-in defaults)")
    doctor.add_argument("--no-launch", action="store_true", help="skip launching the server (and the parity check)")
    _add_overrides(doctor)

    model = sub.add_parser("model", help="install (demo) or check a target model and print its directory")
    model.add_argument("name", help="`demo` (SmolLM2-135M-Instruct, installed once), `tiny` or a model directory")
    model.add_argument("arch", nargs="?", help="with `tiny`: the architecture, e.g. DeepseekV3ForCausalLM")
    model.add_argument("--data-dir", type=Path, default=Path("data"), help="where the demo model lives")

    config = sub.add_parser("config", help="config helpers")
    config_sub = config.add_subparsers(dest="config_command", required=True)
    show = config_sub.add_parser("show", help="print the effective config (file + overrides) as YAML")
    show.add_argument("config", type=Path, nargs="?", help="YAML config (default: built-in defaults)")
    _add_overrides(show)
    return p


def _add_overrides(p: argparse.ArgumentParser) -> None:
    p.add_argument("--stages", help=f"comma-separated subset of {','.join(STAGES)}, replacing `stages`")
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config key, e.g. --set data.shard_size=50 (repeatable; values are YAML)",
    )


def shard_list(text: str) -> list[int]:
    """`0,3,7` -> [0, 3, 7]."""
    try:
        shards = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected comma-separated shard ids, e.g. 0,3,7") from None
    if not shards or min(shards) < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: expected comma-separated shard ids >= 0, e.g. 0,3,7")
    return shards


def effective_config(path: Path | None, overrides: list[str], stages: str | None) -> PipelineConfig:
    items = list(overrides)
    if stages is not None:
        items.append(f"stages=[{stages}]")
    return load_config(path, items)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "run":
            return cmd_run(effective_config(args.config, args.overrides, args.stages))
        if args.command == "status":
            return cmd_status(args.run_dir)
        if args.command == "verify":
            return cmd_verify(args.run_dir, quick=args.quick, shards=args.shards)
        if args.command == "retry":
            return cmd_retry(args.run_dir, args.shards)
        if args.command == "doctor":
            return cmd_doctor(effective_config(args.config, args.overrides, args.stages), launch=not args.no_launch)
        if args.command == "model":
            return cmd_model(args.name, args.data_dir, args.arch)
        if args.command == "config":
            print(config_to_yaml(effective_config(args.config, args.overrides, args.stages)), end="")
            return EXIT_OK
    except ConfigError as e:
        print(f"eagle3: {e}", file=sys.stderr)
        return EXIT_USAGE
    raise AssertionError(f"unhandled command {args.command}")


# run -------------------------------------------------------------------------------------------
def prefect_api_url() -> str | None:
    from prefect.settings import get_current_settings

    return get_current_settings().api.url


def check_server(api_url: str | None) -> str | None:
    """None when the Prefect API answers, else what is wrong and how to fix it."""
    if not api_url:
        return f"PREFECT_API_URL is not set and no project profile names a server; {SERVER_HINT}"
    import httpx

    try:
        httpx.get(f"{api_url.rstrip('/')}/health", timeout=5.0).raise_for_status()
    except httpx.HTTPError as e:
        return f"the Prefect server at {api_url} does not answer ({e}); {SERVER_HINT}"
    return None


def cmd_run(cfg: PipelineConfig) -> int:
    api_url = prefect_api_url()
    problem = check_server(api_url)
    if problem:
        print(f"eagle3: {problem}", file=sys.stderr)
        return EXIT_USAGE
    from flows.pipeline import pipeline

    store = Path(cfg.run_dir).resolve()
    print(f"eagle3: stages {' -> '.join(cfg.stages)}; store {store}; Prefect {api_url}", flush=True)
    state = pipeline(cfg, return_state=True)
    result = state.result() if run_dir_placeholders(cfg.run_dir) and state.is_completed() else None
    if isinstance(result, str):  # a run_dir template: the flow returns the run directory it filled in
        return report_flow_state(state, Path(result).resolve(), result)
    return report_flow_state(state, store, cfg.run_dir)


def report_flow_state(state: Any, store: Path, run_dir: str | Path) -> int:
    """Print where the store and the flow run are, and the result; the exit code."""
    from prefect.settings import get_current_settings

    ui = get_current_settings().ui_url
    run_id = state.state_details.flow_run_id
    if store.is_dir():
        print(f"\nstore:  {store}   (inspect: eagle3 status {run_dir})")
    else:  # failed before its first write: nothing there to inspect
        print(f"\nstore:  none written (the run stopped before it created {store})")
    if ui and run_id:
        print(f"UI:     {ui.rstrip('/')}/runs/flow-run/{run_id}")
    if state.is_completed():
        print(f"result: {state.name}")
        return EXIT_OK
    print(f"result: {state.name}: {state.message}", file=sys.stderr)
    return EXIT_FAILED


# retry -----------------------------------------------------------------------------------------
def cmd_retry(run_dir: Path, shards: list[int] | None) -> int:
    from eagle3.store.nearby import StoreMissingError, require_store

    try:
        require_store(run_dir, "nothing to retry")
    except StoreMissingError as e:
        print(f"eagle3: {e}", file=sys.stderr)
        return EXIT_USAGE
    api_url = prefect_api_url()
    problem = check_server(api_url)
    if problem:
        print(f"eagle3: {problem}", file=sys.stderr)
        return EXIT_USAGE
    from flows.retry import retry_failed_flow

    store = run_dir.resolve()
    which = f"shards {shards}" if shards is not None else "failed and partial shards"
    print(f"eagle3: retry-failed on {store} ({which}); Prefect {api_url}", flush=True)
    state = retry_failed_flow(str(store), tuple(shards or ()), return_state=True)
    return report_flow_state(state, store, run_dir)


# verify ----------------------------------------------------------------------------------------
VERIFY_TABLE_WIDTH = 1000  # off a terminal: wide enough for a sample id and its first problem on one line


def cmd_verify(run_dir: Path, *, quick: bool, shards: list[int] | None) -> int:
    from rich.console import Console
    from rich.table import Table

    from eagle3.store.lock import RunLockedError
    from eagle3.store.nearby import StoreMissingError
    from eagle3.store.run_store import RunStore
    from eagle3.store.verify import VerifyError, verify_run

    # Off a terminal (a pipe, a log, CI) rich would cut the table at 80 columns: there every row is one whole line.
    console = Console() if sys.stdout.isatty() else Console(width=VERIFY_TABLE_WIDTH)
    try:
        progress = progress_printer(Console(stderr=True))
        report = verify_run(RunStore(run_dir), full=not quick, shards=shards, report=progress)
    except (VerifyError, StoreMissingError, RunLockedError) as e:
        print(f"eagle3: {e}", file=sys.stderr)
        return EXIT_USAGE
    rows = [s.row() for s in report.shards]
    table = Table()
    for name in rows[0].keys() if rows else ["shard"]:
        table.add_column(name, overflow="fold")  # on a terminal a long first problem wraps, never cut
    for r in rows:
        style = "red" if r["bad"] else ("yellow" if r["missing"] or r["orphans"] else None)
        table.add_row(*(f"{v:05d}" if k == "shard" else str(v) for k, v in r.items()), style=style)
    console.print(table)
    # Every bad sample in full, one per line, as plain text: a table off a terminal is cut at 80 columns.
    for shard, sample_id, reason in report.bad_samples():
        print(f"bad sample {sample_id} (shard {shard:05d}): {reason}", flush=True)
    console.print(report.summary(), style="red" if report.bad_count else None, soft_wrap=True)
    return EXIT_FAILED if report.bad_count > 0 else EXIT_OK


def progress_printer(console: Console, every_s: float = 5.0) -> ProgressFn:
    """A ProgressFn printing one line every `every_s` seconds and at the end (long verifies on big stores)."""
    last = [0.0]

    def report(p: Progress) -> None:
        now = time.monotonic()
        if now - last[0] >= every_s or p.done >= p.total:
            last[0] = now
            console.print(p.describe())

    return report


# doctor ----------------------------------------------------------------------------------------
def cmd_doctor(cfg: PipelineConfig, *, launch: bool) -> int:
    from eagle3.checks.doctor import run_doctor

    report = run_doctor(cfg, base_env=dict(os.environ), launch=launch)
    print(report.render())
    return EXIT_OK if report.ok else EXIT_FAILED


# status ----------------------------------------------------------------------------------------
def cmd_status(run_dir: Path) -> int:
    from rich.console import Console
    from rich.table import Table

    from eagle3.store.run_store import RunStore

    store = RunStore(run_dir)
    info, prepared = store.read_run_info(), store.read_prepared_manifest()
    console = Console()
    if info is None and prepared is None:
        print(f"eagle3: {run_dir} is not a run directory (no run.json, no prepared/manifest.json)", file=sys.stderr)
        return EXIT_FAILED
    console.print(f"[bold]{store.root.resolve()}[/bold]")
    print_lock(console, run_dir)
    if info is not None:
        console.print(
            f"model {info.model_path} (sha256 {info.model_sha256[:12]}), {info.num_layers} layers, "
            f"hidden {info.hidden_size}, {info.dtype}\n"
            f"engine {info.engine} {info.engine_version}; aux layers (HF) {info.aux_layers}, engine ids "
            f"{info.engine_layer_ids} ({info.engine_layer_convention}); dataset {info.dataset_fingerprint[:12]}; "
            f"created {info.created_at}"
        )
    else:
        console.print("run.json: not written yet (extraction has not started)")
    if prepared is None:
        console.print("prepared data: none")
        return EXIT_OK
    console.print(
        f"prepared: {prepared.num_samples} samples, {prepared.num_tokens} tokens in {len(prepared.shards)} shards; "
        f"{len(prepared.bad_rows)} bad rows"
    )
    table = Table("shard", "status", "samples", "tokens", "GB", "errors", "first error")
    done = tokens = size = 0
    for m in store.manifests():
        done, tokens, size = done + len(m.samples), tokens + m.tokens, size + m.bytes
        first = next(iter(m.errors.items()), None)
        table.add_row(
            f"{m.shard:05d}",
            _styled_status(m.status),
            f"{len(m.samples)}/{m.expected}",
            str(m.tokens),
            f"{m.bytes / 1e9:.3f}",
            str(len(m.errors)),
            f"{first[0]}: {first[1]}"[:80] if first else "",
        )
    table.add_section()
    table.add_row("total", "", f"{done}/{prepared.num_samples}", str(tokens), f"{size / 1e9:.3f}", "", "")
    console.print(table)
    print_failed_shards(console, store, run_dir)
    return EXIT_OK


def print_lock(console: Console, run_dir: Path) -> None:
    from eagle3.store.lock import live_leases, lock_state

    state = lock_state(run_dir)
    console.print(f"lock: {state.describe()}" if state else "lock: free (no run holds this directory)")
    for path, lease in live_leases(run_dir):  # shards being extracted right now, by whom (docs/multinode.md)
        console.print(f"lease {path.stem}: {lease.describe()}")


def print_failed_shards(console: Console, store: RunStore, run_dir: Path) -> None:
    from rich.table import Table

    from eagle3.store.failed_shards import failed_shards

    failed = failed_shards(store)
    if not failed:
        console.print("failed shards: none")
        return
    table = Table("shard", "status", "done", "failed samples", "first error", "log", title="failed shards")
    for f in failed:
        row = f.row()
        table.add_row(f"{f.shard:05d}", _styled_status(f.status), str(row["done"]), str(row["failed samples"]),
                      str(row["first error"])[:120], str(row["log"]))  # fmt: skip
    console.print(table)
    console.print(f"redo them: eagle3 retry {run_dir}   (only their missing samples)")


def _styled_status(status: str) -> str:
    color = {"complete": "green", "partial": "yellow", "failed": "red", "running": "cyan"}.get(status, "dim")
    return f"[{color}]{status}[/{color}]"


# model -----------------------------------------------------------------------------------------
def cmd_model(name: str, data_dir: Path, arch: str | None = None) -> int:
    from eagle3.target.demo import resolve_model
    from eagle3.target.families import TESTED_ARCHITECTURES
    from eagle3.target.files import ModelError

    try:
        if name == "tiny":
            from eagle3.target.tiny import ensure_tiny_model

            if arch is None:
                raise ModelError(f"eagle3 model tiny ARCH: one of {', '.join(TESTED_ARCHITECTURES)}")
            print(ensure_tiny_model(data_dir, arch).resolve())
            return EXIT_OK
        print(resolve_model(name, data_dir).resolve())
    except ModelError as e:
        print(f"eagle3: {e}", file=sys.stderr)
        return EXIT_FAILED
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
