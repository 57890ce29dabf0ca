"""extract.store_dtype: float8_e4m3 end to end on CPU with the real SmolLM2: the transformers engine quantizes,
the store verifies, the states stay within FP8 noise of an independent HF forward, convert and the peer exports
read it, an import of the export is FP8 again, and the trainer trains from an FP8 store."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from eagle3.config import PipelineConfig, TrainConfig
from eagle3.convert import convert, export_specforge, export_speculators, import_specforge
from eagle3.draft.synthetic import SyntheticSpec, write_run
from eagle3.extract.engines import build_engine
from eagle3.extract.engines.transformers_engine import TransformersEngine
from eagle3.extract.shard import RunMismatchError, extract_shard, open_run
from eagle3.store.run_store import RunStore
from eagle3.store.sample_format import FP8, read_sample
from eagle3.store.verify import verify_run
from eagle3.train.job import TrainJob
from eagle3.train.launch import read_metrics
from eagle3.train.trainer import Trainer
from tests.integration.sglang_support import token_errors
from tests.integration.test_extract import TEXTS, write_prepared

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_torch_thread")]
AUX = [2, 15, 27]


def config(root: Path, model: Path, store_dtype: str) -> PipelineConfig:
    return PipelineConfig.model_validate({"run_dir": str(root), "model": str(model),
                                          "server": {"engine": "transformers", "device": "cpu", "batch_tokens": 256},
                                          "extract": {"store_dtype": store_dtype}})  # fmt: skip


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory, demo_model: Path, demo_tokenizer: Any) -> dict[str, Any]:
    """The same prepared shard extracted twice by the transformers engine: a bf16 store and an FP8 store."""
    root = tmp_path_factory.mktemp("fp8")
    out: dict[str, Any] = {}
    for dtype in ("bfloat16", "float8_e4m3"):
        cfg = config(root / dtype, demo_model, dtype)
        store = RunStore(cfg.run_dir)
        samples = write_prepared(store, demo_tokenizer, demo_model, TEXTS)
        engine = build_engine(cfg, demo_model)
        assert isinstance(engine, TransformersEngine) and engine.fp8 == (dtype == "float8_e4m3")
        info = open_run(cfg, store, demo_model, engine.info)
        m = extract_shard(store, 0, engine, info)
        assert m.status == "complete" and not m.errors
        out[dtype] = {"cfg": cfg, "store": store, "info": info, "samples": samples, "manifest": m}
    return out


@pytest.fixture(scope="module")
def reference(demo_model: Path, stores: dict[str, Any]) -> dict[str, tuple[torch.Tensor, ...]]:
    """An independent fp32 HF forward of each sample alone: hidden_states (embeddings, layer inputs, final norm)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(demo_model, dtype=torch.float32).eval()
    with torch.no_grad():
        return {s.sample_id: tuple(h[0] for h in model(torch.tensor([s.input_ids]), output_hidden_states=True)
                                   .hidden_states) for s in stores["bfloat16"]["samples"]}  # fmt: skip


def worst_token(store: RunStore, samples: list, reference: dict) -> dict[str, float]:
    """Per state, the worst per-token relative L2 over all samples of the (dequantized) store vs the HF forward."""
    worst: dict[str, float] = {}
    for s in samples:
        d = store.open_sample(0, s.sample_id).dequantized(torch.float32)
        pairs = [(f"aux {layer}", d.aux_hidden_states[:, k], layer) for k, layer in enumerate(AUX)]
        for name, mine, layer in [*pairs, ("last", d.last_hidden_state, -1)]:
            e = float(token_errors(mine, reference[s.sample_id][layer]).max())
            worst[name] = max(worst.get(name, 0.0), e)
    return worst


def test_fp8_store_is_half_the_bytes_verifies_and_matches_the_hf_forward_like_bf16(
    stores: dict[str, Any], reference: dict
) -> None:
    bf, f8 = stores["bfloat16"], stores["float8_e4m3"]
    assert f8["info"].store_dtype == "float8_e4m3" and f8["info"].dtype == "bfloat16"
    assert bf["info"].store_dtype == "bfloat16"
    assert f8["manifest"].bytes < 0.56 * bf["manifest"].bytes  # H = 576 and short samples: headers weigh more
    assert verify_run(f8["store"]).clean and verify_run(bf["store"]).clean
    first = f8["store"].open_sample(0, f8["samples"][0].sample_id)
    assert first.aux_hidden_states.dtype == FP8 and first.aux_scales is not None
    worst_bf16 = worst_token(bf["store"], bf["samples"], reference)
    worst_fp8 = worst_token(f8["store"], f8["samples"], reference)
    print("\nworst-token relative L2 vs HF fp32 (bf16 / FP8):",
          {k: f"{worst_bf16[k]:.4f} / {worst_fp8[k]:.4f}" for k in worst_fp8})  # fmt: skip
    for name in worst_fp8:
        assert worst_fp8[name] < 0.2, (name, worst_fp8[name])  # a wrong layer is 0.15-0.6 off on the MEDIAN token
        assert worst_fp8[name] < worst_bf16[name] + 0.08, (name, worst_bf16[name], worst_fp8[name])


def test_resuming_an_fp8_store_as_bf16_is_refused(stores: dict[str, Any], demo_model: Path) -> None:
    f8 = stores["float8_e4m3"]
    cfg = config(Path(f8["cfg"].run_dir), demo_model, "bfloat16")
    engine = build_engine(cfg, demo_model)
    with pytest.raises(RunMismatchError, match="store_dtype: store has 'float8_e4m3', now 'bfloat16'"):
        open_run(cfg, f8["store"], demo_model, engine.info)


def test_convert_and_the_peer_exports_read_an_fp8_store_and_an_import_keeps_it_fp8(
    stores: dict[str, Any], tmp_path: Path
) -> None:
    f8, bf = stores["float8_e4m3"], stores["bfloat16"]
    assert convert(f8["cfg"], f8["store"]).num_samples == len(TEXTS)
    spec = export_specforge(f8["store"], tmp_path / "specforge")
    assert any("dequantized to bfloat16" in n for n in spec.notes)
    sp = export_speculators(f8["store"], tmp_path / "speculators")
    assert any("dequantized to bfloat16" in n for n in sp.notes)
    assert not any("dequantized" in n for n in export_specforge(bf["store"], tmp_path / "specforge-bf16").notes)
    back = RunStore(tmp_path / "back")
    import_specforge(tmp_path / "specforge", back)
    info = back.read_run_info()
    assert info is not None and info.store_dtype == "float8_e4m3"
    assert verify_run(back).clean
    for s in f8["samples"]:
        a = f8["store"].open_sample(0, s.sample_id)
        b = back.open_sample(0, s.sample_id)
        assert b.is_fp8 and torch.equal(a.input_ids, b.input_ids)
        # dequantized to bf16 and quantized again: the same FP8 codes, scales within bf16 rounding
        assert torch.equal(a.aux_hidden_states.view(torch.uint8), b.aux_hidden_states.view(torch.uint8))
        torch.testing.assert_close(a.aux_scales, b.aux_scales, rtol=2**-7, atol=0)


def test_the_trainer_learns_from_an_fp8_store(tmp_path: Path) -> None:
    spec = SyntheticSpec(lengths=tuple([24, 40, 33, 17, 48, 29, 36, 21] * 4), store_dtype="float8_e4m3")
    paths = write_run(tmp_path / "store", tmp_path / "target", spec)
    assert read_sample(paths[0]).is_fp8
    train = TrainConfig.model_validate({
        "batch_tokens": 128, "max_steps": 30, "lr": 3e-3, "warmup_steps": 2, "ttt_steps": 3, "draft_vocab_size": 96,
        "precision": "fp32", "log_every": 5, "checkpoint_every": 100, "loader_threads": 2, "prefetch_batches": 2,
    })  # fmt: skip
    job = TrainJob(train=train, run_dir=str(tmp_path / "store"), model_dir=str(tmp_path / "target"),
                   out_dir=str(tmp_path / "out"), device="cpu")  # fmt: skip
    with Trainer.build(job) as t:
        _, first = next(t.stream.iterate(t.pos))
        assert first.aux_hidden.dtype == torch.bfloat16 and first.aux_scales is None  # dequantized by the stream
        t.run()
    steps = {r["step"]: r for r in read_metrics(tmp_path / "out" / "metrics.jsonl")}
    assert steps[30]["loss"] < 0.8 * steps[5]["loss"]
