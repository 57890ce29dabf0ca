"""The run's summary (`run_summary_task`, the pipeline's last step): what each stage made and where, with
links to the stage artifacts in the UI.
"""

from __future__ import annotations

from prefect import task
from prefect.cache_policies import NO_CACHE

from eagle3.config import PipelineConfig
from eagle3.config_merge import ConfigSources
from eagle3.convert.stage import read_convert_result
from eagle3.draft.checkpoint import read_latest
from eagle3.evaluate.live import read_live_result
from eagle3.evaluate.offline import read_offline_result
from eagle3.release.export import read_export
from eagle3.release.promote import read_promotion
from eagle3.store.failed_shards import shard_summaries
from eagle3.store.paths import FIRST_METHOD
from eagle3.store.run_store import RunStore
from tasks.artifacts import STAGE_ARTIFACTS, markdown_artifact, run_key, ui_link


def summary_rows(config: PipelineConfig, store: RunStore) -> list[tuple[str, str]]:
    """(what, where/how much) rows of the run summary, from the store's own files."""
    root = store.root.resolve()
    rows = [("store", f"`{root}` (inspect: `eagle3 status {root}`)")]
    info = store.read_run_info()
    if info is not None:
        rows.append(
            ("model", f"`{info.model_path}`, {info.engine} {info.engine_version}, aux layers {info.aux_layers}")
        )
    prepared = store.read_prepared_manifest()
    if prepared is not None:
        rows.append(
            (
                "prepared",
                f"{prepared.num_samples} samples, {prepared.num_tokens} tokens in {len(prepared.shards)} shards "
                f"({len(prepared.bad_rows)} bad rows skipped)",
            )
        )
    shards = shard_summaries(store) if info is not None else []
    if shards:
        done = sum(s.done for s in shards)
        expected = sum(s.expected for s in shards)
        complete = sum(s.status == "complete" for s in shards)
        not_complete = [s.shard for s in shards if s.status != "complete"]
        rows.append(
            (
                "hidden states",
                f"{done}/{expected} samples, {complete}/{len(shards)} shards complete"
                + (f"; not complete: {not_complete}" if not_complete else ""),
            )
        )
    c = read_convert_result(store)
    if c is not None:
        rows.append(
            (
                "convert",
                f"draft vocabulary `{c.vocab_map_path}` ({c.draft_vocab_size} ids, coverage {c.coverage:.3f}), "
                f"index `{c.index_path}`",
            )
        )
    return rows + draft_rows(RunStore(root), config.train.trained_methods())


def draft_rows(store: RunStore, methods: list[str] | None = None) -> list[tuple[str, str]]:
    """Training, export, promotion and evaluation rows of each draft method (train/, draft/, eval/*.json or the
    method's own under draft/<method>/), the promotion once."""
    rows = []
    methods = methods or [FIRST_METHOD]
    for method in methods:
        paths, tag = store.method(method), f" ({method})" if len(methods) > 1 or method != FIRST_METHOD else ""
        latest = read_latest(paths.train.checkpoints_dir)
        if latest is not None:
            rows.append((f"training{tag}", f"checkpoint `{latest[1]}` (step {latest[0]})"))
        e = read_export(paths.latest)
        if e is not None:
            rows.append((f"draft{tag}", f"`{e.out_dir}` from step {e.checkpoint_step}"))
        o = read_offline_result(store.root, method)
        if o is not None:
            per_set = "; ".join(
                f"{r.set_name} ({r.set_kind}, {r.num_prompts} prompts) k={r.steps}: {r.acceptance_length:.3f}"
                for r in o.runs or [o]
            )
            modelled = f", modelled speed-up {o.modelled.speedup:.2f}x" if o.modelled is not None else ""
            text = f"tokens per verify round: {per_set}; {o.label} speed-up {o.speedup:.2f}x{modelled}"
            rows.append((f"acceptance (offline){tag}", text))
        lv = read_live_result(store.root, method)
        if lv is not None:
            rows.append((f"speed (live SGLang){tag}", f"**{lv.summary}**" if lv.flag else lv.summary))
    d = read_promotion(store.root)
    if d is not None:
        rows.append(("promotion", f"**{'promoted' if d.promoted else 'kept'}** ({d.method}): {d.reason}; serve "
                                  f"`{store.draft_current}` (-> `{d.current}`)"))  # fmt: skip
    return rows


def summary_markdown(config: PipelineConfig, store: RunStore, sources: ConfigSources | None = None) -> str:
    lines = [
        f"# Run `{store.root.resolve()}`",
        "",
        f"Stages of this flow run: {', '.join(config.stages)}",
        "",
        *(f"- {line}" for line in (sources or ConfigSources()).lines()),
        "",
        "| | |",
        "|---|---|",
        *(f"| {what} | {text} |" for what, text in summary_rows(config, store)),
        "",
        "Artifacts (history across runs of this run directory): "
        + ", ".join(ui_link(run_key(config.run_dir, k)) for s in config.stages for k in STAGE_ARTIFACTS.get(s, [])),
    ]
    return "\n".join(lines)


@task(name="run-summary", retries=1, retry_delay_seconds=2, timeout_seconds=120, cache_policy=NO_CACHE)
def run_summary_task(config: PipelineConfig, sources: ConfigSources | None = None) -> str:
    """The run's last artifact (`<run>-run-summary`): the store, which settings came from where (`sources`),
    what each stage left there and where the draft and the evaluation are; links to the stage artifacts in the
    UI. Returns the artifact key."""
    key = run_key(config.run_dir, "run-summary")
    markdown_artifact(
        key, summary_markdown(config, RunStore(config.run_dir), sources), f"Run summary of {config.run_dir}"
    )
    return key
