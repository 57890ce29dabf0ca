"""synthesize: regenerate every assistant turn with the target model, then re-tokenize into prepared/.

    prepared/ (source) ─► turn-by-turn batched generation ─► synthesized/shard-00000.jsonl
                       ─► write_prepared (the same tokenization as prepare) ─► prepared/ (target's answers)

Each assistant turn is generated from the conversation so far, with earlier assistant turns already
regenerated. synthesized/manifest.json records what the generations depend on (source fingerprint,
model fingerprint, dtype, synthesize config); a shard file that exists under a matching manifest is
complete and never regenerated. Sampling is seeded per shard, so skipping a shard changes nothing else.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from eagle3.chat import ChatTokenizer, Message
from eagle3.config import PipelineConfig, ServerConfig, SynthesizeConfig
from eagle3.fsio import atomic_write_json, atomic_write_text, read_json
from eagle3.model_files import model_fingerprint, tokenizer_fingerprint
from eagle3.prepare import RawRow, dataset_fingerprint, is_current, prepare, read_json_lines, write_prepared
from eagle3.progress import ProgressCounter, ProgressFn, no_progress
from eagle3.store import DTYPES, PreparedManifest, RunStore


class SynthesizedKey(BaseModel):
    """synthesized/manifest.json: everything the generated text depends on."""

    model_config = ConfigDict(extra="forbid")

    format: str = "eagle3-synthesized/1"
    source_fingerprint: str
    model_sha256: str
    dtype: str
    synthesize: dict

    def fingerprint(self) -> str:
        return hashlib.sha256(json.dumps(self.model_dump(mode="json"), sort_keys=True).encode()).hexdigest()


def synthesized_dir(store: RunStore) -> Path:
    return store.root / "synthesized"


def synthesized_shard_path(store: RunStore, shard: int) -> Path:
    return synthesized_dir(store) / f"shard-{shard:05d}.jsonl"


def _claim_dir(store: RunStore, key: SynthesizedKey) -> None:
    """Keep shard files made under the same key; otherwise clear them and record the new key."""
    path = synthesized_dir(store) / "manifest.json"
    if path.is_file() and read_json(path) == key.model_dump(mode="json"):
        return
    for old in synthesized_dir(store).glob("shard-*.jsonl"):
        old.unlink()
    atomic_write_json(path, key.model_dump(mode="json"))


# generation --------------------------------------------------------------------------------------
def resolve_device(server: ServerConfig) -> str:
    import torch

    if server.device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return server.device


def load_model(model_dir: Path, server: ServerConfig) -> Any:
    from transformers import AutoModelForCausalLM

    dtype = DTYPES[server.dtype]
    if resolve_device(server) == "cuda":  # spread over the visible GPUs when one does not hold the model
        model: Any = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype, device_map="auto")
    else:
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype)  # loads on the CPU
    return model.eval()


def stop_token_ids(model: Any, chat: ChatTokenizer) -> list[int]:
    """End-of-turn token of the template, the tokenizer's eos and the generation config's eos ids."""
    tok = chat.tokenizer
    ids = {tok.eos_token_id} if tok.eos_token_id is not None else set()
    if chat.end_of_turn is not None:
        ids.add(tok.convert_tokens_to_ids(chat.end_of_turn))
    gen_eos = getattr(model.generation_config, "eos_token_id", None)
    ids.update([gen_eos] if isinstance(gen_eos, int) else gen_eos or [])
    return sorted(ids)


def generate_batch(
    model: Any, chat: ChatTokenizer, prompts: list[str], scfg: SynthesizeConfig
) -> list[tuple[str, bool, int]]:
    """Left-padded batched generation; per prompt (text, finished: a stop token came, tokens generated)."""
    import torch

    tok = chat.tokenizer
    stops = stop_token_ids(model, chat)
    pad = tok.pad_token_id if tok.pad_token_id is not None else stops[0]
    if tok.pad_token_id is None:  # many chat models (Llama 3) ship none; padding is masked out anyway
        tok.pad_token_id = pad
    enc = tok(prompts, add_special_tokens=False, padding=True, padding_side="left", return_tensors="pt")
    enc = enc.to(model.device)
    sampled = scfg.temperature > 0
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
        )
    new = out[:, enc["input_ids"].shape[1] :].tolist()  # [B, <= max_new_tokens]
    results = []
    for ids in new:
        cut = next((i for i, t in enumerate(ids) if t in stops), None)
        text = tok.decode(ids[:cut] if cut is not None else ids, skip_special_tokens=True).strip()
        results.append((text, cut is not None, len(ids) if cut is None else cut + 1))
    return results


def regenerate(
    model: Any, chat: ChatTokenizer, convs: list[list[Message]], scfg: SynthesizeConfig, counter: ProgressCounter
) -> tuple[list[list[Message]], list[int]]:
    """Regenerate the assistant turns of convs round by round (round r = every conversation's r-th
    assistant turn), so each turn sees the earlier regenerated ones. Returns the conversations and,
    per conversation, how many turns hit max_new_tokens."""
    convs = [[dict(m) for m in c] for c in convs]
    turns = [[i for i, m in enumerate(c) if m["role"] == "assistant"] for c in convs]
    unfinished = [0] * len(convs)
    rounds = max((len(t) for t in turns), default=0)
    for r in range(rounds):
        todo = [(ci, t[r]) for ci, t in enumerate(turns) if len(t) > r]
        prompts = {ci: chat.render(convs[ci][:mi], add_generation_prompt=True) for ci, mi in todo}
        todo.sort(key=lambda x: len(prompts[x[0]]))  # similar lengths together: less padding
        for b in range(0, len(todo), scfg.batch_size):
            batch = todo[b : b + scfg.batch_size]
            outs = generate_batch(model, chat, [prompts[ci] for ci, _ in batch], scfg)
            done = tokens = 0
            for (ci, mi), (text, finished, n_tokens) in zip(batch, outs, strict=True):
                convs[ci][mi] = {"role": "assistant", "content": text}
                unfinished[ci] += 0 if finished else 1
                done += r == len(turns[ci]) - 1  # a conversation counts once its last turn is generated
                tokens += n_tokens
            counter.add(done, tokens=tokens)  # once per batch: a per-sample report would see 1 of 50 done
    return convs, unfinished


# stage -------------------------------------------------------------------------------------------
def _synthesized_rows(store: RunStore, num_shards: int) -> Iterator[RawRow]:
    for shard in range(num_shards):
        path = synthesized_shard_path(store, shard)
        for raw in read_json_lines(path, f"{path}"):
            origin = raw.data.get("source") if raw.data else None
            yield RawRow(raw.file, raw.row, raw.data, raw.error, origin=origin)


def synthesize(
    cfg: PipelineConfig, store: RunStore, model_dir: Path, report: ProgressFn = no_progress
) -> PreparedManifest:
    """Replace the assistant turns in prepared/ with the target model's own; no generation when done."""
    import torch

    chat = ChatTokenizer.from_model_dir(model_dir)
    tok_sha = tokenizer_fingerprint(model_dir)
    source_fp = dataset_fingerprint(cfg.data)
    key = SynthesizedKey(
        source_fingerprint=source_fp,
        model_sha256=model_fingerprint(model_dir),
        dtype=cfg.server.dtype,
        synthesize=cfg.synthesize.model_dump(mode="json"),
    )
    current = store.read_prepared_manifest()
    if is_current(current, store, key.fingerprint(), tok_sha, cfg.data):
        assert current is not None
        return current
    source = current if is_current(current, store, source_fp, tok_sha, cfg.data) else None
    source = source or prepare(cfg, store, model_dir, report)  # prepared/ may hold an older synthesis
    _claim_dir(store, key)
    counter = ProgressCounter("synthesize", source.num_samples, report)
    model = None
    for shard, n in enumerate(source.shards):
        out = synthesized_shard_path(store, shard)
        if out.is_file():
            counter.add(n, skipped=n)
            continue
        model = model if model is not None else load_model(model_dir, cfg.server)
        table = store.read_prepared_shard(shard).to_pydict()
        convs = [json.loads(m) for m in table["messages"]]
        if cfg.synthesize.temperature > 0:
            torch.manual_seed(cfg.synthesize.seed + shard)
        new, unfinished = regenerate(model, chat, convs, cfg.synthesize, counter)
        records = [
            {"source": src, "source_sample_id": sid, "unfinished_turns": u, "messages": msgs}
            for src, sid, u, msgs in zip(table["source"], table["sample_id"], unfinished, new, strict=True)
        ]
        atomic_write_text(out, "".join(json.dumps(rec, ensure_ascii=False) + "\n" for rec in records))
    counter.finish()
    return write_prepared(
        _synthesized_rows(store, len(source.shards)),
        chat,
        cfg.data,
        store,
        dataset=f"synthesized:{cfg.data.dataset}",
        fingerprint=key.fingerprint(),
        tokenizer_sha256=tok_sha,
        total=source.num_samples,
        report=report,
        stage="synthesize-tokenize",
        fmt="openai",
    )
