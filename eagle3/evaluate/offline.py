"""Offline acceptance: speculative greedy decoding with the transformers target and a trained draft, against
plain greedy decoding of the same target on the same held-out prompts. Batch 1, temperature 0.

    result = evaluate_offline(cfg.evaluate, run_dir, model_dir, checkpoint)   # the stage: all of the below
    prompts = load_eval_prompts(Path(cfg.evaluate.dataset), chat, limit=cfg.evaluate.num_prompts)
    result = offline_acceptance(model_dir, checkpoint, run_dir, prompts, steps=3, max_new_tokens=64)
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
from pathlib import Path
from typing import Any

import torch
from pydantic import BaseModel, ConfigDict

from eagle3.chat import ChatTokenizer, RowError, normalize_row
from eagle3.config import DataConfig, EvaluateConfig
from eagle3.draft.checkpoint import resolve_checkpoint
from eagle3.draft.load import load_draft
from eagle3.engines.transformers_engine import load_causal_lm, resolve_device
from eagle3.evaluate.decode import Decoded, Drafter, EagleDrafter, Round, Target, greedy_decode, speculative_decode
from eagle3.fsio import atomic_write_json, read_json
from eagle3.prepare import read_rows
from eagle3.progress import ProgressCounter, ProgressFn, no_progress
from eagle3.store import DTYPES, RunInfo
from eagle3.synthesize import stop_token_ids

OFFLINE_FORMAT = "eagle3-eval-offline/1"
RESULT_FILE = Path("eval") / "offline.json"
LABEL = "offline, transformers, this device"


class EvalError(ValueError):
    """Prompts, run directory or checkpoint unusable for evaluation; the message names the file and the fix."""


# held-out prompts --------------------------------------------------------------------------------------------------
def load_eval_prompts(path: Path, chat: ChatTokenizer, limit: int | None = None) -> list[list[int]]:
    """Token ids of each row's turns before its last assistant turn, in the chat template with the generation
    prompt (as the target sees a request). Rows as data.dataset's (ShareGPT or OpenAI messages)."""
    _, rows = read_rows(DataConfig.model_validate({"dataset": str(path)}))
    prompts: list[list[int]] = []
    for row in rows:
        if limit is not None and len(prompts) >= limit:
            break
        try:
            if row.data is None:
                raise RowError(row.error or "unreadable row")
            messages = normalize_row(row.data)
            last = max(i for i, m in enumerate(messages) if m["role"] == "assistant")
            if last == 0:
                raise RowError("no turn before the assistant turn to use as the prompt")
            text = chat.render(messages[:last], add_generation_prompt=True)
        except RowError as e:
            raise EvalError(f"{path} row {row.row}: {e}; fix the row or point evaluate.dataset elsewhere") from None
        prompts.append(list(chat.tokenizer(text, add_special_tokens=False)["input_ids"]))
    if not prompts:
        raise EvalError(f"{path}: no prompts; evaluate.dataset needs at least one row")
    return prompts


def aux_layers_of(run_dir: Path) -> list[int]:
    """The store's aux layers (HF hidden_states indices) from run.json: the layers the draft was trained on."""
    path = Path(run_dir) / "run.json"
    if not path.is_file():
        raise EvalError(f"{path} missing: evaluate needs the run directory the draft was trained from")
    return list(RunInfo.model_validate(read_json(path)).aux_layers)


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


class OfflineEvalResult(BaseModel):
    model_config = ConfigDict(extra="forbid")
    format: str = OFFLINE_FORMAT
    label: str = LABEL
    model_dir: str
    checkpoint: str
    aux_layers: list[int]
    steps: int
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
    greedy_s: float
    speculative_s: float
    elapsed_s: float
    per_prompt: list[PromptStats]


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


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


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
    with torch.inference_mode():
        warm = min(8, max_new_tokens)
        greedy_decode(target, prompts[0], warm)
        speculative_decode(target, drafter, prompts[0], steps=steps, max_new_tokens=warm)
        counter = ProgressCounter("evaluate", len(prompts), progress)
        decoded, reference, times = [], [], {"greedy_s": 0.0, "speculative_s": 0.0}
        for prompt in prompts:
            _sync(target.device)
            t0 = time.perf_counter()
            reference.append(greedy_decode(target, prompt, max_new_tokens))
            _sync(target.device)
            t1 = time.perf_counter()
            decoded.append(speculative_decode(target, drafter, prompt, steps=steps, max_new_tokens=max_new_tokens))
            _sync(target.device)
            times["greedy_s"] += t1 - t0
            times["speculative_s"] += time.perf_counter() - t1
            counter.add(1, tokens=len(decoded[-1].tokens))
        counter.finish()
    return decoded, reference, times


def summarize(
    decoded: Sequence[Decoded],
    reference: Sequence[list[int]],
    times: dict[str, float],
    prompts: Sequence[Sequence[int]],
    *,
    steps: int,
    **fields: Any,
) -> OfflineEvalResult:
    rounds = [r for d in decoded for r in d.rounds]
    histogram, positions = acceptance_stats(rounds, steps)
    accepted = sum(r.accepted for r in rounds)
    generated = sum(len(d.tokens) for d in decoded)
    greedy_tokens = sum(len(r) for r in reference)
    greedy_tps = greedy_tokens / times["greedy_s"] if times["greedy_s"] > 0 else 0.0
    spec_tps = generated / times["speculative_s"] if times["speculative_s"] > 0 else 0.0
    same = [d.tokens == r for d, r in zip(decoded, reference, strict=True)]
    return OfflineEvalResult(
        steps=steps,
        num_prompts=len(decoded),
        rounds=len(rounds),
        accepted_tokens=accepted,
        generated_tokens=generated,
        acceptance_length=1 + accepted / len(rounds) if rounds else 0.0,
        tokens_per_verify=generated / len(rounds) if rounds else 0.0,
        accepted_histogram=histogram,
        positions=positions,
        identical_to_greedy=sum(same),
        mismatched_prompts=[i for i, s in enumerate(same) if not s],
        greedy_tokens_per_s=greedy_tps,
        speculative_tokens_per_s=spec_tps,
        speedup=spec_tps / greedy_tps if greedy_tps > 0 else 0.0,
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
            )
            for p, d, s in zip(prompts, decoded, same, strict=True)
        ],
        **fields,
    )


# entry points -------------------------------------------------------------------------------------------------------
def load_target(model_dir: Path, aux_layers: list[int], *, device: str, dtype: str) -> Target:
    if dtype not in DTYPES:
        raise EvalError(f"dtype {dtype!r}: expected one of {sorted(DTYPES)}")
    model = load_causal_lm(Path(model_dir), resolve_device(device), DTYPES[dtype])
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
    """Acceptance of the draft in `checkpoint` (a step directory, a checkpoints root or a training out_dir), and
    the offline speed of speculative vs plain greedy decoding. `dtype` is the target's (evaluate.offline_dtype)."""
    start = time.monotonic()
    if not prompts:
        raise EvalError("no prompts to evaluate")
    if isinstance(run_dir_or_aux_layers, str | Path):
        aux_layers = aux_layers_of(Path(run_dir_or_aux_layers))
    else:
        aux_layers = list(run_dir_or_aux_layers)
    target = load_target(Path(model_dir), aux_layers, device=device, dtype=dtype)
    path = resolve_checkpoint(Path(checkpoint))
    draft = load_draft(Path(model_dir), path, device=target.device)
    if draft.cfg.num_aux != len(aux_layers):
        raise EvalError(
            f"{path}: the draft fuses {draft.cfg.num_aux} aux states, the store has {len(aux_layers)} aux layers "
            f"{aux_layers}: pass the run directory it was trained on"
        )
    decoded, reference, times = evaluate_drafter(
        target, EagleDrafter(draft), prompts, steps=steps, max_new_tokens=max_new_tokens, progress=progress
    )
    return summarize(
        decoded,
        reference,
        times,
        prompts,
        steps=steps,
        model_dir=str(model_dir),
        checkpoint=str(path),
        aux_layers=aux_layers,
        max_new_tokens=max_new_tokens,
        device=str(target.device),
        dtype=dtype,
        elapsed_s=time.monotonic() - start,
    )


def offline_dtype(cfg: EvaluateConfig, device: str, store_dtype: str) -> str:
    """evaluate.offline_dtype resolved: `auto` is float32 on CPU (exact there; SmolLM2 decodes 22 tok/s vs bf16 33
    on one thread of the dev box), else the store's dtype."""
    if cfg.offline_dtype != "auto":
        return cfg.offline_dtype
    return "float32" if resolve_device(device).type == "cpu" else store_dtype


def write_offline_result(run_dir: Path, result: OfflineEvalResult) -> Path:
    path = Path(run_dir) / RESULT_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(path, result.model_dump(mode="json"))
    return path


def evaluate_offline(
    cfg: EvaluateConfig,
    run_dir: Path,
    model_dir: Path,
    checkpoint: Path,
    *,
    prompts: Sequence[Sequence[int]] | None = None,
    device: str = "auto",
    progress: ProgressFn = no_progress,
) -> OfflineEvalResult:
    """The evaluate stage's offline part: held-out prompts (`prompts`, else read from cfg.dataset), the target in
    cfg.offline_dtype, the result written to <run_dir>/eval/offline.json."""
    info = RunInfo.model_validate(read_json(Path(run_dir) / "run.json"))
    if prompts is None:
        chat = ChatTokenizer.from_model_dir(Path(model_dir))
        prompts = load_eval_prompts(Path(cfg.dataset), chat, limit=cfg.num_prompts)
    result = offline_acceptance(
        model_dir,
        checkpoint,
        info.aux_layers,
        prompts,
        steps=cfg.draft_steps,
        max_new_tokens=cfg.max_new_tokens,
        device=device,
        dtype=offline_dtype(cfg, device, info.dtype),
        progress=progress,
    )
    write_offline_result(run_dir, result)
    return result
