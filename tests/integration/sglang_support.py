"""Helpers for the tests against a real SGLang server on CPU (tests/integration/test_sglang_*.py)."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
import torch

import eagle3.data.synthesize as synth
from eagle3.config import PipelineConfig
from eagle3.draft.checkpoint import save_checkpoint
from eagle3.draft.eagle3.model import Eagle3Draft
from eagle3.draft.methods import method_named
from eagle3.draft.shape import DraftConfig
from eagle3.release.export import ExportResult, export_draft
from eagle3.serving.layers import extraction_layers
from eagle3.serving.server import SGLangServer
from eagle3.store.fsio import read_json
from eagle3.store.run_store import PREPARED_SCHEMA, PreparedManifest, PreparedSample, RunInfo, RunStore
from eagle3.target.files import model_fingerprint, read_model_facts, tokenizer_fingerprint
from tests.ports import free_port

REPO = Path(__file__).resolve().parents[2]
SGLANG_PYTHON = REPO / ".venv-sglang" / "bin" / "python"
AUX = [2, 15, 27]  # EAGLE-3's default for SmolLM2's 30 layers
SYNTH_PROMPTS = REPO / "tests" / "assets" / "synth_prompts.jsonl"  # 3 rows, one with two assistant turns
CONTEXT = 512  # the plain server's --context-length: a longer prompt is refused (HTTP 400) on every attempt

TEXTS = [
    "The capital of France is Paris.",
    "Draft models guess; the target model checks every guess in one pass.",
    # > 100 tokens: with --chunked-prefill-size 16 it reaches the hook in 8+ chunks.
    "Speculative decoding pairs a small draft model with the large target model. The draft proposes a few "
    "tokens, the target scores all of them in one forward pass, and every token it agrees with is accepted. "
    "EAGLE-3 drafts from the target's own hidden states at a low, a middle and a high layer, which is why "
    "the training data must be captured from exactly the layers the serving engine will hand to the draft. "
    "Capture the wrong layer and nothing fails loudly: the draft trains, and its acceptance rate collapses.",
    "1 2 3 4 5 6 7 8 9 10 11 12",
    "A short one.",
    "Prefect runs each shard as a task with its own retries, so a crash costs one shard at most.",
]


def require_sglang_env() -> None:
    if not SGLANG_PYTHON.exists():
        pytest.skip(f"{SGLANG_PYTHON} is absent: build it with deploy/sglang_env.sh (make test does)")


def sglang_config(run_dir: Path, model: Path, **server: Any) -> PipelineConfig:
    return PipelineConfig.model_validate(
        {
            "run_dir": str(run_dir),
            "model": str(model),
            "server": {
                "engine": "sglang",
                "device": "cpu",
                "python": str(SGLANG_PYTHON),
                "max_total_tokens": 16384,
                "startup_timeout_s": 600,
                **server,
            },
        }
    )


def synthesize_config(run_dir: Path, model: Path, dataset: Path, **synthesize: Any) -> PipelineConfig:
    """A synthesize run through SGLang; its `server` is the plain server's (tests/integration/conftest.py)."""
    return PipelineConfig.model_validate(
        {
            "run_dir": str(run_dir),
            "model": str(model),
            "data": {"dataset": str(dataset), "max_length": 2048, "shard_size": 4},
            "synthesize": {"max_new_tokens": 24, "temperature": 0.0, "concurrency": 8, **synthesize},
            "server": {
                "engine": "sglang",
                "device": "cpu",
                "python": str(SGLANG_PYTHON),
                "port": free_port(),
                "max_total_tokens": 8192,
                "max_restarts": 1,
                "extra_args": ["--context-length", str(CONTEXT)],
            },
        }
    )


def synthesized_records(store: RunStore) -> list[dict[str, Any]]:
    return [json.loads(line) for p in sorted(synth.synthesized_dir(store).glob("shard-*.jsonl")) for line in p.open()]


@contextmanager
def plain_server_at(root: Path, model: Path) -> Iterator[SGLangServer]:
    """A plain SGLang server of `model` (synthesize_config's, no hook), its run and log under `root`, stopped after."""
    require_sglang_env()
    cfg = synthesize_config(root / "run", model, SYNTH_PROMPTS)
    (server,) = synth.open_servers(cfg, model, dict(os.environ), root / "server")
    server.start()
    try:
        yield server
    finally:
        server.stop()


def start_server(cfg: PipelineConfig, model: Path, dump_dir: Path, **kw: Any) -> SGLangServer:
    layers = extraction_layers(model, cfg.extract)
    server = SGLangServer(
        cfg.server,
        model,
        dump_dir=dump_dir,
        layers=layers,
        log_dir=Path(cfg.run_dir) / "server",
        base_env=dict(os.environ),
        port=free_port(),
        **kw,
    )
    server.start()
    return server


def prepared(tokenizer: Any, texts: list[str]) -> list[PreparedSample]:
    out = []
    for i, text in enumerate(texts):
        ids = tokenizer(text).input_ids
        mask = [0] * (len(ids) // 3) + [1] * (len(ids) - len(ids) // 3)
        out.append(PreparedSample(f"t{i:03d}", ids, mask, f"test:{i}"))
    return out


def write_prepared(store: RunStore, model_dir: Path, samples: list[PreparedSample]) -> None:
    rows = [
        {"sample_id": s.sample_id, "input_ids": s.input_ids, "loss_mask": s.loss_mask, "num_tokens": len(s),
         "source": s.source, "messages": "[]"}
        for s in samples
    ]  # fmt: skip
    store.write_prepared_shard(0, pa.Table.from_pylist(rows, schema=PREPARED_SCHEMA))
    tokens = sum(len(s) for s in samples)
    store.write_prepared_manifest(
        PreparedManifest(
            dataset="test",
            dataset_fingerprint="fp-test",
            tokenizer_sha256=tokenizer_fingerprint(model_dir),
            num_samples=len(samples),
            num_tokens=tokens,
            num_loss_tokens=sum(sum(s.loss_mask) for s in samples),
            shards=[len(samples)],
            shard_tokens=[tokens],
            config={},
        )
    )


def token_errors(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """|a_t - b_t| / |b_t| for each token t (relative L2 of each token's vector), in fp32."""
    a, b = a.float(), b.float()
    return (a - b).norm(dim=-1) / b.norm(dim=-1).clamp_min(1e-6)


def assert_same_layer(
    mine: torch.Tensor, ref: torch.Tensor, what: str, *, median: float = 0.03, worst: float = 0.2
) -> float:
    """bf16 vs an fp32 reference, measured on SmolLM2: the median token is ~0.01 off; a few tokens reach
    0.05-0.15 (HF's own bf16 forward reaches 0.07 at token 1). A shifted row, a swapped sample or the
    wrong layer is off by 0.15-0.6 on the median token."""
    e = token_errors(mine, ref)
    assert float(e.median()) < median and float(e.max()) < worst, (
        f"{what}: median token {float(e.median()):.3f}, worst token {float(e.max()):.3f} at {int(e.argmax())}"
    )
    return float(e.median())


def export_random_draft(
    model: Path, root: Path, draft_vocab: int, *, o_proj_scale: float = 1.0, method: str = "eagle3"
) -> tuple[ExportResult, DraftConfig]:
    """A draft for `model` with random weights (norms around 1) and a random vocab map of `draft_vocab` ids,
    checkpointed and exported by our pipeline (export_draft) into <root>/run/draft, as SGLang serves it.
    `o_proj_scale` scales the attention output projection, so attention weighs more in the draft's proposals;
    `method` is an EAGLE-3 method (eagle3, eagle3.1: its flags)."""
    facts = read_model_facts(model)
    RunStore(root / "run").write_run_info(
        RunInfo(model_path=str(model), model_sha256=model_fingerprint(model), tokenizer_sha256="t",
                engine="transformers", engine_version="0", dtype="bfloat16", hidden_size=facts.hidden_size,
                num_layers=facts.num_layers, vocab_size=facts.vocab_size, aux_layers=AUX, engine_layer_ids=AUX,
                engine_layer_convention="hf_hidden_states", dataset_fingerprint="d", versions={}, config={})
    )  # fmt: skip
    cfg = DraftConfig.from_target(read_json(model / "config.json"), num_aux=len(AUX), draft_vocab_size=draft_vocab)
    torch.manual_seed(0)
    draft = method_named(method).build(cfg)
    assert isinstance(draft, Eagle3Draft)
    with torch.no_grad():
        for p in draft.parameters():
            if p.requires_grad:
                p.copy_(torch.randn_like(p) * 0.05 + (1.0 if p.dim() == 1 else 0.0))
        draft.midlayer.self_attn.o_proj.weight.mul_(o_proj_scale)
    used = torch.randperm(cfg.vocab_size)[:draft_vocab]
    t2d = torch.zeros(cfg.vocab_size, dtype=torch.bool)
    t2d[used] = True
    draft.set_vocab_map(used - torch.arange(draft_vocab), t2d)
    opt = torch.optim.AdamW([p for p in draft.parameters() if p.requires_grad])
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    state = {"data_position": {}, "method": method, "aux_layers": AUX}
    ckpt = save_checkpoint(root / "train" / "checkpoints", 1, draft, opt, sched, state, keep=1)
    return export_draft(ckpt, root / "run", model, root / "run" / "draft"), cfg


def sglang_view(draft_dir: str | Path, target: Path, root: Path, inputs: dict[str, torch.Tensor]) -> dict[str, Any]:
    """SGLang 0.5.23's own loader (draft mode, stock SGLang: no plugin) on an exported draft, in SGLang's interpreter
    (sglang_load_draft.py), its step 0 run on `inputs` (input_ids [T], aux [T, K*H]): {"meta", "tensors"}."""
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    save_file(inputs, str(root / "inputs.safetensors"))
    out, cwd = root / "sglang_view.safetensors", root / "cwd"  # no server_patch folder in cwd
    cwd.mkdir(exist_ok=True)
    env = {**{k: v for k, v in os.environ.items() if k != "EAGLE3_CPU_SPEC"},  # stock SGLang: no CPU fallback
           "SGLANG_USE_CPU_ENGINE": "1", "LD_LIBRARY_PATH": str(SGLANG_PYTHON.parent.parent / "stub")}  # fmt: skip
    proc = subprocess.run(
        [str(SGLANG_PYTHON), str(Path(__file__).parent / "sglang_load_draft.py"), "--draft", str(draft_dir),
         "--target", str(target), "--out", str(out), "--port", str(free_port()),
         "--inputs", str(root / "inputs.safetensors")],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    with safe_open(str(out), "pt") as f:
        meta = json.loads(f.metadata()["result"])
    return {"meta": meta, "tensors": load_file(str(out))}
