"""Where does the engine's launch synchronise with the device? torch.cuda.set_sync_debug_mode('warn') on
the FP8 engine over /tmp/llama1b (bench/device/extract.sh builds it); prints each distinct call site."""

import collections
import random
import traceback
import warnings
from typing import Any

import torch

from eagle3.extract.engines.transformers_engine import TransformersEngine
from eagle3.store.run_store import PreparedSample

eng = TransformersEngine("/tmp/llama1b", device="cuda", batch_tokens=16384, store_dtype="float8_e4m3")
rng = random.Random(0)
lengths = [rng.randint(1024, 2048) for _ in range(24)]
ids = [[rng.randrange(32000) for _ in range(n)] for n in lengths]
samples = [PreparedSample(f"s{i}", x, [1] * len(x), "") for i, x in enumerate(ids)]
list(eng.extract(samples))  # warm
seen: collections.Counter[str] = collections.Counter()


def hook(*_: Any, **__: Any) -> None:
    stack = [f for f in traceback.extract_stack() if "site-packages" in f.filename or "eagle3" in f.filename]
    seen["\n".join(f"{f.filename.split('site-packages/')[-1]}:{f.lineno} {f.name}" for f in stack[-6:])] += 1


warnings.showwarning = hook
torch.cuda.set_sync_debug_mode("warn")
for _ in eng.extract(samples):
    pass
torch.cuda.set_sync_debug_mode(0)
for site, count in seen.most_common(8):
    print(count, "x\n", site, "\n")
print("distinct sync sites:", len(seen))
