"""What synthesized answers depend on, apart from the rows: the one key that decides whether a synthesis grows,
is made again, or (once samples were extracted) is refused.

    SynthesizedKey   synthesized/manifest.json: model, tokenizer, dtype, data settings, generation settings
    settings_fingerprint   the key plus on_truncated: recorded in prepared/manifest.json (`synthesis`)
    check_synthesis  before any stage writes: refuse a store whose samples were made under other settings

The rows are not in the key: a grown dataset keeps every generation and answers only its new prompts.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from eagle3.config import PipelineConfig
from eagle3.store.fsio import read_json
from eagle3.store.run_store import DATA_MIX_KEYS, PreparedManifest, RunStore
from eagle3.target.files import model_fingerprint, tokenizer_fingerprint

FORMAT = "eagle3-synthesized/3"
SYNTH = "synthesized:"  # PreparedManifest.dataset of a synthesized prepared/ (eagle3.data.synthesize)


class SynthesisMixError(ValueError):
    """The store holds samples synthesized under other settings; the message names the keys and the fix."""


class SynthesizedKey(BaseModel):
    """synthesized/manifest.json: everything the generated text depends on, except which rows there are."""

    model_config = ConfigDict(extra="forbid")

    format: str = FORMAT
    model_sha256: str
    tokenizer_sha256: str  # tokenizer and chat template of the model directory
    dtype: str
    data: dict  # data.DATA_MIX_KEYS: max_length, truncate, chat_template, chat_template_kwargs
    synthesize: dict  # SynthesizeConfig.generation_key(): sampling settings, max_new_tokens, samples_per_prompt
    # the source preparation the files are keyed by (its shards, by index): prepared again from scratch (before
    # extraction, on another data setting), it has other shards and the generations are cleared. Not a setting.
    source_prepared_at: str = ""

    def fingerprint(self) -> str:
        """Of the settings (not source_prepared_at)."""
        key = self.model_dump(mode="json", exclude={"source_prepared_at"})
        return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()


def synthesized_key(cfg: PipelineConfig, model_dir: Path) -> SynthesizedKey:
    data = cfg.data.model_dump(mode="json")
    return SynthesizedKey(
        model_sha256=model_fingerprint(model_dir),
        tokenizer_sha256=tokenizer_fingerprint(model_dir),
        dtype=cfg.server.dtype,
        data={k: data[k] for k in DATA_MIX_KEYS},
        synthesize=cfg.synthesize.generation_key(),
    )


def settings_fingerprint(key: SynthesizedKey, on_truncated: str) -> str:
    """What a synthesized prepared/ was made under (its `synthesis.settings_fingerprint`)."""
    return hashlib.sha256(f"{key.fingerprint()}:on_truncated={on_truncated}".encode()).hexdigest()


def synthesis_fingerprint(settings: str, source_fingerprint: str) -> str:
    """The dataset fingerprint of a synthesized prepared/: its settings and the source rows it answers."""
    return hashlib.sha256(f"{settings}:{source_fingerprint}".encode()).hexdigest()


def key_differences(old: dict, new: SynthesizedKey) -> list[str]:
    """The keys in which a recorded synthesized/manifest.json differs from `new`, as config keys where they are."""
    now = new.model_dump(mode="json")
    names = {"model_sha256": "model (model_sha256)", "tokenizer_sha256": "tokenizer or chat template "
             "(tokenizer_sha256)", "dtype": "server.dtype", "format": "synthesized/manifest.json format"}  # fmt: skip
    diffs = []
    for k in ("format", "model_sha256", "tokenizer_sha256", "dtype"):
        if old.get(k) != now[k]:
            diffs.append(f"{names[k]}: store has {old.get(k)!r}, now {now[k]!r}")
    for section in ("data", "synthesize"):
        before, after = old.get(section) or {}, now[section]
        for k in sorted(set(before) | set(after)):
            if before.get(k) != after.get(k):
                diffs.append(f"{section}.{k}: store has {before.get(k)!r}, now {after.get(k)!r}")
    return diffs


def legacy_current(cfg: PipelineConfig, store: RunStore, model_dir: Path, source_fingerprint: str) -> bool:
    """Whether prepared/ is a synthesis written before synthesis could grow (eagle3-synthesized/2) of exactly these
    inputs (`source_fingerprint`: eagle3.data.prepare.dataset_fingerprint) and settings: it is used as it is (an
    unchanged re-run does nothing); it cannot grow."""
    prepared = store.read_prepared_manifest()
    path = store.synthesized_manifest_path
    if prepared is None or prepared.synthesis is not None or not prepared.dataset.startswith(SYNTH):
        return False
    old = read_json(path) if path.is_file() else {}
    if old.get("format") != "eagle3-synthesized/2":
        return False
    old_fp = hashlib.sha256(json.dumps(old, sort_keys=True).encode()).hexdigest()
    same = {
        "source_fingerprint": source_fingerprint,
        "model_sha256": model_fingerprint(model_dir),
        "dtype": cfg.server.dtype,
        "engine": cfg.server.engine,
        "synthesize": cfg.synthesize.generation_key(),
    }
    truncation = hashlib.sha256(f"{old_fp}:on_truncated={cfg.synthesize.on_truncated}".encode()).hexdigest()
    return all(old.get(k) == v for k, v in same.items()) and prepared.dataset_fingerprint == truncation


def check_synthesis(
    cfg: PipelineConfig, store: RunStore, model_dir: Path, source_fingerprint: str | None = None
) -> None:
    """Refuse, before anything is written, a run that would add answers synthesized under other settings to a
    store whose samples were extracted (run.json exists). Before extraction any change simply synthesizes again.
    `source_fingerprint` (the dataset's, when the caller has it): a synthesis from before synthesis could grow
    passes when it is exactly of these inputs and settings (legacy_current)."""
    if store.read_run_info() is None:
        return
    if source_fingerprint is not None and legacy_current(cfg, store, model_dir, source_fingerprint):
        return
    prepared = store.read_prepared_manifest()
    key = synthesized_key(cfg, model_dir)
    diffs: list[str] = []
    if prepared is not None and prepared.synthesis is None and prepared.dataset.startswith(SYNTH):
        diffs.append(
            "synthesized/manifest.json format: the store was synthesized by a version that could not grow a "
            f"synthesis (before {FORMAT}); it is used as it is only with its own inputs and settings"
        )
    elif prepared is not None and prepared.synthesis is None:
        diffs.append(
            "synthesize: the store's samples were extracted from the dataset's own answers (prepared without "
            "the synthesize stage); the target's answers would be mixed with them"
        )
    elif store.synthesized_manifest_path.is_file():
        diffs += key_differences(read_json(store.synthesized_manifest_path), key)
        if not diffs and prepared is not None and not _same_truncation(prepared, key, cfg):
            diffs.append(f"synthesize.on_truncated: now {cfg.synthesize.on_truncated!r}, the store was made with "
                         "the other setting")  # fmt: skip
    if diffs:
        raise SynthesisMixError(
            f"{store.root} holds samples synthesized differently:\n  " + "\n  ".join(diffs) + "\n"
            "New answers would be mixed with these. Set the keys back, or choose a new run_dir for the new "
            "settings (run_dir may contain {date} or {model_sha}: docs/formats.md)."
        )


def _same_truncation(prepared: PreparedManifest, key: SynthesizedKey, cfg: PipelineConfig) -> bool:
    assert prepared.synthesis is not None
    return prepared.synthesis.settings_fingerprint == settings_fingerprint(key, cfg.synthesize.on_truncated)
