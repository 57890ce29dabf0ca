"""Offline acceptance: speculative greedy decoding with the transformers target and a trained draft, against
plain greedy decoding of the same target on the same held-out prompts. Batch 1, temperature 0.

    result = evaluate_offline(cfg.evaluate, run_dir, model_dir, checkpoint)   # the stage: all of the below
    sets = load_eval_sets(cfg.evaluate, chat)                                 # evaluate.sets, named, with categories
    result = offline_sets(model_dir, checkpoint, run_dir, sets, chain_lengths=[3, 5], max_new_tokens=64)
    result.runs                                                               # every (set, k); top level: the first
    write_offline_result(run_dir, result)                                     # <run_dir>/eval/offline.json

The decode loops are in decode.py (one verify round: propose, verify, accept, roll back).

Acceptance length is SGLang's: tokens emitted per verify round = accepted drafts + 1, in [1, k + 1]. Per
position j, the rate is P(d_j accepted | d_1..d_{j-1} accepted). The last round of a prompt drafts only what the
token budget can still take. When an accepted draft is a stop token, it ends the round in the bonus token's place:
the drafts before it are the accepted ones, and the positions from it on are not counted.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from pydantic import BaseModel, ConfigDict, Field

from eagle3.config import EvaluateConfig
from eagle3.data.chat import ChatTokenizer, RowError
from eagle3.data.eval_sets import EvalError, chat_rows, humaneval_rows, prompt_conversation
from eagle3.data.generate import stop_token_ids
from eagle3.data.tool_calls import has_tools
from eagle3.device import resolve_device, torch_device
from eagle3.draft.checkpoint import resolve_checkpoint
from eagle3.draft.load import load_draft
from eagle3.draft.method import Drafter
from eagle3.evaluate.sizes import new_tokens, sized_here
from eagle3.evaluate.speculative import Decoded, Round, StepTimes, Target, greedy_decode, speculative_decode, sync
from eagle3.progress import ProgressCounter, ProgressFn, no_progress
from eagle3.store.fsio import atomic_write_json, read_json
from eagle3.store.paths import FIRST_METHOD, RunPaths
from eagle3.store.run_store import DTYPES, RunStore, read_record
from eagle3.target.load import load_causal_lm

OFFLINE_FORMAT = "eagle3-eval-offline/3"  # 3: the modelled speed-up
LABEL = "offline, transformers, this device"


@dataclass
class EvalPrompts:
    """One named evaluation set, loaded: token ids per prompt (chat template applied) and each row's category."""

    name: str
    kind: str
    dataset: str
    ids: list[list[int]]
    categories: list[str | None]
    skipped: str | None = None  # why the set is not evaluated with this target (then no ids): recorded, not decoded


def carries_tools(row: dict[str, Any]) -> bool:
    """The row's prompt has tools or tool calls (a row that cannot be read says so where the set is loaded)."""
    try:
        return has_tools(*prompt_conversation(row))
    except RowError:
        return False


def load_eval_set(
    name: str, dataset: str, chat: ChatTokenizer, *, limit: int | None = None, fmt: str = "chat", kind: str = ""
) -> EvalPrompts:
    """The first `limit` prompts of a set, each in the chat template with the generation prompt."""
    if fmt == "humaneval":
        rows: list[tuple[int, dict[str, Any] | None, str | None]] = [
            (i, r, None) for i, r in enumerate(humaneval_rows(dataset))
        ]
    else:
        rows = chat_rows(Path(dataset))
    out = EvalPrompts(name, kind, dataset, [], [])
    if chat.call_arguments is None:  # the template prints no tool calls: a tool-call set cannot be asked as served
        tooled = next((n for n, data, _ in rows if data is not None and carries_tools(data)), None)
        if tooled is not None:
            out.skipped = (f"{dataset} row {tooled} carries tools and the target's chat template has no tool "
                           "support (it does not print tool calls): set data.chat_template to the model's "
                           "tool-calling template (a Jinja file) to evaluate this set")  # fmt: skip
            return out
    for number, data, error in rows:
        if limit is not None and len(out.ids) >= limit:
            break
        try:
            if data is None:
                raise RowError(error or "unreadable row")
            messages, tools = prompt_conversation(data)  # a tool-call conversation: its tools, as served
            text = chat.render(messages, add_generation_prompt=True, tools=tools)
        except RowError as e:
            raise EvalError(
                f"{dataset} row {number}: {e}; fix the row or point evaluate set {name!r} elsewhere"
            ) from None
        category = data.get("category")
        out.ids.append(list(chat.tokenizer(text, add_special_tokens=False)["input_ids"]))
        out.categories.append(str(category) if category is not None else None)
    if not out.ids:
        raise EvalError(f"{dataset}: no prompts; evaluate set {name!r} needs at least one row")
    return out


def load_eval_prompts(path: Path, chat: ChatTokenizer, limit: int | None = None) -> list[list[int]]:
    """Token ids of each row's prompt (prompt_messages), in the chat template with the generation prompt (as the
    target sees a request). Rows as data.dataset's (ShareGPT or OpenAI messages)."""
    return load_eval_set("evaluate.dataset", str(path), chat, limit=limit).ids


def load_eval_sets(cfg: EvaluateConfig, chat: ChatTokenizer) -> list[EvalPrompts]:
    """Every set of cfg.eval_sets(), loaded."""
    cfg = sized_here(cfg)
    return [
        load_eval_set(s.name, s.dataset, chat, limit=s.num_prompts or cfg.num_prompts, fmt=s.format, kind=s.kind)
        for s in cfg.eval_sets()
    ]


def aux_layers_of(run_dir: Path) -> list[int]:
    """The store's aux layers (HF hidden_states indices) from run.json: the layers the draft was trained on."""
    store = RunStore(run_dir)
    info = store.read_run_info()
    if info is None:
        raise EvalError(f"{store.run_json} missing: evaluate needs the run directory the draft was trained from")
    if info.tap != "residual":  # the target here hands the draft its hidden_states: the residual stream
        raise EvalError(
            f"{store.run_json}: the store holds the {info.tap!r} tap, and the offline evaluator feeds the draft the "
            "residual stream (HF hidden_states): the draft would be measured on states it was not trained on"
        )
    return list(info.aux_layers)


# statistics ---------------------------------------------------------------------------------------------------------
class PositionStats(BaseModel):
    model_config = ConfigDict(extra="forbid")
    position: int  # j, 1-based
    reached: int  # rounds that drafted position j with d_1..d_{j-1} accepted
    accepted: int  # rounds that accepted d_1..d_j
    rate: float | None  # accepted / reached (None when never reached)


class PromptStats(BaseModel):
    model_config = ConfigDict(extra="forbid")
    prompt_tokens: int
    new_tokens: int
    rounds: int
    accepted: int
    identical_to_greedy: bool
    category: str | None = None


class CategoryStats(BaseModel):
    """Acceptance over the prompts of one category (rounds pooled, as for the whole set)."""

    model_config = ConfigDict(extra="forbid")
    category: str
    num_prompts: int
    rounds: int
    accepted_tokens: int
    acceptance_length: float
    positions: list[PositionStats]


MODELLED_FORMULA = "speed-up = tau * t_step / (t_verify + t_draft)"


class ModelledSpeedup(BaseModel):
    """The speed-up the measured forward times give at this acceptance length, with the formula written out: the
    offline loop's wall clock also pays Python and the transformers cache, which a serving engine does not."""

    model_config = ConfigDict(extra="forbid")
    formula: str = MODELLED_FORMULA
    acceptance_length: float  # tau
    target_step_s: float  # t_step: one plain decode forward of the target (one token)
    verify_s: float  # t_verify: the target's forward over [last, d1..dk], per round
    draft_s: float  # t_draft: the draft's work per round (its forwards for the k proposals and the catch-up)
    speedup: float


def modelled_speedup(decoded: Sequence[Decoded], acceptance_length: float, target_step_s: float) -> ModelledSpeedup:
    """tau tokens per round at the cost of one verify forward and one round of drafting, against one token per plain
    decode forward; on a GPU t_verify ~ t_step (memory-bound), on a CPU it grows with k."""
    verify, draft = StepTimes(), StepTimes()
    for d in decoded:
        verify.add(d.verify.seconds, d.verify.count)
        draft.add(d.draft.seconds, d.draft.count)
    cost = verify.mean + draft.mean
    return ModelledSpeedup(
        acceptance_length=acceptance_length, target_step_s=target_step_s, verify_s=verify.mean, draft_s=draft.mean,
        speedup=acceptance_length * target_step_s / cost if cost > 0 else 0.0,
    )  # fmt: skip


class SkippedSet(BaseModel):
    """An evaluation set left out for this target (EvalPrompts.skipped): a tool-call set on a template without
    tool support."""

    model_config = ConfigDict(extra="forbid")
    name: str
    kind: str
    dataset: str
    reason: str


class OfflineEvalResult(BaseModel):
    model_config = ConfigDict(extra="forbid")
    format: str = OFFLINE_FORMAT
    label: str = LABEL
    model_dir: str
    checkpoint: str
    aux_layers: list[int]
    steps: int
    method: str = "eagle3"  # train.method of the draft (eagle3/draft/methods.py)
    max_new_tokens: int
    device: str
    dtype: str
    torch_threads: int
    num_prompts: int
    rounds: int  # verify rounds over all prompts
    accepted_tokens: int  # accepted drafted tokens over all rounds
    generated_tokens: int  # new tokens of the speculative runs, the prefill's first token included
    acceptance_length: float  # tokens per verify round, accepted + 1 (SGLang's definition), in [1, steps + 1]
    tokens_per_verify: float  # generated_tokens / rounds: SGLang's per-request completion_tokens / spec_verify_ct
    accepted_histogram: list[int]  # rounds by accepted count 0..steps
    positions: list[PositionStats]
    identical_to_greedy: int  # prompts whose speculative output equals plain greedy decoding token for token
    mismatched_prompts: list[int]
    greedy_tokens_per_s: float
    speculative_tokens_per_s: float
    speedup: float  # speculative / greedy tokens per second
    modelled: ModelledSpeedup | None = None  # from the measured forward times (ModelledSpeedup's formula)
    greedy_s: float
    speculative_s: float
    elapsed_s: float
    per_prompt: list[PromptStats]
    set_name: str = "held-out"  # evaluate.sets[].name
    set_kind: str = "held-out"
    dataset: str = ""
    categories: list[CategoryStats] = []  # when the set's rows have categories
    runs: list[OfflineEvalResult] = Field(
        default_factory=list, description="eval/offline.json: every (set, k); the top level repeats the first"
    )
    skipped: list[SkippedSet] = Field(
        default_factory=list, description="the sets not evaluated with this target, each with its reason"
    )


def evaluated(sets: Sequence[EvalPrompts]) -> list[EvalPrompts]:
    """The sets decoded with this target (the skipped ones left out); at least one."""
    out = [s for s in sets if s.skipped is None]
    if not out:
        reasons = "; ".join(f"{s.name}: {s.skipped}" for s in sets)
        raise EvalError(f"no evaluation set can be evaluated with this target ({reasons})")
    return out


#: Context-length buckets of the evaluation artifact (prompt tokens): acceptance falls with context for drafts that
#: never saw long ones (docs/performance.md), so each bucket is reported on its own.
CONTEXT_BUCKETS = ((0, 2048), (2048, 8192), (8192, 32768), (32768, None))


@dataclass(frozen=True)
class ContextBucket:
    low: int
    high: int | None
    num_prompts: int
    rounds: int
    acceptance_length: float

    @property
    def label(self) -> str:
        return f"{self.low // 1024}K+" if self.high is None else f"{self.low // 1024}-{self.high // 1024}K"


def context_buckets(per_prompt: Sequence[PromptStats]) -> list[ContextBucket]:
    """Acceptance length over the prompts whose context falls in each CONTEXT_BUCKETS bucket (rounds pooled), the
    empty buckets left out."""
    out = []
    for low, high in CONTEXT_BUCKETS:
        inside = [p for p in per_prompt if p.prompt_tokens >= low and (high is None or p.prompt_tokens < high)]
        rounds = sum(p.rounds for p in inside)
        if inside:
            tau = 1 + sum(p.accepted for p in inside) / rounds if rounds else 0.0
            out.append(ContextBucket(low, high, len(inside), rounds, tau))
    return out


def acceptance_stats(rounds: Sequence[Round], steps: int) -> tuple[list[int], list[PositionStats]]:
    """Rounds by accepted count, and per-position reached/accepted counts."""
    histogram = [0] * (steps + 1)
    positions = []
    for r in rounds:
        histogram[r.accepted] += 1
    for j in range(1, steps + 1):
        reached = sum(1 for r in rounds if r.drafted >= j and r.accepted >= j - 1)
        accepted = sum(1 for r in rounds if r.accepted >= j)
        rate = accepted / reached if reached else None
        positions.append(PositionStats(position=j, reached=reached, accepted=accepted, rate=rate))
    return histogram, positions


def category_stats(decoded: Sequence[Decoded], categories: Sequence[str | None], steps: int) -> list[CategoryStats]:
    """Per category (rows without one are left out), in first-seen order."""
    out = []
    for c in dict.fromkeys(c for c in categories if c is not None):
        rounds = [r for d, dc in zip(decoded, categories, strict=True) if dc == c for r in d.rounds]
        accepted = sum(r.accepted for r in rounds)
        out.append(CategoryStats(
            category=c, num_prompts=sum(dc == c for dc in categories), rounds=len(rounds), accepted_tokens=accepted,
            acceptance_length=1 + accepted / len(rounds) if rounds else 0.0,
            positions=acceptance_stats(rounds, steps)[1],
        ))  # fmt: skip
    return out


def evaluate_drafter(
    target: Target,
    drafter: Drafter,
    prompts: Sequence[Sequence[int]],
    *,
    steps: int,
    max_new_tokens: int,
    progress: ProgressFn = no_progress,
) -> tuple[list[Decoded], list[list[int]], dict[str, float]]:
    """Speculative and plain greedy decoding of every prompt, interleaved per prompt so both see the same machine
    load; after a short untimed warm-up of both. Returns the decodes, the greedy outputs and the timings."""
    counter = ProgressCounter("evaluate", len(prompts), progress)
    decoded, reference, times, spec_s = decode_chains(target, drafter, prompts, [steps], max_new_tokens, counter)
    counter.finish()
    return decoded[steps], reference, {**times, "speculative_s": spec_s[steps]}


def decode_chains(
    target: Target,
    drafter: Drafter,
    prompts: Sequence[Sequence[int]],
    chain_lengths: Sequence[int],
    max_new_tokens: int,
    counter: ProgressCounter,
) -> tuple[dict[int, list[Decoded]], list[list[int]], dict[str, float], dict[int, float]]:
    """Per prompt: plain greedy decoding once, then speculative decoding at each chain length k (the acceptance at
    k=3 is not derivable from a k=5 run: the draft's chain and the target's cache differ after the first round
    that accepts 4 or 5). Returns decodes per k, greedy outputs, greedy timings (`greedy_s`, and `target_step_s`:
    one decode forward's mean) and speculative seconds per k."""
    decoded: dict[int, list[Decoded]] = {k: [] for k in chain_lengths}
    spec_s = {k: 0.0 for k in chain_lengths}
    reference, greedy_s, target_step = [], 0.0, StepTimes()
    with torch.inference_mode():
        warm = min(8, max_new_tokens)
        greedy_decode(target, prompts[0], warm)
        speculative_decode(target, drafter, prompts[0], steps=chain_lengths[0], max_new_tokens=warm)
        for prompt in prompts:
            sync(target.device)
            t0 = time.perf_counter()
            reference.append(greedy_decode(target, prompt, max_new_tokens, target_step))
            sync(target.device)
            greedy_s += time.perf_counter() - t0
            for k in chain_lengths:
                t1 = time.perf_counter()
                decoded[k].append(speculative_decode(target, drafter, prompt, steps=k, max_new_tokens=max_new_tokens))
                sync(target.device)
                spec_s[k] += time.perf_counter() - t1
            counter.add(1, tokens=len(decoded[chain_lengths[0]][-1].tokens))
    return decoded, reference, {"greedy_s": greedy_s, "target_step_s": target_step.mean}, spec_s


def summarize(
    decoded: Sequence[Decoded],
    reference: Sequence[list[int]],
    times: dict[str, float],
    prompts: Sequence[Sequence[int]],
    *,
    steps: int,
    categories: Sequence[str | None] | None = None,
    **fields: Any,
) -> OfflineEvalResult:
    cats = list(categories) if categories is not None else [None] * len(decoded)
    rounds = [r for d in decoded for r in d.rounds]
    histogram, positions = acceptance_stats(rounds, steps)
    accepted = sum(r.accepted for r in rounds)
    generated = sum(len(d.tokens) for d in decoded)
    greedy_tokens = sum(len(r) for r in reference)
    greedy_tps = greedy_tokens / times["greedy_s"] if times["greedy_s"] > 0 else 0.0
    spec_tps = generated / times["speculative_s"] if times["speculative_s"] > 0 else 0.0
    same = [d.tokens == r for d, r in zip(decoded, reference, strict=True)]
    tau = 1 + accepted / len(rounds) if rounds else 0.0
    return OfflineEvalResult(
        steps=steps,
        num_prompts=len(decoded),
        rounds=len(rounds),
        accepted_tokens=accepted,
        generated_tokens=generated,
        acceptance_length=tau,
        tokens_per_verify=generated / len(rounds) if rounds else 0.0,
        accepted_histogram=histogram,
        positions=positions,
        identical_to_greedy=sum(same),
        mismatched_prompts=[i for i, s in enumerate(same) if not s],
        greedy_tokens_per_s=greedy_tps,
        speculative_tokens_per_s=spec_tps,
        speedup=spec_tps / greedy_tps if greedy_tps > 0 else 0.0,
        modelled=modelled_speedup(decoded, tau, times["target_step_s"]) if "target_step_s" in times else None,
        greedy_s=times["greedy_s"],
        speculative_s=times["speculative_s"],
        torch_threads=torch.get_num_threads(),
        per_prompt=[
            PromptStats(
                prompt_tokens=len(p),
                new_tokens=len(d.tokens),
                rounds=len(d.rounds),
                accepted=sum(r.accepted for r in d.rounds),
                identical_to_greedy=s,
                category=c,
            )
            for p, d, s, c in zip(prompts, decoded, same, cats, strict=True)
        ],
        categories=category_stats(decoded, cats, steps),
        **fields,
    )


# entry points -------------------------------------------------------------------------------------------------------
def load_target(model_dir: Path, aux_layers: list[int], *, device: str, dtype: str) -> Target:
    if dtype not in DTYPES:
        raise EvalError(f"dtype {dtype!r}: expected one of {sorted(DTYPES)}")
    model = load_causal_lm(Path(model_dir), DTYPES[dtype], torch_device(device))
    chat = ChatTokenizer.from_model_dir(Path(model_dir))
    return Target(model, list(aux_layers), frozenset(stop_token_ids(model, chat)))


def offline_acceptance(
    model_dir: Path,
    checkpoint: Path,
    run_dir_or_aux_layers: Path | Sequence[int],
    prompts: Sequence[Sequence[int]],
    *,
    steps: int,
    max_new_tokens: int,
    device: str = "auto",
    dtype: str = "float32",
    progress: ProgressFn = no_progress,
) -> OfflineEvalResult:
    """Acceptance of the draft in `checkpoint` (a step directory, a checkpoints root or a training out_dir) on one
    set of prompts at one chain length, and the offline speed of speculative vs plain greedy decoding."""
    one = EvalPrompts("held-out", "held-out", "", [list(p) for p in prompts], [None] * len(prompts))
    return offline_sets(model_dir, checkpoint, run_dir_or_aux_layers, [one], chain_lengths=[steps],
                        max_new_tokens=max_new_tokens, device=device, dtype=dtype, progress=progress)  # fmt: skip


def offline_sets(
    model_dir: Path,
    checkpoint: Path,
    run_dir_or_aux_layers: Path | Sequence[int],
    sets: Sequence[EvalPrompts],
    *,
    chain_lengths: Sequence[int],
    max_new_tokens: int,
    device: str = "auto",
    dtype: str = "float32",
    progress: ProgressFn = no_progress,
) -> OfflineEvalResult:
    """Acceptance on every set at every chain length: the first set at the first k at the top level, all of them
    (set by set, k by k) in `runs`, the skipped sets (EvalPrompts.skipped) in `skipped`. `dtype` is the target's
    (evaluate.offline_dtype)."""
    start = time.monotonic()
    skipped = [SkippedSet(name=s.name, kind=s.kind, dataset=s.dataset, reason=s.skipped) for s in sets if s.skipped]
    sets = evaluated(sets)
    if any(not s.ids for s in sets):
        raise EvalError("no prompts to evaluate")
    if isinstance(run_dir_or_aux_layers, str | Path):
        store_layers = aux_layers_of(Path(run_dir_or_aux_layers))
    else:
        store_layers = list(run_dir_or_aux_layers)
    path = resolve_checkpoint(Path(checkpoint))
    loaded = load_draft(Path(model_dir), path, device=torch_device(device))
    aux_layers = loaded.aux_layers if loaded.aux_layers is not None else store_layers
    missing = [x for x in aux_layers if x not in store_layers]
    num_aux = loaded.model.cfg.num_aux  # type: ignore[union-attr]
    if missing or num_aux != len(aux_layers):
        raise EvalError(
            f"{path}: the draft reads {num_aux} aux states (layers {aux_layers}), the store has aux layers "
            f"{store_layers}: pass the run directory it was trained on"
        )
    target = load_target(Path(model_dir), aux_layers, device=device, dtype=dtype)
    loaded.model.to(target.device)
    drafter, ks = loaded.drafter(), list(chain_lengths)
    counter = ProgressCounter("evaluate", sum(len(s.ids) for s in sets), progress)
    runs = []
    for one in sets:
        set_start = time.monotonic()
        decoded, reference, times, spec_s = decode_chains(target, drafter, one.ids, ks, max_new_tokens, counter)
        for k in ks:
            runs.append(summarize(
                decoded[k], reference, {**times, "speculative_s": spec_s[k]}, one.ids, steps=k,
                categories=one.categories, model_dir=str(model_dir), checkpoint=str(path), aux_layers=aux_layers,
                method=loaded.method.name,
                max_new_tokens=max_new_tokens, device=str(target.device), dtype=dtype,
                elapsed_s=time.monotonic() - set_start, set_name=one.name, set_kind=one.kind, dataset=one.dataset,
            ))  # fmt: skip
    counter.finish()
    return runs[0].model_copy(update={"runs": runs, "skipped": skipped, "elapsed_s": time.monotonic() - start})


def run_of(result: OfflineEvalResult, set_name: str, steps: int) -> OfflineEvalResult | None:
    """The (set, k) run of an eval/offline.json result."""
    return next((r for r in result.runs if r.set_name == set_name and r.steps == steps), None)


def offline_dtype(cfg: EvaluateConfig, store_dtype: str) -> str:
    """evaluate.offline_dtype resolved: `auto` is float32 on CPU (exact there; SmolLM2 decodes 22 tok/s vs bf16 33
    on one thread of the dev box), else the store's dtype."""
    if cfg.offline_dtype != "auto":
        return cfg.offline_dtype
    return "float32" if resolve_device(cfg.device) == "cpu" else store_dtype


def read_offline_result(run_dir: Path, method: str = FIRST_METHOD) -> OfflineEvalResult | None:
    """The method's eval/offline.json; None when there is none or it is of an older format (it is measured again)."""
    path = RunPaths(run_dir).method(method).offline_eval_json
    if not path.is_file() or read_json(path).get("format") != OFFLINE_FORMAT:
        return None
    return read_record(path, OfflineEvalResult)


def write_offline_result(run_dir: Path, result: OfflineEvalResult, path: Path | None = None) -> Path:
    """`path` (default <run_dir>/eval/offline.json), atomically."""
    path = RunPaths(run_dir).offline_eval_json if path is None else Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(path, result.model_dump(mode="json"))
    return path


def evaluate_offline(
    cfg: EvaluateConfig,
    run_dir: Path,
    model_dir: Path,
    checkpoint: Path,
    *,
    sets: Sequence[EvalPrompts] | None = None,
    progress: ProgressFn = no_progress,
    out: Path | None = None,
) -> OfflineEvalResult:
    """The evaluate stage's offline part: the evaluation sets (`sets`, else cfg.eval_sets() read), each at every
    chain length of cfg.chain_lengths(), on cfg.device, the target in cfg.offline_dtype, written to `out`
    (default <run_dir>/eval/offline.json)."""
    info = RunStore(run_dir).require_run_info("evaluate needs the run directory the draft was trained from")
    if sets is None:
        sets = load_eval_sets(cfg, ChatTokenizer.from_model_dir(Path(model_dir)))
    result = offline_sets(
        model_dir,
        checkpoint,
        info.aux_layers,
        sets,
        chain_lengths=cfg.chain_lengths(),
        max_new_tokens=new_tokens(cfg),
        device=cfg.device,
        dtype=offline_dtype(cfg, info.dtype),
        progress=progress,
    )
    write_offline_result(run_dir, result, out)
    return result
