"""Pre-flight: what the run's stages would refuse on this store, refused before the first stage runs.

A store grows (docs/formats.md, "A store grows"): new rows are welcome, another kind of sample is not. Each
stage checks its own part when it runs (prepare: tokenizer and data keys; synthesize: its settings; extract:
model, dtype, store dtype, aux layers); `check_run` asks all of those questions at the start, from the config,
the model directory and the store's records (run.json, prepared/ and synthesized/ manifests), so a night's run
fails in seconds naming the keys instead of at its third stage. It reads no sample file and loads no model.

Every flow asks, before its first stage, what its stages would refuse on the worker it runs on (`check_stages`;
the pipeline's `check_run` includes it): SGLang can serve the draft (check_serving), a device set to `cuda` is there
(device_problems), and the vocabulary map convert built fits `train.draft_vocab_size` (vocab_problems). A fan-out,
whose stages run on its nodes, asks `check_run` all but the devices (`on_nodes`): each node checks its own.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from eagle3.config import PipelineConfig
from eagle3.convert.vocab import vocab_map_sizes
from eagle3.data.prepare import dataset_fingerprint, mixing_differences
from eagle3.data.synthesis_key import SYNTH, check_synthesis
from eagle3.device import nvidia_smi_present, torch_cuda_available
from eagle3.draft.method import MethodError
from eagle3.draft.methods import method_named
from eagle3.extract.shard import store_dtype_of
from eagle3.serving.aux_layers import resolve_aux_layers
from eagle3.serving.launch_args import capture_args_problem, flag_values
from eagle3.serving.layers import eagle3_serving_problem
from eagle3.store.run_store import RunStore
from eagle3.target.families import block_drafter_problem
from eagle3.target.files import (
    hyper_connection_problem,
    model_fingerprint,
    read_model_facts,
    read_target_config,
    tokenizer_fingerprint,
)
from eagle3.target.layout import text_config

NEW_RUN_DIR = (
    "Set the keys back to the store's values, or choose a new run_dir for the new settings (run_dir may contain "
    "{date} or {model_sha}: docs/formats.md)."
)


class PreflightError(ValueError):
    """The run's settings do not fit the store (or each other); the message names the keys and the fix."""


class ServingRefusedError(PreflightError):
    """SGLang cannot feed this target's EAGLE-3 draft what the pipeline stores, and a stage of the run needs it to."""


def check_serving(cfg: PipelineConfig, model_dir: Path) -> None:
    """ServingRefusedError when a stage of `cfg.stages` needs SGLang to serve or capture the target for an EAGLE-3
    draft and it cannot (serving_problem); the flows other than the pipeline run this before their first stage."""
    if problem := serving_problem(cfg, model_dir):
        raise ServingRefusedError(problem)


def check_methods(cfg: PipelineConfig, model_dir: Path) -> None:
    """PreflightError when a method of train.trained_methods() cannot train on the layers the store will hold (the
    store's run.json, or extract.aux_layers when this run extracts), refuses the train settings or the target, or
    cannot draft the evaluation's chain lengths: before any model loads, naming the keys and the fix."""
    stages = set(cfg.stages)
    if not stages & {"train", "evaluate"}:
        return
    train = "train" in stages
    store_layers, where = layers_to_train_on(cfg, model_dir) if train else ([], "")
    target, num_layers = (read_target_config(model_dir), read_model_facts(model_dir).num_layers) if train else ({}, 0)
    for name in cfg.train.trained_methods():
        try:
            method = method_named(name)
            if train:
                method.check(cfg.train, target)
                method.layers(store_layers, num_layers, cfg.train.aux_layers)
        except MethodError as e:
            raise PreflightError(f"train.method {name}: {e} ({where} {store_layers}; model {model_dir})") from None
        most = method.max_draft_steps(cfg.train)
        longer = [k for k in cfg.evaluate.chain_lengths() if most is not None and k > most]
        if "evaluate" in stages and longer:
            raise PreflightError(
                f"evaluate.draft_steps / evaluate.compare_steps {cfg.evaluate.chain_lengths()}: train.method {name} "
                f"drafts at most {most} tokens a round (train.block_size {cfg.train.block_size} less the anchor), not "
                f"{longer}. Set them to {most} or fewer, or raise train.block_size."
            )


def layers_to_train_on(cfg: PipelineConfig, model_dir: Path) -> tuple[list[int], str]:
    """The aux layers the store will hold when training starts, and where they come from."""
    info = RunStore(cfg.run_dir).read_run_info()
    if info is not None and "extract" not in cfg.stages:
        return list(info.aux_layers), f"the store {cfg.run_dir} holds"
    num_layers = read_model_facts(model_dir).num_layers
    return resolve_aux_layers(cfg.extract.aux_layers, num_layers), "extract.aux_layers captures"


def check_stages(
    cfg: PipelineConfig,
    model_dir: Path,
    *,
    train_here: bool | None = None,
    on_nodes: bool = False,
    cuda: Callable[[], bool] = torch_cuda_available,
    gpu_node: Callable[[], bool] = nvidia_smi_present,
) -> None:
    """What the stages of `cfg.stages` would refuse on this worker, refused before the first of them runs: SGLang
    serving (ServingRefusedError), then every device and vocabulary problem in one PreflightError naming the keys
    and the fix. `train_here`: whether training runs in this flow run's worker (None: when train.nodes is 1; the
    nodes of a multi-node training check their own). `on_nodes`: every stage runs on other workers (a fan-out's
    nodes), which check their own devices. `cuda`: this process's torch sees a GPU; `gpu_node`: the node has one (a
    launched SGLang server's `auto`)."""
    check_serving(cfg, model_dir)
    check_methods(cfg, model_dir)
    here = cfg.train.nodes == 1 if train_here is None else train_here
    devices = [] if on_nodes else device_problems(cfg, train_here=here, cuda=cuda, gpu_node=gpu_node)
    problems = devices + vocab_problems(cfg)
    problems += launch_args_problems(cfg)
    problems += length_problems(cfg, model_dir)
    problems += sparse_attention_problems(cfg, model_dir)
    problems += hyper_connection_problems(cfg, model_dir)
    if problems:
        where = "" if on_nodes else ", on this worker"
        raise PreflightError(f"Refused before the first stage{where}:\n  " + "\n  ".join(problems))


def launch_args_problems(cfg: PipelineConfig) -> list[str]:
    """A flag of server.extra_args that would make an SGLang server this run launches skip the capture
    (eagle3.serving.launch_args), naming the stages that launch one: extraction, and live evaluation."""
    launched = cfg.server.url is None and (not cfg.server.servers or any(s.url is None for s in cfg.server.servers))
    users = live_sglang_stages(cfg)
    if "extract" in cfg.stages and cfg.server.engine == "sglang" and launched:
        users.insert(0, "extract (server.engine sglang launches the capturing server)")
    problem = capture_args_problem(cfg.server) if users else None
    return [f"{problem}; {', '.join(users)} would launch SGLang with it"] if problem else []


def device_problems(
    cfg: PipelineConfig, *, train_here: bool, cuda: Callable[[], bool], gpu_node: Callable[[], bool]
) -> list[str]:
    """Each device key set to `cuda` that a stage of this run uses on a worker without CUDA (`auto` resolves where
    the stage runs, so it is never refused)."""
    stages, problems = set(cfg.stages), []

    def refuse(key: str, users: list[str], seen: str) -> None:
        problems.append(
            f"{key}: cuda, but this worker has no CUDA device ({seen}); {', '.join(users)} would fail on it. Set "
            f"{key} to cpu, or to auto (cuda where the worker has one), or run on a work queue whose worker has GPUs."
        )

    if train_here and "train" in stages and cfg.train.device == "cuda" and not cuda():
        refuse("train.device", ["train"], "torch.cuda.is_available() is False")
    if "evaluate" in stages and cfg.evaluate.device == "cuda" and not cuda():
        refuse("evaluate.device", ["evaluate (offline)"], "torch.cuda.is_available() is False")
    if cfg.server.device == "cuda" and not cfg.server.url:
        sglang = cfg.server.engine == "sglang"
        engine: list[str] = [s for s in ("prompts", "synthesize", "extract") if s in stages]
        live = live_sglang_stages(cfg)
        launched = (engine if sglang else []) + (["evaluate (live, SGLang)"] if live else [])
        in_process = [] if sglang else engine
        if launched and not gpu_node():
            refuse("server.device", launched, "no nvidia-smi: SGLang cannot run on a GPU here")
        if in_process and not cuda():
            refuse("server.device", in_process, "server.engine transformers; torch.cuda.is_available() is False")
    return problems


#: SGLang refuses a prompt of min(context, KV pool) - 6 tokens or more (sglang/srt/managers/tp_worker.py:
#: max_req_input_len = min(context_len - 1, kv_capacity - 1) - 5, and managers/utils.py validate_input_length
#: refuses len >= max_req_input_len): the longest prompt it takes is min(context, KV pool) - SGLANG_HELD_BACK.
SGLANG_HELD_BACK = 7


def sglang_longest_prompt(cfg: PipelineConfig, model_dir: Path) -> tuple[int, str] | None:
    """The longest prompt a launched SGLang server of this config takes, and where it comes from; None when it
    cannot be known before the server starts (no server.max_total_tokens: the pool is sized from free memory, and
    the target's context bounds it only)."""
    given = flag_values(cfg.server.extra_args, "--context-length")
    context = text_config(read_target_config(model_dir)).get("max_position_embeddings")
    bounds = [(int(given[-1]), "--context-length in server.extra_args")] if given else []
    if not given and context:
        bounds.append((int(context), f"the target's context (max_position_embeddings of {model_dir})"))
    if cfg.server.max_total_tokens is not None:
        bounds.append((cfg.server.max_total_tokens, "server.max_total_tokens (its KV pool)"))
    if not bounds:
        return None
    tokens, what = min(bounds)
    return tokens - SGLANG_HELD_BACK, f"{what}: {tokens}, less the {SGLANG_HELD_BACK} SGLang holds back"


def length_problems(cfg: PipelineConfig, model_dir: Path) -> list[str]:
    """Extraction through SGLang of a sample longer than the server takes fails that sample after every earlier
    stage ran (prepare caps samples at the target's context, which SGLang takes 7 less of): data.max_length must
    fit the server."""
    if "extract" not in cfg.stages or cfg.server.engine != "sglang" or cfg.server.url:
        return []  # an attached server (server.url): its limits are its own, and its /generate names them
    longest = sglang_longest_prompt(cfg, model_dir)
    if longest is None or cfg.data.max_length <= longest[0]:
        return []
    tokens, why = longest
    return [
        f"data.max_length: {cfg.data.max_length}, but the SGLang server takes prompts of at most {tokens} tokens "
        f"({why}); extraction would fail every longer sample. Set data.max_length to {tokens} or less (prepare "
        "then reports the longer rows as bad rows, or cuts them with data.truncate), or raise "
        "server.max_total_tokens."
    ]


def sparse_attention_problems(cfg: PipelineConfig, model_dir: Path) -> list[str]:
    """DeepSeek Sparse Attention (DeepSeek-V3.2, GLM-5: config `index_topk`) in transformers 5.19 is not causal in a
    prefill longer than index_topk tokens: its indexer picks each query's keys among later tokens too (a tiny
    V3.2's logits at token 10 of 20 change with tokens 11-19; docs/models.md). SGLang's is causal, so a store the
    transformers engine extracts from such samples is not what the server feeds the draft."""
    if "extract" not in cfg.stages or cfg.server.engine != "transformers":
        return []
    text = text_config(read_target_config(model_dir))
    topk = text.get("index_topk")
    if topk is None or cfg.data.max_length <= int(topk):
        return []
    return [
        f"data.max_length: {cfg.data.max_length}, but {model_dir}/config.json's index_topk is {topk} (DeepSeek "
        "Sparse Attention): transformers' prefill of a longer sample lets each token's indexer pick later tokens, "
        "so its hidden states are not the ones SGLang computes and feeds the draft. Set server.engine: sglang, or "
        f"data.max_length to {topk} or less."
    ]


def hyper_connection_problems(cfg: PipelineConfig, model_dir: Path) -> list[str]:
    """A target of several hyper-connection streams (eagle3.target.files.hyper_connection_problem), for the stages
    that run it in this process: synthesize and extract on the transformers engine, and the offline evaluation."""
    in_process = {"evaluate", *(("synthesize", "extract") if cfg.server.engine == "transformers" else ())}
    stages = set(cfg.stages) & in_process
    problem = hyper_connection_problem(model_dir) if stages else None
    return [f"{problem} (stages {', '.join(sorted(stages))})"] if problem else []


def vocab_problems(cfg: PipelineConfig) -> list[str]:
    """Train without convert reads the store's vocab_map.safetensors and index as convert left them: missing, or
    built for another train.draft_vocab_size, the trainer would refuse them after loading."""
    if "train" not in cfg.stages or "convert" in cfg.stages:
        return []
    store = RunStore(cfg.run_dir)
    missing = [p for p in (store.run_json, store.vocab_map_path, store.index_path) if not p.is_file()]
    if missing:
        return [
            f"{', '.join(map(str, missing))} missing: train reads the store and what convert builds. Add extract "
            "and convert to stages (stages: [..., extract, convert, train]), or give the run_dir of a converted store."
        ]
    draft, target = vocab_map_sizes(store.vocab_map_path)
    if cfg.train.draft_vocab_size is None:  # unset: the map convert built is the draft's vocabulary
        return []
    want = min(cfg.train.draft_vocab_size, target)
    if draft == want:
        return []
    return [
        f"{store.vocab_map_path} has {draft} draft ids, train.draft_vocab_size asks {want}. Set "
        f"train.draft_vocab_size: {draft}, or add convert to stages (stages: [convert, train, ...]): convert builds "
        "the map again for the new size."
    ]


def check_run(cfg: PipelineConfig, model_dir: Path, *, on_nodes: bool = False) -> None:
    """Raise PreflightError (or the stage's own refusal: eagle3.data.synthesis_key.SynthesisMixError) naming every
    key in which this run differs from what the store's extracted samples were made with, or that this worker
    cannot run (check_stages; `on_nodes`: the stages run on other workers, which check their own devices). A store
    with no extracted samples (no run.json) takes any settings: its stages prepare again from scratch."""
    if "extract" in cfg.stages:  # the model's depth: refused here rather than once the engine starts
        try:
            resolve_aux_layers(cfg.extract.aux_layers, read_model_facts(model_dir).num_layers)
        except ValueError as e:
            raise PreflightError(f"{e}; model {model_dir}. Fix extract.aux_layers (or leave it unset).") from None
    check_stages(cfg, model_dir, on_nodes=on_nodes)  # SGLang serving, the methods' layers, devices, the vocabulary
    store = RunStore(cfg.run_dir)
    info = store.read_run_info()
    if info is None:
        return
    stages = set(cfg.stages)
    prepared = store.read_prepared_manifest()
    synthesized = prepared is not None and (prepared.synthesis is not None or prepared.dataset.startswith(SYNTH))
    if "synthesize" in stages:
        legacy = prepared is not None and prepared.synthesis is None and prepared.dataset.startswith(SYNTH)
        check_synthesis(cfg, store, model_dir, dataset_fingerprint(cfg.data) if legacy else None)
    elif "prepare" in stages and synthesized:
        raise PreflightError(
            f"{store.root}: stages {cfg.stages} prepare without synthesize, but the store's samples were extracted "
            "from the target's answers (synthesize); the dataset's own answers would be mixed in. Add synthesize "
            "to stages (prepare, synthesize, ...), or choose a new run_dir for a store of the dataset's own answers."
        )
    diffs: list[str] = []
    tok_sha = tokenizer_fingerprint(model_dir)
    if prepared is not None and stages & {"prepare", "synthesize"}:
        diffs += mixing_differences(prepared, tok_sha, cfg.data)
    if stages & {"prepare", "synthesize", "extract"}:
        diffs += extract_differences(cfg, store, model_dir)
    if diffs:
        raise PreflightError(
            f"{store.run_json}: this run's settings differ from those the store's samples were made with:\n  "
            + "\n  ".join(dict.fromkeys(diffs))
            + f"\nNew samples would be mixed with these. {NEW_RUN_DIR}"
        )


def sglang_capture_stages(cfg: PipelineConfig, capture: str = "eagle3") -> list[str]:
    """The stages of this run that need SGLang to capture the target through `capture` ("eagle3": the hook's
    extraction and EAGLE-3 drafts; "dflash": the block drafters' capture), each saying why."""
    stages = set(cfg.stages)
    needs = []
    if capture == "eagle3" and "extract" in stages and cfg.server.engine == "sglang":
        needs.append("extract (server.engine sglang captures the layers)")
    trained = {m: method_named(m).capture for m in cfg.train.trained_methods()}
    methods = ", ".join(m for m, c in trained.items() if c == capture)
    if not methods:
        return needs
    if "export" in stages:
        needs.append(f"export (the {methods} draft's SGLang config names the layers SGLang captures)")
    live = cfg.evaluate.live == "on" or (cfg.evaluate.live == "auto" and Path(cfg.server.python).exists())
    if "evaluate" in stages and live:
        needs.append(f"evaluate (evaluate.live serves the {methods} draft with SGLang)")
    return needs


def live_sglang_stages(cfg: PipelineConfig) -> list[str]:
    """The live evaluation, when this run serves its drafts (of any method) with SGLang."""
    return [s for c in ("eagle3", "dflash") for s in sglang_capture_stages(cfg, c) if s.startswith("evaluate")]


def serving_problem(cfg: PipelineConfig, model_dir: Path) -> str | None:
    """Why a stage of this run would refuse the target because SGLang cannot feed its drafts the stored states (no
    layer-id rule, a family it captures for block drafters only or for EAGLE-3 only, a tap that is not the residual
    stream), naming those stages; None when no stage needs it or SGLang can."""
    target = read_target_config(model_dir)
    problems = []
    for capture, problem_of in (
        ("eagle3", lambda: eagle3_serving_problem(target, cfg.extract.sglang_layer_ids)),
        ("dflash", lambda: block_drafter_problem(target)),
    ):
        needs = sglang_capture_stages(cfg, capture)
        if needs and (problem := problem_of()):
            problems.append(f"{problem}. Refused before the first stage: {'; '.join(needs)} would fail on it")
    return f"{' '.join(problems)} (model {model_dir})." if problems else None


def extract_differences(cfg: PipelineConfig, store: RunStore, model_dir: Path) -> list[str]:
    """run.json's resume keys (eagle3.extract.shard.RESUME_KEYS) against this config and model, as config keys."""
    info = store.read_run_info()
    if info is None:
        return []
    facts = read_model_facts(model_dir)
    now = {
        "model (model_sha256)": (info.model_sha256, model_fingerprint(model_dir)),
        "tokenizer or chat template (tokenizer_sha256)": (info.tokenizer_sha256, tokenizer_fingerprint(model_dir)),
        "server.dtype": (info.dtype, cfg.server.dtype),
        "extract.store_dtype": (info.store_dtype, store_dtype_of(cfg)),
        "extract.aux_layers (HF hidden_states indices)": (
            info.aux_layers,
            resolve_aux_layers(cfg.extract.aux_layers, facts.num_layers),
        ),
    }
    return [f"{k}: store has {old!r}, now {new!r}" for k, (old, new) in now.items() if old != new]
