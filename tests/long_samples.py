"""One long agentic conversation through prepare -> extract (transformers engine) -> convert -> train -> export on the
tiny Qwen3 (a copy with a longer context and a Qwen3-style tool template), with the memory peak of extraction and of
training each measured in its own process. Shared by tests/integration/test_long_context.py (8.5K tokens, in CI) and
bench/long_context_bench.py (2K to 32K tokens, the figures in docs/performance.md)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eagle3.config import PipelineConfig
from eagle3.convert import convert
from eagle3.data.prepare import prepare
from eagle3.draft.checkpoint import resolve_checkpoint
from eagle3.release.export import export_draft
from eagle3.store.run_store import RunStore
from eagle3.train.job import TrainJob, write_job

REPO = Path(__file__).resolve().parents[1]
QWEN3_TOOLS = REPO / "tests" / "assets" / "qwen3_tools_template.jinja"
BATCH_TOKENS = 1024  # train.batch_tokens: the long sample is longer, so it is trained whole in a longer step

#: Each child prints its peak resident memory once its model is built and at the end. glibc's mmap threshold is pinned
#: so that freed blocks leave the resident set (with the dynamic threshold freed blocks stay in the heap, and the peak
#: measures the allocation pattern), and one intra-op thread keeps the figures comparable on a shared machine.
CHILD_ENV = {
    "PYTHONPATH": str(REPO),
    "OMP_NUM_THREADS": "1",
    "PATH": "/usr/bin:/bin",
    "MALLOC_MMAP_THRESHOLD_": "131072",
}
#: `built()` resets the kernel's peak (VmHWM, by /proc/self/clear_refs) and returns the resident memory then, so the
#: peak at the end is the work's own, not a transient of loading the model or importing torch.
PEAK = """import json, re
def kb(key): return int(re.search(key + r":\\s+(\\d+) kB", open("/proc/self/status").read()).group(1))
def built():
    open("/proc/self/clear_refs", "w").write("5")
    return kb("VmRSS")
def peak(): return kb("VmHWM")
"""
TRAIN_SCRIPT = (
    PEAK
    + """import sys
from eagle3.train.job import read_job
from eagle3.train.trainer import Trainer
with Trainer.build(read_job(sys.argv[1])) as t:
    base = built()
    t.run()
print(json.dumps({"built_kb": base, "peak_kb": peak()}))
"""
)
EXTRACT_SCRIPT = (
    PEAK
    + """import sys
from pathlib import Path
from eagle3.config import PipelineConfig
from eagle3.extract.engines import build_engine
from eagle3.extract.shard import extract_shard, open_run
from eagle3.store.run_store import RunStore
cfg = PipelineConfig.model_validate_json(Path(sys.argv[1]).read_text())
store, model = RunStore(cfg.run_dir), Path(cfg.model)
engine = build_engine(cfg, model)
engine.base_model()
base = built()
status = extract_shard(store, 0, engine, open_run(cfg, store, model, engine.info)).status
print(json.dumps({"built_kb": base, "peak_kb": peak(), "status": status}))
"""
)


def long_conversation(turns: int) -> dict[str, Any]:
    """A user request, then `turns` rounds of a call, a long tool result and a short answer (about 1,400 tokens a
    round on the tiny Qwen3's tokenizer)."""
    read_log = {"type": "function", "function": {"name": "read_log", "parameters": {"type": "object"}}}
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Summarise the build logs, part by part."}]
    for t in range(turns):
        log = "\n".join(f"[{t:02d}:{i:03d}] step {i} of part {t} finished in {i * 7 % 13} s" for i in range(60))
        messages += [
            {"role": "assistant", "content": "", "tool_calls": [
                {"function": {"name": "read_log", "arguments": {"part": t}}}]},
            {"role": "tool", "content": log},
            {"role": "assistant", "content": f"Part {t}: 60 steps, all finished."},
        ]  # fmt: skip
    return {"tools": [read_log], "messages": messages}


def target_with_context(tiny_qwen3: Path, out: Path, context: int) -> Path:
    """A copy of the tiny Qwen3 whose max_position_embeddings is `context` (the tiny targets have 2,048)."""
    shutil.copytree(tiny_qwen3, out)
    config = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**config, "max_position_embeddings": context}))
    return out


@dataclass(frozen=True)
class LongRun:
    tokens: int  # the long sample's length
    trained: int  # the most tokens one training step took (== tokens: trained whole)
    extract_mb: float  # extraction's peak resident memory above the engine with its model loaded
    train_mb: float  # training's peak above the built trainer
    max_position_embeddings: int  # the exported draft's
    seconds: dict[str, float]  # per stage, wall clock


def child(script: str, arg: Path) -> dict[str, Any]:
    done = subprocess.run([sys.executable, "-c", script, str(arg)], capture_output=True, text=True, env=CHILD_ENV,
                          timeout=3600, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    out: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return out


def run_long_sample(model: Path, work: Path, turns: int) -> LongRun:
    """The conversation of `turns` rounds and four short ones through every stage under `work`, on `model` (a
    target_with_context copy)."""
    rows = work / "rows.jsonl"
    short = [{"messages": [{"role": "user", "content": f"Say {w}."}, {"role": "assistant", "content": f"{w}."}]}
             for w in ("one", "two", "three", "four")]  # fmt: skip
    rows.write_text("".join(json.dumps(r) + "\n" for r in [long_conversation(turns), *short]))
    cfg = PipelineConfig.model_validate(
        {
            "run_dir": str(work / "run"),
            "model": str(model),
            "data_dir": str(REPO / "data"),
            "data": {"dataset": str(rows), "max_length": 1 << 20, "chat_template": str(QWEN3_TOOLS)},
            "server": {"engine": "transformers", "device": "cpu", "batch_tokens": 4096},
            "train": {"draft_vocab_size": 64, "max_steps": 2, "batch_tokens": BATCH_TOKENS, "ttt_steps": 2,
                      "warmup_steps": 1, "log_every": 1, "checkpoint_every": 2, "precision": "fp32",
                      "device": "cpu", "loader_threads": 1, "target_chunk_tokens": 512},
        }
    )  # fmt: skip
    store = RunStore(cfg.run_dir)
    seconds: dict[str, float] = {}
    t0 = time.perf_counter()
    prepared = prepare(cfg, store, model)
    assert prepared.num_samples == 5 and not prepared.bad_rows, prepared.bad_rows
    tokens = max(len(s) for s in store.prepared_samples(0))
    seconds["prepare"] = (t1 := time.perf_counter()) - t0

    (work / "cfg.json").write_text(cfg.model_dump_json())
    extracted = child(EXTRACT_SCRIPT, work / "cfg.json")
    assert extracted["status"] == "complete", extracted
    seconds["extract"] = (t2 := time.perf_counter()) - t1
    assert convert(cfg, store).num_samples == 5
    seconds["convert"] = (t3 := time.perf_counter()) - t2

    out = work / "train"
    job = TrainJob(train=cfg.train, run_dir=cfg.run_dir, model_dir=str(model), out_dir=str(out), device="cpu")
    write_job(work / "job.json", job)
    trained = child(TRAIN_SCRIPT, work / "job.json")
    seconds["train"] = (t4 := time.perf_counter()) - t3
    steps = [json.loads(line) for line in (out / "metrics.jsonl").open() if '"tokens"' in line]
    export = export_draft(resolve_checkpoint(out / "checkpoints"), Path(cfg.run_dir), model, work / "export")
    draft = json.loads((Path(export.out_dir) / "config.json").read_text())
    seconds["export"] = time.perf_counter() - t4
    return LongRun(
        tokens=tokens,
        trained=max(s["tokens"] for s in steps),
        extract_mb=(extracted["peak_kb"] - extracted["built_kb"]) / 1024,
        train_mb=(trained["peak_kb"] - trained["built_kb"]) / 1024,
        max_position_embeddings=draft["max_position_embeddings"],
        seconds=seconds,
    )
