"""The SGLang row of docs/models.md: each tiny target (eagle3/target/tiny.py) that SGLang 0.5.23 runs on CPU (Llama,
Qwen2, Qwen3, GLM-4-MoE, Apertus, DeepSeek-V3) goes through every stage with `server.engine: sglang`, one server per
architecture (module-scoped): synthesize through it, extract through the hook, parity per token with the
transformers engine on the same samples at the same aux layers (what catches an off-by-one layer convention), the
layer ids in run.json, in the hook's report and in the exported draft (read back by SGLang's own EAGLE3 loader for
that target) agree, then verify, convert, train, export, offline evaluation.

The architectures SGLang cannot run on CPU have a test that expects the failure for its stated reason, so it fails
(and docs/models.md needs a new row) the day SGLang starts running them; Qwen3-MoE, which SGLang serves on this CPU
but computes NaN for, has one that expects the NaN. The rest are not started here (SGLANG_SOURCE_ONLY says why and
what SGLang did with them once).
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from eagle3.config import PipelineConfig
from eagle3.convert import convert
from eagle3.data.prepare import prepare
from eagle3.data.synthesize import synthesize
from eagle3.draft.checkpoint import resolve_checkpoint
from eagle3.draft.dflash.serving import dflash_rule_of
from eagle3.draft.method import MethodError
from eagle3.evaluate.offline import evaluate_offline
from eagle3.extract.engines.base import Captured
from eagle3.extract.engines.sglang_engine import SGLangEngine
from eagle3.extract.engines.transformers_engine import TransformersEngine
from eagle3.extract.shard import extract_shard, open_run
from eagle3.release.export import export_draft
from eagle3.serving.layers import internal_indices, sglang_layer_ids
from eagle3.serving.server import ServerError
from eagle3.store import dump_protocol as proto
from eagle3.store.run_store import RunStore
from eagle3.store.verify import verify_run
from eagle3.target.files import read_model_facts
from eagle3.target.tiny import ARCHITECTURES
from eagle3.train.job import TrainJob
from eagle3.train.trainer import Trainer, TrainError
from tests.integration.sglang_support import SGLANG_PYTHON, require_sglang_env, start_server, token_errors
from tests.integration.test_architectures import QUESTIONS, pipeline_config
from tests.ports import free_port

pytestmark = [pytest.mark.sglang, pytest.mark.slow, pytest.mark.usefixtures("one_torch_thread")]
HERE = Path(__file__).resolve().parent

#: The tiny targets SGLang 0.5.23 serves on this CPU.
SGLANG_RUNS = (
    "LlamaForCausalLM",
    "Qwen3ForCausalLM",
    "DeepseekV3ForCausalLM",
    "Qwen2ForCausalLM",
    "Glm4MoeForCausalLM",
    "ApertusForCausalLM",  # its own apertus.py (xIELU, QK-norm), not Llama's path
)
#: Served, but its states are not transformers' on the same directory: the parity test expects the difference
#: (and fails the day it is gone: then parity holds; drop the entry). The other stages run on its store all the same.
SGLANG_PARITY_DIFFERS = {
    # From the first MLA layers on: SGLang's CPU MLA is the intel_amx backend's; this CPU has none (docs/models.md).
    "DeepseekV3ForCausalLM": 1.0,  # the median token's relative error is above this at the first aux layer
}
#: Served, but what it computes on this CPU (no AMX) is not finite: the hidden states are NaN from the first MoE
#: layer's output on (HF index 2, after layer 1; layer 0 is dense), and generation returns token 0 each step.
SGLANG_NOT_FINITE = ("Qwen3MoeForCausalLM",)
#: The others, with the lines of SGLang's start-up error that say why (each one must be in its sglang.log;
#: docs/models.md). Each start costs CI ~15-25 CPU-seconds: SGLang's launcher and scheduler import, then fail.
SGLANG_FAILS: dict[str, tuple[str, ...]] = {
    # Loading the experts' gate_up_proj: SGLang's fused-MoE weight loader expects another layout on CPU.
    "GptOssForCausalLM": ("RuntimeError: The size of tensor a (64) must match the size of tensor b (128)",),
    # The shared expert's sigmoid gate (qwen2_moe.py fused_gate_sigmoid_mul_add) is a Triton kernel: no CPU driver.
    "Qwen2MoeForCausalLM": ("RuntimeError: 0 active drivers ([]). There should only be one.",),
    # No CPU MoE for Llama-4: the unquantized path's native MoE raises.
    "Llama4ForCausalLM": ("in moe_forward_native", "NotImplementedError"),
    # Its gated-DeltaNet linear attention reaches for CUDA in the forked scheduler.
    "Qwen3NextForCausalLM": ("RuntimeError: Cannot re-initialize CUDA in forked subprocess",),
    # qwen3_5_text.py does not import on CPU (sgl_kernel has no fused_sigmoid_mul_cpu), so no class is registered.
    "Qwen3_5ForCausalLM": ("ValueError: Qwen3_5ForCausalLM has no SGlang implementation",),
    "Qwen3_5MoeForCausalLM": ("ValueError: Qwen3_5MoeForCausalLM has no SGlang implementation",),
    "ExaoneMoeForCausalLM": (
        "AssertionError: One of the attention backends in ['fa3', 'triton', 'trtllm_mha'] is required for "
        "ExaoneMoeForCausalLM, but got intel_amx",
    ),
    # SGLang reads config.head_dim of a config transformers 5.19 writes per layer.
    "Gemma4ForCausalLM": ("AmbiguousGlobalPerLayerAttributeError: 'head_dim' is a per-layer attribute",),
    # Its QK-norm kernel asserts CUDA tensors.
    "MiniMaxM2ForCausalLM": ("in rms_sumsq_serial", "assert x1.is_cuda and x2.is_cuda"),
    # Not the CPU: longcat_flash.py:377 tests "rope_theta" in config.rope_parameters, None with transformers 5.19
    # (SGLang's pin), on any device (docs/models.md has the override that gets it past this).
    "LongcatFlashForCausalLM": ("in __init__", "TypeError: argument of type 'NoneType' is not iterable"),
    # model_hook.py picks DeepSeek Sparse Attention's backend by the GPU's compute capability.
    "DeepseekV32ForCausalLM": ("in handle_model_specific_adjustments", "RuntimeError: Found no NVIDIA driver"),
    # The multimodal wrappers (their preprocessor_config.json shipped): Qwen's VL processors do not import on CPU
    # (qwen_vl.py needs sgl_kernel's fused_sigmoid_mul_cpu), so none is registered for the architecture.
    "Qwen2_5_VLForConditionalGeneration": (
        "ValueError: No processor registered for architecture: ['Qwen2_5_VLForConditionalGeneration']",
    ),
    "Qwen3VLForConditionalGeneration": (
        "ValueError: No processor registered for architecture: ['Qwen3VLForConditionalGeneration']",
    ),
    # Its fused experts, as transformers 5.19 saves them, are not the layout SGLang's loader slices (as GPT-OSS's).
    "Qwen3VLMoeForConditionalGeneration": (
        "in load_fused_expert_weights",
        "RuntimeError: The size of tensor a (64) must match the size of tensor b (32)",
    ),
    # Its processor reads the tokenizer's image token, which the demo tokenizer of every tiny target lacks.
    "Gemma4ForConditionalGeneration": ("AttributeError: TokenizersBackend has no attribute image_token_id",),
    # transformers 5.19 builds Kimi-K2.5 natively and saves its vision tower in its own layout; SGLang's loader
    # expects the original checkpoint's names (the language model's are DeepSeek-V3's, served in SGLANG_RUNS).
    "KimiK25ForConditionalGeneration": ("KeyError: 'model.blocks.0.mlp.gate_up_proj.weight'",),
}
#: Rows whose start-up fails in two processes at once, each for its own reason: the scheduler loading the weights
#: (SGLANG_FAILS) and the tokenizer manager looking up the multimodal processor (here). Whichever comes first stops
#: SGLang, so the log holds one of them: on this machine the scheduler's, on CI's 2-core runner the processor's.
SGLANG_FAILS_RACING: dict[str, tuple[str, ...]] = {
    "Qwen3VLMoeForConditionalGeneration": (
        "ValueError: No processor registered for architecture: ['Qwen3VLMoeForConditionalGeneration']",
    ),
}
#: Not run here: proven by the source-reading test alone (tests/unit/target/test_sglang_source.py: the row's files
#: capture with the row's rule) and by the transformers engine's every-stage and capture tests. What SGLang 0.5.23
#: did with each tiny target on this CPU, measured with `.venv/bin/python tests/integration/sglang_try_families.py
#: ARCH...` (docs/models.md, "SGLang verdicts").
SGLANG_SOURCE_ONLY = {
    "MistralForCausalLM": "mistral.py's MistralForCausalLM(LlamaForCausalLM): Llama's path, run here; not started",
    "Phi3ForCausalLM": "llama.py's Phi3ForCausalLM(LlamaForCausalLM): Llama's path, run here; not started",
    # MLA on this CPU (no AMX), as DeepSeek-V3's SGLANG_PARITY_DIFFERS: the states differ from the first MLA layer;
    # serving them here (2-4 CPU-minutes) would prove what DeepSeek-V3's row does
    "DeepseekV2ForCausalLM": "starts and captures; states differ from transformers' (median token 16, worst 48)",
    "Glm4MoeLiteForCausalLM": "starts and captures; states differ from transformers' (median token 17, worst 49)",
    # Wrappers that fail as their text rows in SGLANG_FAILS do (measured with sglang_try_families.py, session 25)
    "Qwen3_5ForConditionalGeneration": "ValueError: Qwen3_5ForConditionalGeneration has no SGlang implementation",
    "Qwen3_5MoeForConditionalGeneration": "ValueError: Qwen3_5MoeForConditionalGeneration has no SGlang implementation",
    "Llama4ForConditionalGeneration": "its text model's MoE: NotImplementedError in moe_forward_native",
    # DeepSeek Sparse Attention's backend is picked by the GPU's capability, as DeepSeek-V3.2's (SGLANG_FAILS)
    "GlmMoeDsaForCausalLM": "in handle_model_specific_adjustments: RuntimeError: Found no NVIDIA driver",
    # SGLang reads the original checkpoint's vision config (its own CLIPVisionConfig fields), not transformers'
    "MiniMaxM3SparseForConditionalGeneration": "TypeError: CLIPVisionConfig.__init__() missing 4 required "
    "positional arguments: 'img_token_compression_config', 'position_embedding_type', 'rope_mode', and "
    "'vision_segment_max_frames'",
}
MEDIAN_TOL, WORST_TOL = 0.03, 0.2  # bf16 SGLang vs bf16 transformers per token, as tests/integration/sglang_support.py


def test_every_tested_architecture_has_an_sglang_verdict_here() -> None:
    """A row with a tiny recipe (eagle3/target/families.py) is served and compared, or listed with why not."""
    verdicts = [*SGLANG_RUNS, *SGLANG_NOT_FINITE, *SGLANG_FAILS, *SGLANG_SOURCE_ONLY]
    assert sorted(verdicts) == sorted(ARCHITECTURES), (
        "add the architecture to SGLANG_RUNS, _NOT_FINITE, _FAILS or _SOURCE_ONLY"
    )


def five_layers(num_layers: int) -> list[int]:
    """The SGLang stores' five aux layers: EAGLE-3's default three among them (so an EAGLE-3 draft trains from the
    store as from a 3-layer one) and, at 8 layers, a block drafter's default five (SGLang's build_target_layer_ids)."""
    layers = sorted({2, 3, num_layers // 2, num_layers - 3, num_layers - 2})
    assert len(layers) == 5, layers
    return layers


def eagle3_layers(num_layers: int) -> list[int]:
    return [2, num_layers // 2, num_layers - 3]


def sglang_pipeline_config(tmp: Path, model: Path, arch: str) -> PipelineConfig:
    """The transformers tests' settings, served by SGLang, capturing five layers (the store a user keeps for several
    draft methods, docs/methods.md)."""
    cfg = pipeline_config(tmp, model, arch)
    server = {"engine": "sglang", "device": "cpu", "python": str(SGLANG_PYTHON), "max_total_tokens": 16384,
              "startup_timeout_s": 600}  # fmt: skip
    extract = {**cfg.extract.model_dump(), "aux_layers": five_layers(read_model_facts(model).num_layers)}
    return PipelineConfig.model_validate({**cfg.model_dump(), "server": server, "extract": extract})


@pytest.fixture(scope="module", params=SGLANG_RUNS)
def served(
    request: Any, tiny_models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Any]]:
    """One SGLang server per architecture; prepare, synthesize through it and extract both shards through it."""
    require_sglang_env()
    arch = request.param
    model = tiny_models[arch]
    root = tmp_path_factory.mktemp(f"sglang-{arch}")
    cfg = sglang_pipeline_config(root, model, arch)
    store = RunStore(cfg.run_dir)
    prepare(cfg, store, model)
    dump_dir = root / "dump"
    server = start_server(cfg, model, dump_dir)
    try:
        synthesize(cfg, store, model, servers=[server])
        engine = SGLangEngine(cfg, model, "arch", dump_dir, server=server)
        info = open_run(cfg, store, model, engine.info)
        samples = [s for shard in range(len(QUESTIONS) // 2) for s in store.prepared_samples(shard)]
        start = time.monotonic()
        for shard in range(len(QUESTIONS) // 2):
            assert extract_shard(store, shard, engine, info).status == "complete"
        tok_s = sum(len(s) for s in samples) / (time.monotonic() - start)
        yield {"arch": arch, "model": model, "cfg": cfg, "store": store, "info": info, "samples": samples,
               "dump_dir": dump_dir, "root": root, "tok_s": tok_s, "url": server.url}  # fmt: skip
    finally:
        server.stop()


def test_sglang_store_matches_the_transformers_engine_per_token_at_the_same_layers(served: dict[str, Any]) -> None:
    store, info = served["store"], served["info"]
    ref = TransformersEngine(served["model"], device="cpu", dtype="bfloat16", aux_layers=info.aux_layers)
    hf = {o.sample.sample_id: o for o in ref.extract(served["samples"]) if isinstance(o, Captured)}
    if served["arch"] in SGLANG_PARITY_DIFFERS:
        medians = [float(token_errors(store.open_sample(shard, s.sample_id).aux_hidden_states[:, 0],
                                      hf[s.sample_id].aux_hidden_states[:, 0]).median())
                   for shard in range(len(QUESTIONS) // 2) for s in store.prepared_samples(shard)]  # fmt: skip
        print(f"\nFIGURES {served['arch']}: sglang extract {served['tok_s']:.0f} tok/s; SGLang vs transformers, median "
              f"token at HF {info.aux_layers[0]}: {medians}")  # fmt: skip
        bound = SGLANG_PARITY_DIFFERS[served["arch"]]
        assert all(m > bound for m in medians), f"parity holds now ({medians}): drop it from SGLANG_PARITY_DIFFERS"
        return
    worst = 0.0
    for shard in range(len(QUESTIONS) // 2):
        for s in store.prepared_samples(shard):
            got = store.open_sample(shard, s.sample_id)
            want = hf[s.sample_id]
            for k, layer in enumerate(info.aux_layers):
                e = token_errors(got.aux_hidden_states[:, k], want.aux_hidden_states[:, k])
                what = f"{served['arch']} {s.sample_id} layer {layer}"
                assert float(e.median()) < MEDIAN_TOL and float(e.max()) < WORST_TOL, (what, e.median(), e.max())
                worst = max(worst, float(e.max()))
                if k + 1 < len(info.aux_layers):  # the next captured layer is far: a shifted capture would not be
                    far = token_errors(got.aux_hidden_states[:, k], want.aux_hidden_states[:, k + 1])
                    assert float(far.median()) > 0.05, f"{what}: close to layer {info.aux_layers[k + 1]}"
            e = token_errors(got.last_hidden_state, want.last_hidden_state)
            assert float(e.median()) < MEDIAN_TOL and float(e.max()) < WORST_TOL, (s.sample_id, "last", e.max())
            worst = max(worst, float(e.max()))
    print(f"\nFIGURES {served['arch']}: sglang extract {served['tok_s']:.0f} tok/s; parity worst token {worst:.4f}")


def test_sglangs_own_prompt_logprobs_agree_with_transformers_exactly_where_the_stores_do(
    served: dict[str, Any],
) -> None:
    """The hook left out: SGLang's log-probability of each prompt token (its /generate, logprob_start_len 0) vs
    transformers' on the same directory in bf16. Where the stores agree, so do these (measured: Llama 0.001 median,
    0.003 worst); where they differ (DeepSeek), SGLang's forward itself differs (measured: 0.15 median), so the
    difference is SGLang's CPU path and not what the hook captures."""
    model = AutoModelForCausalLM.from_pretrained(served["model"], dtype=torch.bfloat16).eval()
    diffs = []
    for sample in served["samples"][:2]:
        ids = sample.input_ids
        body = {"input_ids": ids, "sampling_params": {"max_new_tokens": 1, "temperature": 0}, "return_logprob": True,
                "logprob_start_len": 0}  # fmt: skip
        meta = httpx.post(f"{served['url']}/generate", json=body, timeout=300).json()["meta_info"]
        got = torch.tensor([m[0] for m in meta["input_token_logprobs"][1:]])
        with torch.no_grad():
            logp = torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), -1)
        want = logp[:-1].gather(1, torch.tensor(ids[1:])[:, None])[:, 0]  # log p(x[t+1] | x[:t+1])
        diffs.append((got - want).abs())
    d = torch.cat(diffs)
    print(f"\nFIGURES {served['arch']}: SGLang vs transformers prompt logprobs, |diff| median {float(d.median()):.4f} "
          f"worst {float(d.max()):.4f}")  # fmt: skip
    if served["arch"] in SGLANG_PARITY_DIFFERS:
        assert float(d.median()) > 0.05, "SGLang's forward agrees with transformers now: see SGLANG_PARITY_DIFFERS"
    else:
        assert float(d.max()) < 0.02


def test_the_layers_sglang_captured_are_the_ones_run_json_records(served: dict[str, Any]) -> None:
    facts = read_model_facts(served["model"])
    run = json.loads((Path(served["cfg"].run_dir) / "run.json").read_text())
    aux = five_layers(facts.num_layers)
    assert run["aux_layers"] == aux
    assert run["engine_layer_ids"] == sglang_layer_ids(facts.model_type, aux, facts.num_layers).layer_ids
    assert internal_indices(facts.model_type, run["engine_layer_ids"], facts.num_layers) == aux
    workers = [s for s in proto.read_statuses(served["dump_dir"]) if s["status"] == "worker"]
    assert workers and all(w["layers_to_capture"] == aux and w["problem"] is None for w in workers)


def test_the_rest_of_the_stages_and_sglangs_eagle3_loader_take_the_sglang_store(served: dict[str, Any]) -> None:
    cfg, store, model = served["cfg"], served["store"], served["model"]
    report = verify_run(store)
    assert report.clean and report.ok_count == len(QUESTIONS), report.summary()
    assert convert(cfg, store).num_samples == len(QUESTIONS)
    out = served["root"] / "train"
    job = TrainJob(train=cfg.train, run_dir=cfg.run_dir, model_dir=str(model), out_dir=str(out), device="cpu")
    with Trainer.build(job) as t:
        t.run()
    ckpt = resolve_checkpoint(out / "checkpoints")
    export = export_draft(ckpt, Path(cfg.run_dir), model, Path(cfg.run_dir) / "draft" / "exports" / "x")
    facts = read_model_facts(model)
    three = eagle3_layers(facts.num_layers)  # the EAGLE-3 draft reads three of the store's five
    assert export.aux_layers == three
    assert export.sglang_layer_ids == sglang_layer_ids(facts.model_type, three, facts.num_layers).layer_ids

    view = served["root"] / "sglang_view.safetensors"
    env = {**{k: v for k, v in os.environ.items() if k != "EAGLE3_CPU_SPEC"},
           "SGLANG_USE_CPU_ENGINE": "1", "LD_LIBRARY_PATH": str(SGLANG_PYTHON.parent.parent / "stub")}  # fmt: skip
    proc = subprocess.run(
        [str(SGLANG_PYTHON), str(HERE / "sglang_load_draft.py"), "--draft", export.out_dir, "--target", str(model),
         "--out", str(view), "--port", str(free_port())],
        cwd=served["root"], env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    with safe_open(str(view), "pt") as f:
        meta = json.loads(f.metadata()["result"])
    assert meta["class"] == "LlamaForCausalLMEagle3" and meta["draft_layer_ids"] == export.sglang_layer_ids
    assert meta["target_layers_to_capture"] == three  # what the target captures when serving this draft

    offline = evaluate_offline(cfg.evaluate, Path(cfg.run_dir), model, ckpt)
    assert offline.identical_to_greedy == offline.num_prompts == 2
    print(f"\nFIGURES {served['arch']}: sglang store, offline acceptance {offline.acceptance_length:.3f}")


def test_a_block_drafter_trains_on_the_sglang_store_and_sglangs_loader_takes_it_or_is_refused_up_front(
    served: dict[str, Any],
) -> None:
    """DFlash (issue #46) from the same 5-layer SGLang store: a few steps, the export, and SGLang's own loader in draft
    mode next to this target, which captures exactly the store's five layers; a family SGLang 0.5.23 has no DFlash
    capture for is refused before the first step, naming the family."""
    cfg, model, root = served["cfg"], served["model"], served["root"]
    convert(cfg, served["store"])  # done already when the test above ran (a finished convert does no work)
    facts = read_model_facts(model)
    train = cfg.train.model_copy(update={"method": "dflash", "block_size": 4, "max_steps": 2})
    job = TrainJob(train=train, run_dir=cfg.run_dir, model_dir=str(model), out_dir=str(root / "dflash"), device="cpu")
    try:
        dflash_rule_of(facts.model_type)
    except MethodError:
        with pytest.raises((MethodError, TrainError), match=rf"model_type '{facts.model_type}'.*no DFlash capture"):
            Trainer.build(job).close()
        return
    with Trainer.build(job) as t:
        assert t.aux_layers == five_layers(facts.num_layers)  # the store's five, as they are
        t.run()
    export = export_draft(resolve_checkpoint(root / "dflash"), Path(cfg.run_dir), model, root / "dflash-export")
    assert export.speculative_algorithm == "DFLASH" and export.aux_layers == five_layers(facts.num_layers)
    view = root / "sglang_block_view.safetensors"
    env = {**{k: v for k, v in os.environ.items() if k != "EAGLE3_CPU_SPEC"},
           "SGLANG_USE_CPU_ENGINE": "1", "LD_LIBRARY_PATH": str(SGLANG_PYTHON.parent.parent / "stub")}  # fmt: skip
    proc = subprocess.run(
        [str(SGLANG_PYTHON), str(HERE / "sglang_load_block_draft.py"), "--draft", export.out_dir, "--target",
         str(model), "--out", str(view), "--port", str(free_port()), "--block-size", "4", "--algorithm", "DFLASH"],
        cwd=root, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    with safe_open(str(view), "pt") as f:
        meta = json.loads(f.metadata()["result"])
        loaded = {k.removeprefix("param.") for k in f.keys()}  # noqa: SIM118  (safe_open is not iterable)
    assert meta["class"] == "DFlashDraftModel" and meta["num_context_features"] == 5
    assert meta["target_layers_to_capture"] == five_layers(facts.num_layers)  # what serving feeds the draft
    ours = {k for k in load_file(str(Path(export.out_dir) / "model.safetensors")) if k not in ("d2t", "t2d")}
    fused = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}
    covered = {k.replace(f, part) for k in loaded for f, parts in fused.items() if f".{f}." in k for part in parts}
    assert ours == covered | {k for k in loaded if not any(f".{f}." in k for f in fused)}  # nothing missing or extra


@pytest.mark.parametrize("arch", sorted(SGLANG_FAILS))
def test_sglang_cannot_run_this_architecture_on_cpu_for_the_stated_reason(
    arch: str, tiny_models: dict[str, Path], tmp_path: Path
) -> None:
    """When this fails because the server started, SGLang runs the architecture on CPU now: move it to
    SGLANG_RUNS and update docs/models.md."""
    require_sglang_env()
    model = tiny_models[arch]
    cfg = sglang_pipeline_config(tmp_path, model, arch)
    with pytest.raises(ServerError) as e:
        server = start_server(cfg, model, tmp_path / "dump")
        server.stop()
    log = (Path(cfg.run_dir) / "server" / "sglang.log").read_text()
    reasons = [SGLANG_FAILS[arch]] + ([SGLANG_FAILS_RACING[arch]] if arch in SGLANG_FAILS_RACING else [])
    assert any(all(line in log for line in lines) for lines in reasons), str(e.value)[-2000:]


@pytest.mark.parametrize("arch", SGLANG_NOT_FINITE)
def test_sglang_serves_this_architecture_on_cpu_but_its_hidden_states_are_not_finite(
    arch: str, tiny_models: dict[str, Path], tmp_path: Path, demo_tokenizer: Any
) -> None:
    """When this fails, SGLang's CPU MoE computes numbers now: move the architecture to SGLANG_RUNS (its parity
    test then says whether they are right) and update docs/models.md."""
    from eagle3.extract.engines.base import Dumped
    from eagle3.store.sample_format import read_sample
    from tests.integration.sglang_support import prepared

    require_sglang_env()
    model = tiny_models[arch]
    cfg = sglang_pipeline_config(tmp_path, model, arch)
    samples = prepared(demo_tokenizer, ["The capital of France is Paris.", "A short one."])
    server = start_server(cfg, model, tmp_path / "dump")
    try:
        engine = SGLangEngine(cfg, model, "nan", tmp_path / "dump", server=server)
        dumps = [read_sample(o.path) for o in engine.extract(samples) if isinstance(o, Dumped)]
    finally:
        server.stop()
    # The layer convention is checked all the same: qwen3_moe.py's +1 rule, as the hook saw SGLang resolve it.
    facts = read_model_facts(model)
    aux = five_layers(facts.num_layers)  # the store's five (sglang_pipeline_config)
    assert engine.info.aux_layers == aux and engine.info.engine_layer_ids == [i - 1 for i in aux]
    workers = [s for s in proto.read_statuses(tmp_path / "dump") if s["status"] == "worker"]
    assert workers and all(w["layers_to_capture"] == aux and w["problem"] is None for w in workers)
    assert len(dumps) == len(samples)
    for d in dumps:
        assert bool(d.aux_hidden_states[:, 0].float().isfinite().all()) is False  # HF index 2: after the first MoE
        assert bool(d.last_hidden_state.float().isnan().any())
