"""The cost of an intake into a big finished store, as a ratio to extracting the new samples alone.

    intake   a 10,000-sample store (folder of traffic, prepared and extracted) receives a file of 100 new
             conversations (1%): prepare (an intake: fingerprints every source file, reads only the new one,
             reads the old shards' sample ids) + open_run + every shard as the extract flow sees it (old shards:
             the skip check; the new shard: extracted)
    alone    the same 100 conversations into an empty store: prepare + open_run + extract

ratio = intake / alone (target <= 1.2: the old store is not read beyond its manifests, prepared ids and file
headers). Both run the real code path (eagle3.data.prepare, eagle3.extract.shard, the transformers engine writing real
sample files) on a synthetic target with a tiny hidden size (random Llama, H=64, 4 layers, the demo model's
tokenizer and chat template), so that a 10,000-sample store fits a laptop: with a real target, extracting the
100 new samples costs far more and the ratio is closer to 1. The engine is built once, outside the timings
(a flow run loads it either way). Repeats alternate intake and alone; each intake adds a new file.

    .venv/bin/python bench/intake_bench.py --store-samples 10000 --new-samples 100 --repeats 3
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import torch

from eagle3.config import PipelineConfig
from eagle3.data.prepare import prepare
from eagle3.extract.engines.transformers_engine import TransformersEngine
from eagle3.extract.shard import extract_shard, open_run, shard_is_complete
from eagle3.store.run_store import RunStore
from eagle3.target.demo import resolve_model
from eagle3.target.files import TOKENIZER_FILES

AUX = [1, 2, 3]


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--store-samples", type=int, default=10_000)
    p.add_argument("--new-samples", type=int, default=100)
    p.add_argument("--shard-size", type=int, default=2000)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--data-dir", default="data", help="where the demo model (its tokenizer) is installed")
    p.add_argument("--work-dir", default="data/runs/bench-intake", help="stores go here (the filesystem under test)")
    return p.parse_args()


def tiny_target(out: Path, tokenizer_from: Path) -> Path:
    """A random Llama with H=64 and 4 layers, the demo model's tokenizer files and vocabulary size."""
    from transformers import LlamaConfig, LlamaForCausalLM

    vocab = json.loads((tokenizer_from / "config.json").read_text())["vocab_size"]
    cfg = LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=vocab,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    LlamaForCausalLM(cfg).to(torch.bfloat16).save_pretrained(out)
    for name in TOKENIZER_FILES:
        if (tokenizer_from / name).is_file():
            shutil.copy(tokenizer_from / name, out / name)
    return out


def rows(start: int, n: int) -> str:
    convs = [
        [
            {"role": "user", "content": f"Question {i}: what is {i} plus {i % 7}?"},
            {"role": "assistant", "content": f"{i} plus {i % 7} is {i + i % 7}."},
        ]
        for i in range(start, start + n)
    ]
    return "".join(json.dumps({"messages": c}) + "\n" for c in convs)


def config(run_dir: Path, traffic: Path, model: Path, shard_size: int) -> PipelineConfig:
    return PipelineConfig.model_validate({
        "run_dir": str(run_dir), "model": str(model), "server": {"device": "cpu"},
        "data": {"dataset": str(traffic), "max_length": 128, "shard_size": shard_size},
        "extract": {"aux_layers": AUX},
    })  # fmt: skip


def run_once(cfg: PipelineConfig, model: Path, engine: TransformersEngine) -> tuple[float, int]:
    """prepare + open_run + every shard as the extract flow handles it; (seconds, samples extracted)."""
    t0 = time.perf_counter()
    store = RunStore(cfg.run_dir)
    prepare(cfg, store, model)
    info = open_run(cfg, store, model, engine.info)
    extracted = 0
    for shard in range(store.num_shards()):
        if shard_is_complete(store, shard, info):
            continue
        m = extract_shard(store, shard, engine, info)
        assert m.status == "complete", m.errors
        extracted += len(m.samples)
    return time.perf_counter() - t0, extracted


def main() -> None:
    args = parse_args()
    torch.set_num_threads(1)
    work = Path(args.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=work))
    try:
        model = tiny_target(tmp / "target", resolve_model("demo", Path(args.data_dir)))
        engine = TransformersEngine(model, aux_layers=AUX, device="cpu", dtype="bfloat16", batch_tokens=8192)
        traffic = tmp / "traffic"
        traffic.mkdir()
        (traffic / "day-000.jsonl").write_text(rows(0, args.store_samples))
        big = config(tmp / "store", traffic, model, args.shard_size)
        t_build, n = run_once(big, model, engine)
        print(f"built a {n}-sample store in {t_build:.1f} s ({RunStore(big.run_dir).num_shards()} shards)")
        intake, alone = [], []
        start = args.store_samples
        for r in range(args.repeats):
            new = rows(start, args.new_samples)
            start += args.new_samples
            (traffic / f"day-{r + 1:03d}.jsonl").write_text(new)
            t, n = run_once(big, model, engine)
            assert n == args.new_samples, n
            intake.append(t)
            solo = tmp / f"alone-{r}"
            solo.mkdir()
            (solo / "day.jsonl").write_text(new)
            t, n = run_once(config(tmp / f"alone-store-{r}", solo, model, args.shard_size), model, engine)
            assert n == args.new_samples, n
            alone.append(t)
        mi, ma = statistics.median(intake), statistics.median(alone)
        print()
        print("| store | new | intake (s) | alone (s) | ratio |")
        print("|---:|---:|---:|---:|---:|")
        print(f"| {args.store_samples:,} | {args.new_samples} | {mi:.2f} | {ma:.2f} | {mi / ma:.2f}x |")
        print(f"\nintake runs: {[round(t, 2) for t in intake]}, alone runs: {[round(t, 2) for t in alone]}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
