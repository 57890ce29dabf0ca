"""The `prompts` stage: a varied prompt corpus, built offline by the target itself (docs/corpus.md).

    grid (topics x tasks x formats, data/prompt_grid.yaml) ─► prompts.self_instruct cells (seeded shuffle)
        ─► per cell: the target writes one user request ─► <out>/samples/<prompt id>.json (atomic, one per cell)
    + requests of prompts.include files
        ─► clean, drop too short ─► drop near evaluation prompts ─► drop near-duplicates (eagle3/data/dedup.py)
        ─► <out>/prompts.jsonl (rows: the request and an assistant turn for synthesize to answer)
        ─► <out>/summary.json (how many were written, dropped and why)

`data.dataset` (or a `data.sources` entry) names <out>/prompts.jsonl; synthesize then answers every request with
the target (synthesize.samples_per_prompt answers each, synthesize.user_turns more turns). Until synthesize has
answered them, the rows' assistant turns are the placeholder PENDING_ANSWER: never train on prepared data of
this file without synthesize.

Resumable per request: a request's file is written the moment it is generated, under a key of what it depends
on (<out>/manifest.json: model, dtype, engine, prompts' generation settings; a change clears them); a re-run
generates only the cells with no file. A prompt id is sha256 of the cell's text and its repeat, so a grid edit
keeps the requests of the cells it left alone. Both engines write requests: transformers in this process
(batched, each row with its own seed), sglang through the run's servers (eagle3/serving/generation.py).
"""

from __future__ import annotations

import concurrent.futures as cf
import hashlib
import json
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from eagle3.config import EvaluateConfig, PipelineConfig, SynthesizeConfig
from eagle3.data.chat import ChatTokenizer, Message, RowError
from eagle3.data.dedup import dedup, normalize
from eagle3.data.generate import (
    HEARTBEAT_S,
    LockedCounter,
    Turn,
    generate_batches,
    load_model,
    prompt_ids,
    stop_token_ids_of,
    turn_of,
)
from eagle3.data.user_turns import clean_user_text, request_messages, sample_seed
from eagle3.progress import ProgressCounter, ProgressFn, no_progress
from eagle3.serving.generation import GenerationClient, GenerationFailed, Server
from eagle3.store.fsio import atomic_write_json, atomic_write_text, claim_keyed, read_json, safe_name
from eagle3.store.paths import RunPaths
from eagle3.target.files import model_fingerprint

PENDING_ANSWER = "(to be answered by the target in synthesize)"  # never trained on: synthesize replaces it


class PromptsError(RuntimeError):
    """The stage cannot run; the message names the file or key and the fix."""


class Grid(BaseModel):
    model_config = ConfigDict(extra="forbid")

    topics: list[str] = Field(min_length=1)
    tasks: list[str] = Field(min_length=1)
    formats: list[str] = Field(min_length=1)

    def size(self) -> int:
        return len(self.topics) * len(self.tasks) * len(self.formats)

    def cell(self, index: int) -> tuple[str, str, str]:
        topic, rest = divmod(index, len(self.tasks) * len(self.formats))
        task, fmt = divmod(rest, len(self.formats))
        return self.topics[topic], self.tasks[task], self.formats[fmt]


class PromptsKey(BaseModel):
    """<out>/manifest.json: what a written request depends on."""

    model_config = ConfigDict(extra="forbid")

    format: str = "eagle3-prompts/1"
    model_sha256: str
    dtype: str
    engine: str
    prompts: dict[str, Any]
    chat_template: dict[str, Any]


class PromptsSummary(BaseModel):
    """<out>/summary.json: the last run of the stage."""

    model_config = ConfigDict(extra="forbid")

    cells: int  # grid cells asked for (prompts.self_instruct)
    generated: int  # requests written by the last run (the others were there before)
    failed: list[str] = Field(default_factory=list)  # "<prompt id>: reason"; retried by the next run
    included: int = 0  # requests read from prompts.include
    too_short: int = 0  # written requests with fewer than prompts.min_words words (or none)
    near_eval: int = 0  # dropped: near a prompt of an evaluation set
    near_duplicates: int = 0  # dropped: near an earlier prompt of the corpus
    prompts: int = 0  # rows of prompts.jsonl
    examples_dropped: list[str] = Field(default_factory=list)  # a few "<origin>: reason" lines
    tokens: int = 0
    elapsed_s: float = 0.0


@dataclass(frozen=True)
class Cell:
    """One request to write: grid cell `index`, its `repeat`-th time (when self_instruct exceeds the grid)."""

    id: str
    index: int
    repeat: int
    topic: str
    task: str
    format: str

    def messages(self) -> list[Message]:
        return request_messages(self.topic, self.task, self.format)

    def origin(self) -> str:
        return f"self-instruct:{self.topic} | {self.task} | {self.format}"


def out_dir(cfg: PipelineConfig) -> Path:
    return Path(cfg.prompts.out_dir) if cfg.prompts.out_dir else RunPaths(cfg.run_dir).prompts_dir


def corpus_path(cfg: PipelineConfig) -> Path:
    return out_dir(cfg) / "prompts.jsonl"


def checkpoint_path(out: Path, prompt_id: str) -> Path:
    return out / "samples" / f"{safe_name(prompt_id)}.json"


def load_grid(path: str | Path) -> Grid:
    try:
        raw = yaml.safe_load(Path(path).read_text())
        return Grid.model_validate(raw)
    except FileNotFoundError:
        raise PromptsError(f"prompts.grid: {path} does not exist (the shipped grid is data/prompt_grid.yaml)") from None
    except (yaml.YAMLError, ValidationError) as e:
        raise PromptsError(f"prompts.grid: {path} needs non-empty lists `topics`, `tasks`, `formats`: {e}") from None


def prompt_id(topic: str, task: str, fmt: str, repeat: int) -> str:
    return hashlib.sha256(f"{topic}\0{task}\0{fmt}\0{repeat}".encode()).hexdigest()[:16]


def pick_cells(grid: Grid, count: int, seed: int) -> list[Cell]:
    """`count` cells: a seeded shuffle of the whole grid, again (repeat 1, 2, ...) when count exceeds it."""
    cells: list[Cell] = []
    repeat = 0
    while len(cells) < count:
        order = list(range(grid.size()))
        random.Random(f"{seed}:{repeat}").shuffle(order)
        for index in order[: count - len(cells)]:
            topic, task, fmt = grid.cell(index)
            cells.append(Cell(prompt_id(topic, task, fmt, repeat), index, repeat, topic, task, fmt))
        repeat += 1
    return cells


# evaluation prompts: never in the corpus ---------------------------------------------------------------------
def prompt_text(messages: Sequence[Message]) -> str:
    """What near-duplicate removal compares: the user turns of a prompt, joined."""
    return "\n".join(m["content"] for m in messages if m["role"] == "user")


def eval_prompt_texts(evaluate: EvaluateConfig) -> list[tuple[str, str]]:
    """(label, text) of every prompt of every evaluation set (all rows, not only the evaluated ones)."""
    from eagle3.data.eval_sets import chat_rows, humaneval_rows, prompt_messages

    out = []
    for s in evaluate.eval_sets():
        if s.format == "humaneval":
            rows: list[tuple[int, dict[str, Any] | None]] = list(enumerate(humaneval_rows(s.dataset)))
        elif Path(s.dataset).is_file():
            rows = [(n, data) for n, data, _ in chat_rows(Path(s.dataset))]
        else:
            raise PromptsError(
                f"evaluate set {s.name!r}: {s.dataset} does not exist; prompts.exclude_eval needs every evaluation "
                "set's prompts (fix the path, or set prompts.exclude_eval=false)"
            )
        for n, data in rows:
            try:
                if data is not None:
                    out.append((f"evaluation set {s.name} row {n}", prompt_text(prompt_messages(data))))
            except RowError:
                continue  # a row evaluate itself refuses: it is never evaluated on either
    return out


def included_prompts(paths: Sequence[str]) -> list[tuple[str, list[Message]]]:
    """(origin, prompt turns) of every row of the prompts.include files."""
    from eagle3.config import DataConfig
    from eagle3.data.eval_sets import prompt_messages
    from eagle3.data.prepare import PrepareError, read_rows

    out = []
    for path in paths:
        try:
            _, rows = read_rows(DataConfig.model_validate({"dataset": path}))
            for raw in rows:
                if raw.data is None:
                    continue
                try:
                    out.append((f"{raw.file}:{raw.row}", prompt_messages(raw.data)))
                except RowError:
                    continue
        except PrepareError as e:
            raise PromptsError(f"prompts.include: {e}") from None
    return out


# generation: both engines -------------------------------------------------------------------------------------
def write_requests(
    cfg: PipelineConfig,
    chat: ChatTokenizer,
    model_dir: Path,
    cells: Sequence[Cell],
    counter: LockedCounter,
    on_done: Callable[[Cell, Turn], None],
    on_failed: Callable[[Cell, str], None],
    servers: Sequence[Server] | None,
) -> None:
    """Each cell's request, generated with its own seed (prompts.seed, the prompt id)."""
    p = cfg.prompts
    scfg = SynthesizeConfig.model_validate(
        {
            **cfg.synthesize.model_dump(),
            "max_new_tokens": p.max_new_tokens,
            "temperature": p.temperature,
            "top_p": p.top_p,
            "seed": p.seed,
            "samples_per_prompt": 1,
            "user_turns": 0,
        }
    )
    if cfg.server.engine == "sglang":
        _write_served(cfg, scfg, chat, model_dir, cells, counter, on_done, on_failed, servers)
        return
    model = load_model(model_dir, cfg.server)
    rendered: list[tuple[Cell, str]] = []
    for cell in cells:
        try:
            rendered.append((cell, chat.render(cell.messages(), add_generation_prompt=True)))
        except RowError as e:
            on_failed(cell, str(e))
    rendered.sort(key=lambda x: len(x[1]))  # similar lengths together: less padding
    sampling = [(scfg.temperature, sample_seed(scfg.seed, c.id, 0)) for c, _ in rendered]
    batches = generate_batches(model, chat, [t for _, t in rendered], scfg, lambda n: counter.add(0, tokens=n),
                               sampling)  # fmt: skip
    for first, outs in batches:
        for (cell, _), turn in zip(rendered[first : first + len(outs)], outs, strict=True):
            on_done(cell, turn)


def _write_served(
    cfg: PipelineConfig,
    scfg: SynthesizeConfig,
    chat: ChatTokenizer,
    model_dir: Path,
    cells: Sequence[Cell],
    counter: LockedCounter,
    on_done: Callable[[Cell, Turn], None],
    on_failed: Callable[[Cell, str], None],
    servers: Sequence[Server] | None,
) -> None:
    from eagle3.store.dump_protocol import run_id_of

    if not servers:
        raise ValueError("server.engine is sglang: the prompts stage needs the run's SGLang servers")
    for server in servers:
        server.start()
    stops = stop_token_ids_of(model_dir, chat)

    with GenerationClient(servers, scfg, stop_ids=stops, run_id=run_id_of(Path(cfg.run_dir))) as client:

        def work(cell: Cell) -> int:
            try:
                out = client.generate(prompt_ids(chat, cell.messages()), sample_id=f"p{cell.id}", turn=0,
                                      seed=sample_seed(scfg.seed, cell.id, 0))  # fmt: skip
            except (RowError, GenerationFailed) as e:
                on_failed(cell, str(e))
                return 0
            turn = turn_of(chat, out.output_ids, client.stop_ids, out.finish_reason)
            on_done(cell, turn)
            return turn.tokens

        with cf.ThreadPoolExecutor(scfg.concurrency, thread_name_prefix="eagle3-prompts") as pool:
            running = {pool.submit(work, c) for c in cells}
            while running:
                done, running = cf.wait(running, timeout=HEARTBEAT_S, return_when=cf.FIRST_COMPLETED)
                counter.add(0, tokens=sum(f.result() for f in done))


# the stage ----------------------------------------------------------------------------------------------------
def _claim(out: Path, key: PromptsKey) -> None:
    """Keep the requests written under the same key; otherwise clear them and record the new key."""
    samples = out / "samples"
    samples.mkdir(parents=True, exist_ok=True)
    claim_keyed(out / "manifest.json", key.model_dump(mode="json"), lambda: samples.glob("*.json"), samples)


def build_prompts(
    cfg: PipelineConfig,
    model_dir: Path,
    report: ProgressFn = no_progress,
    *,
    servers: Sequence[Server] | None = None,
) -> PromptsSummary:
    """Write the missing requests, then (always: it is cheap) assemble <out>/prompts.jsonl and summary.json."""
    p = cfg.prompts
    out = out_dir(cfg)
    cells = pick_cells(load_grid(p.grid), p.self_instruct, p.seed) if p.self_instruct else []
    chat = ChatTokenizer.from_model_dir(model_dir, cfg.data)
    key = PromptsKey(
        model_sha256=model_fingerprint(model_dir),
        dtype=cfg.server.dtype,
        engine=cfg.server.engine,
        prompts=p.generation_key(),
        chat_template=cfg.data.model_dump(mode="json", include={"chat_template", "chat_template_kwargs"}),
    )
    _claim(out, key)
    todo = [c for c in cells if not checkpoint_path(out, c.id).is_file()]
    counter = LockedCounter(ProgressCounter("prompts", len(cells), report, every_s=HEARTBEAT_S))
    counter.add(len(cells) - len(todo), skipped=len(cells) - len(todo))
    failed: list[str] = []

    def on_done(cell: Cell, turn: Turn) -> None:
        record = {"id": cell.id, "index": cell.index, "repeat": cell.repeat, "topic": cell.topic, "task": cell.task,
                  "format": cell.format, "text": turn.text, "finish_reason": turn.finish_reason,
                  "tokens": turn.tokens}  # fmt: skip
        atomic_write_json(checkpoint_path(out, cell.id), record)
        counter.add(1)

    def on_failed(cell: Cell, reason: str) -> None:
        with counter.lock:
            failed.append(f"{cell.id}: {reason}")
        counter.add(1, failed=1)

    if todo:
        write_requests(cfg, chat, model_dir, todo, counter, on_done, on_failed, servers)
    final = counter.finish()
    summary = assemble(cfg, out, cells)
    summary = summary.model_copy(
        update={
            "generated": final.done - final.skipped - final.failed,
            "failed": failed,
            "tokens": final.tokens,
            "elapsed_s": round(final.elapsed_s, 3),
        }
    )
    atomic_write_json(out / "summary.json", summary.model_dump(mode="json"))
    return summary


def assemble(cfg: PipelineConfig, out: Path, cells: Sequence[Cell]) -> PromptsSummary:
    """prompts.jsonl from the written requests (in cell order) and the included prompts: cleaned, too-short ones,
    those near an evaluation prompt and near-duplicates dropped. Rewritten only when its text changes."""
    p = cfg.prompts
    candidates: list[tuple[str, list[Message]]] = []
    too_short = 0
    for cell in cells:
        path = checkpoint_path(out, cell.id)
        if not path.is_file():
            continue  # failed this run: the next run writes it
        text = clean_user_text(read_json(path)["text"])
        if len(normalize(text).split()) < p.min_words:
            too_short += 1
            continue
        candidates.append((cell.origin(), [{"role": "user", "content": text}]))
    included = included_prompts(p.include)
    candidates += included
    against = eval_prompt_texts(cfg.evaluate) if p.exclude_eval else []
    kept, dropped = dedup([prompt_text(m) for _, m in candidates], p.dedup_ngram, p.dedup_threshold, against=against)
    near_eval = sum(reason.startswith("near evaluation") for reason in dropped.values())
    lines = []
    for i in kept:
        origin, messages = candidates[i]
        row = {"messages": [*messages, {"role": "assistant", "content": PENDING_ANSWER}], "origin": origin}
        lines.append(json.dumps(row, ensure_ascii=False) + "\n")
    text = "".join(lines)
    path = out / "prompts.jsonl"
    if not (path.is_file() and path.read_text() == text):
        atomic_write_text(path, text)
    examples = [f"{candidates[i][0]}: {reason}" for i, reason in list(dropped.items())[:5]]
    return PromptsSummary(
        cells=len(cells),
        generated=0,
        included=len(included),
        too_short=too_short,
        near_eval=near_eval,
        near_duplicates=len(dropped) - near_eval,
        prompts=len(kept),
        examples_dropped=examples,
    )
