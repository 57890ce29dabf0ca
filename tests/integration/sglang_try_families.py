"""Try SGLang 0.5.23 on CPU with tiny targets that CI does not start (test_architectures_sglang.py
SGLANG_SOURCE_ONLY): for each architecture named, start the server with the SGLang tests' settings (five aux layers),
extract the four prepared samples through the hook, and compare with the transformers engine in bf16 at the same
layers. Prints one `RESULT` line per architecture: the start-up error's line, or the worst token's relative error,
the largest per-sample median, and the smallest median against the next captured layer (one layer off, for contrast).

    .venv/bin/python tests/integration/sglang_try_families.py DeepseekV2ForCausalLM ApertusForCausalLM

A measuring tool, not a test: docs/models.md ("SGLang verdicts") quotes its lines. Runs under /tmp/eagle3-try-<arch>.
"""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))


def try_family(arch: str) -> str:
    from eagle3.data.prepare import prepare
    from eagle3.extract.engines.base import Captured
    from eagle3.extract.engines.sglang_engine import SGLangEngine
    from eagle3.extract.engines.transformers_engine import TransformersEngine
    from eagle3.extract.shard import extract_shard, open_run
    from eagle3.serving.server import ServerError
    from eagle3.store.run_store import RunStore
    from eagle3.target.tiny import ensure_tiny_model
    from tests.integration.sglang_support import start_server, token_errors
    from tests.integration.test_architectures import QUESTIONS
    from tests.integration.test_architectures_sglang import sglang_pipeline_config

    start = time.monotonic()
    root = Path(f"/tmp/eagle3-try-{arch}")
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    model = ensure_tiny_model(REPO / "data", arch)
    cfg = sglang_pipeline_config(root, model, arch)
    store = RunStore(cfg.run_dir)
    prepare(cfg, store, model)
    try:
        server = start_server(cfg, model, root / "dump")
    except ServerError as e:
        return f"does not start: {str(e).splitlines()[0][:300]}"
    try:
        engine = SGLangEngine(cfg, model, "try", root / "dump", server=server)
        info = open_run(cfg, store, model, engine.info)
        shards = range(len(QUESTIONS) // 2)
        for shard in shards:
            extract_shard(store, shard, engine, info)
    finally:
        server.stop()
    samples = [s for shard in shards for s in store.prepared_samples(shard)]
    ref = TransformersEngine(model, device="cpu", dtype="bfloat16", aux_layers=info.aux_layers)
    hf = {o.sample.sample_id: o for o in ref.extract(samples) if isinstance(o, Captured)}
    worst, median, off = 0.0, 0.0, float("inf")
    for shard in shards:
        for s in store.prepared_samples(shard):
            got, want = store.open_sample(shard, s.sample_id), hf[s.sample_id]
            pairs = [(got.aux_hidden_states[:, k], want.aux_hidden_states[:, k]) for k in range(len(info.aux_layers))]
            for a, b in [*pairs, (got.last_hidden_state, want.last_hidden_state)]:
                e = token_errors(a, b)
                worst, median = max(worst, float(e.max())), max(median, float(e.median()))
            for k in range(len(info.aux_layers) - 1):
                e = token_errors(got.aux_hidden_states[:, k], want.aux_hidden_states[:, k + 1])
                off = min(off, float(e.median()))
    return (
        f"captured HF {info.aux_layers} (SGLang ids {info.engine_layer_ids}); vs transformers: worst token "
        f"{worst:.4f}, largest median {median:.4f}; one layer off: smallest median {off:.3f} "
        f"({time.monotonic() - start:.0f} s)"
    )


if __name__ == "__main__":
    import torch

    torch.set_num_threads(1)
    for name in sys.argv[1:]:
        print(f"RESULT {name}: {try_family(name)}", flush=True)
