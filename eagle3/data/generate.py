"""Generation with the target model, shared by the prompts stage (prompts.py), synthesize (synthesize.py) and
the offline evaluator (eagle3/evaluate/offline.py): one way to load the target in this process (load_model, over
eagle3.target.load.load_causal_lm), one stop-token rule (stop_token_ids, stop_token_ids_of), the model's input for a
conversation (prompt_ids) and the text of the generated ids (turn_of), and left-padded batched generation
(generate_batch, generate_batches: our own static-cache loop, eagle3/data/decode_loop.py, on a GPU; transformers'
`generate` otherwise).

    load_model(model_dir, server)             the target, eval mode: spread over the visible GPUs, or on the CPU
    stop_token_ids(model, chat)               the template's end of turn, the tokenizer's and generation config's eos
    generate_batches(model, chat, prompts, …) -> (first index, [Turn]) per batch; a batch the GPU cannot hold is halved
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eagle3.config import ServerConfig, SynthesizeConfig
from eagle3.data.chat import ChatTokenizer, Message, split_reasoning
from eagle3.data.tool_calls import Tool
from eagle3.device import resolve_device
from eagle3.progress import Progress, ProgressCounter
from eagle3.store.fsio import read_json
from eagle3.store.run_store import DTYPES
from eagle3.target.load import load_causal_lm

log = logging.getLogger("eagle3.synthesize")

HEARTBEAT_S = 5.0  # the progress report's longest silence while requests are in flight


@dataclass(frozen=True)
class Turn:
    text: str  # the answer
    finish_reason: str  # "stop" | "length" | what the server said
    tokens: int
    reasoning: str | None = None  # the thinking before `</think>`, kept as the message's reasoning_content
    role: str = "assistant"  # "user": a user turn the target wrote (synthesize.user_turns)

    def message(self) -> Message:
        msg = {"role": "assistant", "content": self.text}
        return msg if self.reasoning is None else {**msg, "reasoning_content": self.reasoning}


# one turn: prompt ids, stop ids, the text of the generated ids --------------------------------------
def prompt_ids(chat: ChatTokenizer, messages: list[Message], tools: list[Tool] | None = None) -> list[int]:
    """The conversation so far, rendered as prepare renders it (with the row's tools), plus the assistant header:
    the model's input."""
    text = chat.render(messages, add_generation_prompt=True, tools=tools)
    return list(chat.tokenizer(text, add_special_tokens=False)["input_ids"])


def stop_token_ids(model: Any, chat: ChatTokenizer) -> list[int]:
    """End-of-turn token of the template, the tokenizer's eos and the generation config's eos ids."""
    return _stop_ids(chat, getattr(model.generation_config, "eos_token_id", None))


def stop_token_ids_of(model_dir: Path, chat: ChatTokenizer) -> list[int]:
    """stop_token_ids without loading the weights (generation_config.json, when the model has one)."""
    path = Path(model_dir) / "generation_config.json"
    eos = read_json(path).get("eos_token_id") if path.is_file() else None
    return _stop_ids(chat, eos)


def _stop_ids(chat: ChatTokenizer, gen_eos: int | list[int] | None) -> list[int]:
    tok = chat.tokenizer
    ids = {tok.eos_token_id} if tok.eos_token_id is not None else set()
    if chat.end_of_turn is not None:
        ids.add(tok.convert_tokens_to_ids(chat.end_of_turn))
    ids.update([gen_eos] if isinstance(gen_eos, int) else gen_eos or [])
    return sorted(ids)


def turn_of(chat: ChatTokenizer, ids: list[int], stops: Sequence[int], finish_reason: str | None = None) -> Turn:
    """The text of generated ids, cut at the first stop token; `finish_reason` None: stop if one came."""
    cut = next((i for i, t in enumerate(ids) if t in stops), None)
    reasoning, text = split_reasoning(
        chat.tokenizer.decode(ids[:cut] if cut is not None else ids, skip_special_tokens=True)
    )
    tokens = len(ids) if cut is None else cut + 1
    return Turn(text, finish_reason or ("stop" if cut is not None else "length"), tokens, reasoning)


# transformers engine ------------------------------------------------------------------------------
def load_model(model_dir: Path, server: ServerConfig) -> Any:
    """The target for in-process generation: spread over the visible GPUs when `server.device` resolves to "cuda"
    (one GPU may not hold it), else on the CPU."""
    on_gpu = resolve_device(server.device) == "cuda"
    return load_causal_lm(model_dir, DTYPES[server.dtype], None if on_gpu else "cpu")


#: Decode steps between two progress reports of generate_batch: each report reads a count off the device, and a
#: read every step serialized the host with the GPU (3x slower on an H200, docs/performance.md "In-process generation").
#: Slow steps (a CPU) report at least every PROGRESS_EVERY_S, where the read costs nothing.
PROGRESS_EVERY_STEPS = 16
PROGRESS_EVERY_S = 2.0
#: Where transformers' generate keeps the static cache (models eagle3.data.decode_loop does not decode: sliding-window
#: layers), prompts are left-padded to a multiple of this many tokens: the cache's length (prompt + max_new_tokens)
#: sets the shapes generate compiles its decode step for, and a new length per batch recorded a new CUDA graph per
#: batch (quality run 8's prompts stage: 9 sizes, 5.7K tok/s; docs/performance.md). Padding is masked out.
STATIC_PAD_MULTIPLE = 64


#: synthesize.batch_size when unset. A CPU decodes a few rows at a time; on a GPU the decode step costs about the
#: same for 1,024 rows as for 64 (it is bound by kernel launches, not memory), and answers ending at their own
#: lengths leave a batch half idle, so more rows pay: quality run 8's synthesize went from 38K tok/s at 1,024 to
#: 44K at 2,048 on an H200 (docs/performance.md). A batch the GPU cannot hold is split (generate_batches).
CPU_BATCH = 8
GPU_BATCH = 2048


def batch_size(model: Any, scfg: SynthesizeConfig) -> int:
    """synthesize.batch_size, or its default for where `model` lives (CPU_BATCH, GPU_BATCH)."""
    if scfg.batch_size is not None:
        return scfg.batch_size
    return GPU_BATCH if next(model.parameters()).device.type == "cuda" else CPU_BATCH


def generate_batches(
    model: Any,
    chat: ChatTokenizer,
    prompts: Sequence[str],
    scfg: SynthesizeConfig,
    on_step: Callable[[int], None],
    sampling: Sequence[tuple[float, int]],
) -> Iterator[tuple[int, list[Turn]]]:
    """generate_batch over `prompts` in batches of batch_size(model, scfg); yields (index of the batch's first
    prompt, its turns). A batch the GPU's memory does not hold is generated again in halves, and the batches after
    it at that size: each row samples from its own seed, so its answer does not depend on the batch it lands in."""
    import torch

    size, i = batch_size(model, scfg), 0
    while i < len(prompts):
        n = min(size, len(prompts) - i)
        try:
            outs = generate_batch(model, chat, list(prompts[i : i + n]), scfg, on_step, sampling[i : i + n])
        except torch.cuda.OutOfMemoryError:
            if n == 1:
                raise
            size = n // 2
            torch.cuda.empty_cache()
            log.warning("a batch of %d prompts does not fit the GPU's memory: batches of %d from here", n, size)
            continue
        yield i, outs
        i += n


def generate_batch(
    model: Any,
    chat: ChatTokenizer,
    prompts: list[str],
    scfg: SynthesizeConfig,
    on_step: Callable[[int], None] | None = None,
    sampling: Sequence[tuple[float, int]] | None = None,
    static_cache: bool | None = None,
) -> list[Turn]:
    """Left-padded batched generation; one Turn per prompt. `on_step(tokens)`: the tokens generated since the last
    call, every PROGRESS_EVERY_STEPS decode steps (or PROGRESS_EVERY_S) and at the end. `sampling`: per prompt
    (temperature, seed): each row draws from its own generator (eagle3/data/row_sampler.py), so a sample's tokens
    do not depend on its batch; None: synthesize.temperature for all, seeds from torch's global RNG. `static_cache`
    (default: on a GPU): a static KV cache decoded by eagle3.data.decode_loop (a CUDA graph per batch on a GPU), or by
    transformers' generate for models that loop does not fit; else `generate` with its dynamic cache. Same tokens
    every way (test_generation.py)."""
    import torch

    from eagle3.data import decode_loop

    tok = chat.tokenizer
    stops = stop_token_ids(model, chat)
    pad = tok.pad_token_id if tok.pad_token_id is not None else stops[0]
    if tok.pad_token_id is None:  # many chat models (Llama 3) ship none; padding is masked out anyway
        tok.pad_token_id = pad
    if static_cache is None:
        static_cache = model.device.type == "cuda"
    own_loop = static_cache and decode_loop.fits(model)
    if own_loop and sampling is None and scfg.temperature > 0:
        sampling = [(scfg.temperature, int(s)) for s in torch.randint(1 << 62, (len(prompts),)).tolist()]
    enc = tok(prompts, add_special_tokens=False, padding=True, padding_side="left", return_tensors="pt",
              pad_to_multiple_of=STATIC_PAD_MULTIPLE if static_cache and not own_loop else None)  # fmt: skip
    enc = enc.to(model.device)
    processors: list[Any] = []
    if sampling is not None and any(t > 0 for t, _ in sampling):
        from eagle3.data.row_sampler import RowSampler

        processors.append(RowSampler(sampling, scfg.top_p, model.device))
    stop_set = torch.tensor(stops, device=model.device)
    report = on_step if on_step is not None else (lambda n: None)

    if own_loop:
        out = decode_loop.decode(model, enc["input_ids"], enc["attention_mask"], scfg.max_new_tokens, stop_set, pad,
                            _Pick(processors), report, PROGRESS_EVERY_STEPS, PROGRESS_EVERY_S)  # fmt: skip
        return [turn_of(chat, ids, stops) for ids in out.tolist()]
    return _generate_hf(
        model, chat, enc, scfg, stops, pad, processors, sampling is None, stop_set, report, static_cache
    )


class _Pick:
    """What generate does with a step's float32 logits (the row sampler, then the most likely token), for
    eagle3.data.decode_loop, which may drop finished rows from the batch (`keep`)."""

    def __init__(self, processors: list[Any]):
        self.processors = processors

    def __call__(self, logits: Any) -> Any:
        for proc in self.processors:
            logits = proc(None, logits)
        return logits.argmax(-1)

    def keep(self, rows: Any) -> None:
        for proc in self.processors:
            proc.keep(rows)


def _generate_hf(
    model: Any,
    chat: ChatTokenizer,
    enc: Any,
    scfg: SynthesizeConfig,
    stops: list[int],
    pad: int,
    processors: list[Any],
    global_rng: bool,
    stop_set: Any,
    report: Callable[[int], None],
    static_cache: bool,
) -> list[Turn]:
    """transformers' generate (a CPU's dynamic cache; the static cache of models decode_loop does not fit)."""
    import torch
    from transformers import LogitsProcessorList, StoppingCriteria, StoppingCriteriaList

    rows = enc["input_ids"].shape[0]
    sampled = scfg.temperature > 0 and global_rng

    class _Steps(StoppingCriteria):  # never stops anything: counts the tokens of the rows still running
        def __init__(self) -> None:
            self.running = torch.ones(rows, dtype=torch.bool, device=model.device)
            self.tokens = torch.zeros((), dtype=torch.long, device=model.device)  # since the last report
            self.steps = 0
            self.last = time.monotonic()

        def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
            self.tokens += self.running.sum()  # on the device: no host sync
            self.running &= ~torch.isin(input_ids[:, -1], stop_set)
            self.steps += 1
            if self.steps % PROGRESS_EVERY_STEPS == 0 or time.monotonic() - self.last >= PROGRESS_EVERY_S:
                self.report()
            return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)

        def report(self) -> None:
            report(int(self.tokens))
            self.tokens.zero_()
            self.last = time.monotonic()

    steps = _Steps()
    with torch.inference_mode():
        out = model.generate(
            **enc,
            max_new_tokens=scfg.max_new_tokens,
            do_sample=sampled,
            temperature=scfg.temperature if sampled else None,
            top_p=scfg.top_p if sampled else None,
            top_k=None,
            eos_token_id=stops,
            pad_token_id=pad,
            stopping_criteria=StoppingCriteriaList([steps]),
            logits_processor=LogitsProcessorList(processors),
            cache_implementation="static" if static_cache else None,
        )
    steps.report()
    new = out[:, enc["input_ids"].shape[1] :].tolist()  # [B, <= max_new_tokens]
    return [turn_of(chat, ids, stops) for ids in new]


class LockedCounter:
    """A ProgressCounter that worker threads share (the report, a Prefect artifact, runs under the lock)."""

    def __init__(self, counter: ProgressCounter):
        self.counter = counter
        self.lock = threading.Lock()

    def add(self, n: int = 1, tokens: int = 0, skipped: int = 0, failed: int = 0) -> None:
        with self.lock:
            self.counter.add(n, tokens=tokens, skipped=skipped, failed=failed)

    def finish(self) -> Progress:
        with self.lock:
            return self.counter.finish()
