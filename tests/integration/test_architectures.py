"""Every stage on every architecture users serve, with the transformers engine, on tiny random-weight targets
(eagle3/target/tiny.py; the recipes are the rows of eagle3/target/families.py: Llama, Mistral, Phi-3, Llama-4,
Apertus, Qwen2, Qwen3, Qwen3-Next and Qwen3.5 (gated DeltaNet), Qwen2-MoE, Qwen3-MoE, EXAONE-MoE, GLM-4-MoE,
Gemma-4, MiniMax-M2, DeepSeek-V2/V3 and GLM-4.7-Flash (MLA + MoE), GPT-OSS (sliding window, sinks, MoE), and the
multimodal wrappers fed text alone (Qwen2.5-VL, Qwen3-VL, Qwen3-VL-MoE, Qwen3.5's, Llama-4's, Gemma-4's, Kimi-K2.5));
and the
families SGLang captures for block drafters only (Laguna, LFM2, LFM2-MoE, MiMo-V2-Flash, Nemotron-H) through every
stage but export with a DFlash draft.

One test per architecture runs the library calls each Prefect task makes, in stage order: prepare -> synthesize
-> extract -> verify -> convert -> train (3 steps, in process) -> export -> offline evaluation. A second one
checks what is captured against the decoder layers' own inputs (forward pre-hooks: the residual stream before
layer i), in fp32, alone and in a batch: an off-by-one layer, MLA's compressed KV, MoE routing that depends on
the batch or GPT-OSS's window past its length would each show there.

To add an architecture: a row with a tiny recipe in eagle3/target/families.py; these tests then cover it
(docs/models.md).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from eagle3.config import PipelineConfig
from eagle3.convert import convert
from eagle3.data.prepare import prepare
from eagle3.data.synthesize import synthesize
from eagle3.draft.checkpoint import resolve_checkpoint
from eagle3.draft.dflash.serving import target_layer_ids
from eagle3.evaluate.offline import evaluate_offline
from eagle3.extract.engines import build_engine
from eagle3.extract.engines.base import Captured
from eagle3.extract.engines.transformers_engine import TransformersEngine
from eagle3.extract.shard import extract_shard, open_run
from eagle3.release.export import export_draft
from eagle3.serving.layers import sglang_layer_ids
from eagle3.store.run_store import PreparedSample, RunStore
from eagle3.store.verify import verify_run
from eagle3.target.families import BLOCK_DRAFTER_ARCHITECTURES, TINY_ARCHITECTURES
from eagle3.target.files import read_model_facts
from eagle3.target.load import decoder_stack, load_causal_lm
from eagle3.target.tiny import ARCHITECTURES, tiny_config
from eagle3.train.job import TrainJob
from eagle3.train.trainer import Trainer

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_torch_thread")]

REPO = Path(__file__).resolve().parents[2]
THINKING_TEMPLATE = REPO / "tests" / "assets" / "thinking_template.jinja"
QUESTIONS = ["What is the capital of France?", "Name a colour of the sky.", "What is 3 times 4?", "Say hello."]
FP32_TOL = 1e-4  # fp32 engine vs an fp32 forward's layer input, worst token (same kernels: ~1e-6)
LONG = 40  # tokens: five times the tiny GPT-OSS sliding window (8)


def write_rows(path: Path, *, reasoning: bool) -> Path:
    with path.open("w") as f:
        for q in QUESTIONS:
            answer: dict[str, str] = {"role": "assistant", "content": "Let me answer that."}
            if reasoning:
                answer["reasoning_content"] = "The user asks a short question."
            f.write(json.dumps({"messages": [{"role": "user", "content": q}, answer]}) + "\n")
    return path


def prepare_and_extract(cfg: PipelineConfig, store: RunStore, model: Path) -> None:
    """prepare, then every shard extracted by cfg's engine, each complete."""
    prepare(cfg, store, model)
    engine = build_engine(cfg, model)
    info = open_run(cfg, store, model, engine.info)
    for shard in range(len(QUESTIONS) // 2):
        assert extract_shard(store, shard, engine, info).status == "complete"


def pipeline_config(tmp: Path, model: Path, arch: str) -> PipelineConfig:
    """The demo's settings, shrunk. Qwen3 runs with a thinking template and enable_thinking, as it is served."""
    qwen3 = arch.startswith("Qwen3")
    data: dict[str, Any] = {"dataset": str(write_rows(tmp / "rows.jsonl", reasoning=qwen3)), "max_length": 128,
                            "shard_size": 2}  # fmt: skip
    if qwen3:
        data |= {"chat_template": str(THINKING_TEMPLATE), "chat_template_kwargs": {"enable_thinking": True}}
    return PipelineConfig.model_validate(
        {
            "run_dir": str(tmp / "run"),
            "model": str(model),
            "data_dir": str(REPO / "data"),
            "stages": ["prepare", "synthesize", "extract", "convert", "train", "export", "evaluate"],
            "data": data,
            "synthesize": {"max_new_tokens": 8, "batch_size": 4},
            "server": {"engine": "transformers", "device": "cpu", "max_total_tokens": 4096},
            "train": {"draft_vocab_size": 64, "max_steps": 3, "batch_tokens": 256, "ttt_steps": 2, "warmup_steps": 1,
                      "log_every": 1, "checkpoint_every": 3, "precision": "fp32", "device": "cpu",
                      "loader_threads": 1},
            "evaluate": {"num_prompts": 2, "max_new_tokens": 6, "draft_steps": 2, "live": "off", "device": "cpu",
                         "dataset": str(tmp / "rows.jsonl")},
        }
    )  # fmt: skip


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_every_stage_runs_on_the_transformers_engine(
    arch: str, tiny_models: dict[str, Path], tmp_path: Path, record_property: Any
) -> None:
    model = tiny_models[arch]
    facts = read_model_facts(model)
    cfg = pipeline_config(tmp_path, model, arch)
    store = RunStore(cfg.run_dir)

    prepared = prepare(cfg, store, model)
    assert prepared.num_samples == len(QUESTIONS)
    if arch.startswith("Qwen3"):  # the reasoning template rendered with enable_thinking, as served
        text = store_text(model, store.prepared_samples(0)[0])
        assert "<think>\nThe user asks a short question.\n</think>" in text, text
    synthesize(cfg, store, model)  # a random target's own replies replace the answers
    samples = [s for shard in range(len(QUESTIONS) // 2) for s in store.prepared_samples(shard)]

    engine = build_engine(cfg, model)
    info = open_run(cfg, store, model, engine.info)
    start = time.monotonic()
    for shard in range(len(QUESTIONS) // 2):
        assert extract_shard(store, shard, engine, info).status == "complete"
    tok_s = sum(len(s) for s in samples) / (time.monotonic() - start)
    expected_aux = [2, facts.num_layers // 2, facts.num_layers - 3]
    run = json.loads((Path(cfg.run_dir) / "run.json").read_text())
    assert run["aux_layers"] == expected_aux == run["engine_layer_ids"]

    report = verify_run(store)
    assert report.clean and report.ok_count == len(QUESTIONS), report.summary()

    result = convert(cfg, store)
    assert result.num_samples == len(QUESTIONS)
    from safetensors.torch import load_file

    vocab = load_file(result.vocab_map_path)
    d2t, t2d = vocab["d2t"], vocab["t2d"]
    draft_ids = torch.arange(len(d2t)) + d2t  # the target id of each draft id
    assert len(t2d) == facts.vocab_size and int(t2d.sum()) == len(d2t) == 64
    assert int(draft_ids.max()) < facts.vocab_size and bool(t2d[draft_ids].all())

    out = tmp_path / "train"
    job = TrainJob(train=cfg.train, run_dir=cfg.run_dir, model_dir=str(model), out_dir=str(out), device="cpu")
    with Trainer.build(job) as t:
        t.run()
    ckpt = resolve_checkpoint(out / "checkpoints")

    export = export_draft(ckpt, Path(cfg.run_dir), model, Path(cfg.run_dir) / "draft" / "exports" / "x")
    draft_cfg = json.loads((Path(export.out_dir) / "config.json").read_text())
    want = sglang_layer_ids(facts.model_type, expected_aux, facts.num_layers).layer_ids
    assert draft_cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == want
    assert draft_cfg["vocab_size"] == facts.vocab_size and draft_cfg["draft_vocab_size"] == 64

    offline = evaluate_offline(cfg.evaluate, Path(cfg.run_dir), model, ckpt)
    assert offline.num_prompts == 2 and offline.identical_to_greedy == 2
    assert 1.0 <= offline.acceptance_length <= 3.0
    record_property("figures", {"arch": arch, "tok_s": round(tok_s), "acceptance": offline.acceptance_length})
    print(
        f"\nFIGURES {arch}: extract {tok_s:.0f} tok/s (transformers, CPU); acceptance {offline.acceptance_length:.3f}"
    )


BLOCK_LAYERS = [2, 3, 4, 5, 6]  # a DFlash draft's default five at 8 layers (SGLang's build_target_layer_ids(8, 5))


@pytest.mark.parametrize("arch", BLOCK_DRAFTER_ARCHITECTURES)
def test_a_family_sglang_captures_for_block_drafters_only_trains_and_evaluates_a_dflash_draft_and_refuses_eagle3(
    arch: str, tiny_models: dict[str, Path], tmp_path: Path
) -> None:
    """prepare, extract (5 layers), verify, convert, a DFlash draft's 3 training steps, the exact offline evaluation
    (recurrent layers too: LFM2's convolutions, Nemotron-H's Mamba-2 are rolled back by replay); an EAGLE-3 draft
    of the family is refused before the first stage, as SGLang 0.5.23 cannot serve one."""
    from eagle3.checks.preflight import ServingRefusedError, check_serving

    model = tiny_models[arch]
    base = pipeline_config(tmp_path, model, arch)
    eagle3 = base.model_copy(update={"stages": ["prepare", "extract", "convert", "train", "export"]})
    with pytest.raises(ServingRefusedError, match=r"captures it for block drafters only.*export \("):
        check_serving(eagle3, model)
    train = {**base.train.model_dump(), "method": "dflash", "block_size": 4}
    evaluate = {**base.evaluate.model_dump(), "compare_steps": [2]}  # within the block: 3 drafted tokens at most
    stages = ["prepare", "extract", "convert", "train", "evaluate"]
    cfg = PipelineConfig.model_validate({**base.model_dump(), "stages": stages, "train": train, "evaluate": evaluate,
                                         "extract": {"aux_layers": BLOCK_LAYERS}})  # fmt: skip
    store = RunStore(cfg.run_dir)
    prepare_and_extract(cfg, store, model)
    assert verify_run(store).clean
    convert(cfg, store)
    out = tmp_path / "train"
    job = TrainJob(train=cfg.train, run_dir=cfg.run_dir, model_dir=str(model), out_dir=str(out), device="cpu")
    with Trainer.build(job) as t:
        assert t.aux_layers == BLOCK_LAYERS
        t.run()
    offline = evaluate_offline(cfg.evaluate, Path(cfg.run_dir), model, resolve_checkpoint(out / "checkpoints"))
    assert offline.num_prompts == 2 and offline.identical_to_greedy == 2
    # the block drafter is served through SGLang's DFlash capture, which the family has: preflight lets its export
    # through, and the export names the layers by the family's DFlash rule
    check_serving(cfg.model_copy(update={"stages": [*stages, "export"]}), model)
    export = export_draft(resolve_checkpoint(out / "checkpoints"), Path(cfg.run_dir), model, tmp_path / "export")
    assert export.speculative_algorithm == "DFLASH" and export.aux_layers == BLOCK_LAYERS
    config = json.loads((tmp_path / "export" / "config.json").read_text())
    assert (
        config["dflash_config"]["target_layer_ids"]
        == export.sglang_layer_ids
        == target_layer_ids(BLOCK_LAYERS, read_model_facts(model).model_type)
    )


def store_text(model: Path, sample: PreparedSample) -> str:
    from transformers import AutoTokenizer

    return str(AutoTokenizer.from_pretrained(model).decode(sample.input_ids))


FINAL_NORMS = ("norm", "embedding_norm", "norm_f")  # LFM2 calls its final norm embedding_norm, Nemotron-H norm_f


def layer_inputs(model: Any, ids: list[int]) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Each decoder layer's input hidden state (a forward pre-hook) and the final norm's output, for one sample."""
    seen: list[torch.Tensor] = []
    norm: dict[str, torch.Tensor] = {}
    stack = decoder_stack(model)
    lm = getattr(stack, "language_model", stack)  # a wrapper's model holds its language model
    hooks = [
        layer.register_forward_pre_hook(lambda m, a, kw: seen.append((a[0] if a else kw["hidden_states"])[0].clone()),
                                        with_kwargs=True)
        for layer in lm.layers
    ]  # fmt: skip
    final_norm = next(getattr(lm, n) for n in FINAL_NORMS if hasattr(lm, n))
    hooks.append(final_norm.register_forward_hook(lambda m, a, out: norm.__setitem__("out", out[0])))
    try:
        with torch.inference_mode():
            model(torch.tensor([ids]))
    finally:
        for h in hooks:
            h.remove()
    return seen, norm["out"]


@pytest.mark.parametrize("arch", TINY_ARCHITECTURES)
def test_captured_states_are_the_decoder_layer_inputs_alone_and_in_a_batch(
    arch: str, tiny_models: dict[str, Path], demo_tokenizer: Any
) -> None:
    model_dir = tiny_models[arch]
    texts = [" ".join(str(i) for i in range(LONG)), "The capital of France is Paris.", "A short one."]
    samples = [PreparedSample(f"s{i}", demo_tokenizer(t).input_ids, [1] * len(demo_tokenizer(t).input_ids), "t")
               for i, t in enumerate(texts)]  # fmt: skip
    assert len(samples[0]) > 4 * (tiny_config(arch).to_dict().get("sliding_window") or 8)
    batched = TransformersEngine(model_dir, device="cpu", dtype="float32", batch_tokens=4096)
    alone = TransformersEngine(model_dir, device="cpu", dtype="float32", batch_tokens=1)
    together = {o.sample.sample_id: o for o in batched.extract(samples) if isinstance(o, Captured)}
    single = {o.sample.sample_id: o for o in alone.extract(samples) if isinstance(o, Captured)}
    ref_model = load_causal_lm(model_dir, torch.float32, "cpu")
    layers = batched.info.aux_layers
    for s in samples:
        inputs, norm = layer_inputs(ref_model, s.input_ids)
        for got, how in ((together[s.sample_id], "batched"), (single[s.sample_id], "alone")):
            for k, layer in enumerate(layers):
                err = rel_err(got.aux_hidden_states[:, k], inputs[layer])
                assert err < FP32_TOL, (
                    f"{arch} {s.sample_id} {how}: aux {layer} is {err:.2e} from layer {layer}'s input"
                )
                far = rel_err(got.aux_hidden_states[:, k], inputs[layer - 1])
                assert far > 0.05, f"{arch} {s.sample_id}: aux {layer} only {far:.3f} from layer {layer - 1}'s input"
            assert rel_err(got.last_hidden_state, norm) < FP32_TOL, f"{arch} {s.sample_id} {how}: last state"


def rel_err(got: torch.Tensor, ref: torch.Tensor) -> float:
    got, ref = got.float(), ref.float()
    return float(((got - ref).norm(dim=-1) / ref.norm(dim=-1).clamp_min(1e-6)).max())


def test_each_tiny_target_is_its_architecture_with_the_demo_tokenizers_vocabulary(
    tiny_models: dict[str, Path],
) -> None:
    from transformers import AutoTokenizer

    from eagle3.target.files import tokenizer_fingerprint

    sizes: dict[str, int] = {}  # by tokenizer fingerprint: each distinct tokenizer is loaded once
    for arch, model in tiny_models.items():
        facts = read_model_facts(model)
        assert facts.architectures == (arch,) and facts.hidden_size == 64 and facts.num_layers == 8
        tok = tokenizer_fingerprint(model)
        if tok not in sizes:
            sizes[tok] = len(AutoTokenizer.from_pretrained(model))
        assert sizes[tok] == facts.vocab_size, arch


def altered_copy(model: Path, out: Path, **config: Any) -> Path:
    """`model` with its config.json changed (weights and tokenizer linked, not copied)."""
    out.mkdir()
    for f in model.iterdir():
        if f.name != "config.json":
            (out / f.name).symlink_to(f)
    (out / "config.json").write_text(json.dumps({**json.loads((model / "config.json").read_text()), **config}))
    return out


def test_an_architecture_no_engine_supports_is_refused_naming_it_and_the_supported_list_before_any_server(
    tiny_models: dict[str, Path], tmp_path: Path
) -> None:
    from eagle3.serving.layers import LayerMappingError
    from eagle3.target.files import ModelError

    model = altered_copy(tiny_models["LlamaForCausalLM"], tmp_path / "foo", model_type="foo",
                         architectures=["FooForCausalLM"])  # fmt: skip
    cfg = pipeline_config(tmp_path, model, "FooForCausalLM")
    with pytest.raises(ModelError, match=r"architecture FooForCausalLM \(model_type 'foo'\) is not supported") as e:
        build_engine(cfg, model)
    assert all(arch in str(e.value) for arch in ARCHITECTURES)
    server = cfg.server.model_copy(update={"engine": "sglang", "python": "/nonexistent/python"})
    sglang = cfg.model_copy(update={"server": server})
    with pytest.raises(LayerMappingError, match=r"model_type 'foo': no SGLang layer-id rule .*deepseek_v3.*qwen3_moe"):
        build_engine(sglang, model, base_env={})  # refused while building: the (missing) interpreter is never run


def test_a_tokenizer_with_more_tokens_than_the_config_vocabulary_is_refused_with_both_numbers(
    tiny_models: dict[str, Path], tmp_path: Path
) -> None:
    from eagle3.target.files import ModelError

    model = altered_copy(tiny_models["Qwen3ForCausalLM"], tmp_path / "small-vocab", vocab_size=32000)
    with pytest.raises(ModelError, match=r"tokenizer has 49152 tokens but config.json's vocab_size is 32000"):
        build_engine(pipeline_config(tmp_path, model, "Qwen3ForCausalLM"), model)
    padded = altered_copy(tiny_models["Qwen3ForCausalLM"], tmp_path / "padded", vocab_size=49280)
    from eagle3.target.files import check_target

    assert check_target(padded, "transformers").vocab_size == 49280  # a vocabulary padded past the tokenizer's: fine


def test_a_tiny_target_built_again_elsewhere_is_the_same_bytes(
    tiny_models: dict[str, Path], demo_model: Path, tmp_path: Path
) -> None:
    from eagle3.target.files import sha256_file
    from eagle3.target.tiny import ensure_tiny_model

    (tmp_path / "models").mkdir()
    (tmp_path / "models" / demo_model.name).symlink_to(demo_model)  # the demo tokenizer, not installed again
    again = ensure_tiny_model(tmp_path, "DeepseekV3ForCausalLM")
    first = tiny_models["DeepseekV3ForCausalLM"]
    assert again != first
    for name in ("model.safetensors", "config.json", "tokenizer.json"):
        assert sha256_file(again / name) == sha256_file(first / name), name
    stamp = (again / "install.json").stat().st_mtime_ns
    assert ensure_tiny_model(tmp_path, "DeepseekV3ForCausalLM") == again  # cached: not written again
    assert (again / "install.json").stat().st_mtime_ns == stamp
