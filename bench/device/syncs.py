"""Where does the engine's launch synchronise with the device? torch.cuda.set_sync_debug_mode('warn')."""
import collections, traceback, warnings, random
import torch
from eagle3.engines.transformers_engine import TransformersEngine
from eagle3.store import PreparedSample

eng = TransformersEngine("/tmp/llama1b", device="cuda", batch_tokens=16384, store_dtype="float8_e4m3")
rng = random.Random(0)
samples = [PreparedSample(f"s{i}", [rng.randrange(32000) for _ in range(rng.randint(1024, 2048))], [1], "") for i in range(24)]
list(eng.extract(samples))  # warm
seen = collections.Counter()
def hook(message, category, filename, lineno, file=None, line=None):
    stack = [f for f in traceback.extract_stack() if "site-packages" in f.filename or "eagle3" in f.filename]
    seen["\n".join(f"{f.filename.split('site-packages/')[-1]}:{f.lineno} {f.name}" for f in stack[-6:])] += 1
warnings.showwarning = hook
torch.cuda.set_sync_debug_mode("warn")
for b in eng.extract(samples):
    pass
torch.cuda.set_sync_debug_mode(0)
for k, v in seen.most_common(8):
    print(v, "x\n", k, "\n")
print("distinct sync sites:", len(seen))
