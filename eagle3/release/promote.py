"""Drafts are promoted, not overwritten: every export has its own directory, and `draft/current` moves to a new
one only when its evaluation is not worse than the current draft's on every evaluation set both were measured on
(same name, chain length, prompts and settings).

    <run_dir>/draft/exports/<checkpoint>-<sha12>/      one export (eagle3.release.export layout) per trained checkpoint
    <run_dir>/draft/exports/<id>/evaluation.json       EvalRecord: its evaluation and the set it was measured on
    <run_dir>/draft/latest  -> exports/<id>            the newest export (what the evaluate stage measures)
    <run_dir>/draft/current -> exports/<id>            the promoted draft: serve this path
    <run_dir>/draft/promotion.json                     Decision: the last promotion decision and its reason
    <run_dir>/draft/<method>/{exports,latest}          another draft method's (train.method) exports; `current`
                                                       may point into any method's exports: one promoted draft

`latest` and `current` are relative symlinks, each replaced atomically (a new link under a temporary name,
renamed over the old one): a reader sees the old draft or the new one, never a missing or half-written one.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from eagle3.draft.checkpoint import WEIGHTS, resolve_checkpoint
from eagle3.store.fsio import atomic_write_json, fsync_dir, read_json
from eagle3.store.paths import FIRST_METHOD, RunPaths
from eagle3.store.run_store import now, read_record
from eagle3.target.files import sha256_file

EVALUATION = "evaluation.json"
PromotePolicy = Literal["if_not_worse", "always", "never"]


class EvalSet(BaseModel):
    """What makes two evaluations comparable."""

    model_config = ConfigDict(extra="forbid")
    dataset_sha256: str
    num_prompts: int
    max_new_tokens: int
    draft_steps: int
    offline_dtype: str


class SetRecord(BaseModel):
    """Offline acceptance on one named evaluation set at one chain length."""

    model_config = ConfigDict(extra="forbid")
    name: str = Field(description="evaluate.sets[].name")
    eval_set: EvalSet
    acceptance_length: float


class EvalRecord(BaseModel):
    """One export's evaluation, kept beside it. `eval_set` and `acceptance_length`: the first set at draft_steps;
    `sets`: every named set at every chain length (empty in records written before named sets)."""

    model_config = ConfigDict(extra="forbid")
    method: str = Field(FIRST_METHOD, description="train.method of the draft (absent in older records: eagle3)")
    eval_set: EvalSet
    acceptance_length: float = Field(description="offline, tokens per verify round")
    modelled_speed_up: float | None = Field(
        None, description="offline, the first set at draft_steps: tau * t_step / (t_verify + t_draft)"
    )
    sets: list[SetRecord] = Field(default_factory=list)
    live_speed_up: float | None = Field(None, description="live SGLang tokens/s with the draft over without")
    live_device: str | None = None
    flagged: bool = Field(False, description="the live speed-up is below 1.0")


class Decision(BaseModel):
    """draft/promotion.json: whether the candidate became `draft/current`, and why."""

    model_config = ConfigDict(extra="forbid")
    promoted: bool
    reason: str
    method: str = Field(FIRST_METHOD, description="the candidate's train.method")
    chosen: str = Field("", description="with several methods trained: why this method's draft was the candidate")
    candidate: str = Field(description="the evaluated export directory")
    previous: str | None = Field(None, description="draft/current before the decision")
    current: str | None = Field(None, description="draft/current after the decision")
    candidate_eval: EvalRecord
    previous_eval: EvalRecord | None = None
    at: str = Field(default_factory=now)


def read_promotion(run_dir: Path) -> Decision | None:
    """draft/promotion.json: the last promotion decision, None before the first."""
    return read_record(RunPaths(run_dir).promotion_json, Decision)


# paths ---------------------------------------------------------------------------------------------
def drafts_dir(run_dir: Path) -> Path:
    return RunPaths(run_dir).draft_dir


def latest_link(run_dir: Path, method: str = FIRST_METHOD) -> Path:
    """The method's newest export (`draft/latest` for EAGLE-3, `draft/<method>/latest` for another)."""
    return RunPaths(run_dir).method(method).latest


def current_link(run_dir: Path) -> Path:
    return RunPaths(run_dir).draft_current


def export_dir_for(run_dir: Path, checkpoints: Path, method: str = FIRST_METHOD) -> Path:
    """The export directory of the latest checkpoint under `checkpoints`, in the method's exports/: named by its step
    and weights' hash, so re-exporting the same checkpoint finds its directory and a new checkpoint never overwrites
    an older export."""
    ckpt = resolve_checkpoint(checkpoints)
    return RunPaths(run_dir).method(method).exports_dir / f"{ckpt.name}-{sha256_file(ckpt / WEIGHTS)[:12]}"


def point(link: Path, target: Path) -> None:
    """Make `link` a relative symlink to `target`, atomically (rename over the old link)."""
    link.parent.mkdir(parents=True, exist_ok=True)
    tmp = link.with_name(f".{link.name}.tmp-{os.getpid()}")
    tmp.unlink(missing_ok=True)
    os.symlink(os.path.relpath(Path(target).resolve(), link.parent.resolve()), tmp)
    os.replace(tmp, link)
    fsync_dir(link.parent)


def pointed(link: Path) -> Path | None:
    """The export directory `link` points at (resolved), or None when there is no such link or directory."""
    if not link.is_symlink():
        return None
    target = link.resolve()
    return target if target.is_dir() else None


def read_evaluation(export_dir: Path) -> EvalRecord | None:
    p = Path(export_dir) / EVALUATION
    return EvalRecord.model_validate(read_json(p)) if p.is_file() else None


# the decision --------------------------------------------------------------------------------------
def named_sets(r: EvalRecord) -> dict[tuple[str, int], SetRecord]:
    """(set name, k) -> its record; a record without named sets has its one set as ("held-out", k)."""
    sets = r.sets or [SetRecord(name="held-out", eval_set=r.eval_set, acceptance_length=r.acceptance_length)]
    return {(s.name, s.eval_set.draft_steps): s for s in sets}


def compare_sets(new: EvalRecord, old: EvalRecord, tolerance: float) -> tuple[bool, str]:
    """Every (set, k) present in both and measured the same way: the new acceptance length not worse (within
    tolerance). No such set in common: not comparable."""
    a, b = named_sets(new), named_sets(old)
    common = [key for key in a if key in b and a[key].eval_set == b[key].eval_set]
    if not common:
        diffs = [f"{k}: {getattr(old.eval_set, k)!r} -> {getattr(new.eval_set, k)!r}"
                 for k in EvalSet.model_fields if getattr(old.eval_set, k) != getattr(new.eval_set, k)]  # fmt: skip
        return False, (
            f"the current draft was evaluated on other sets (current {sorted(b)}, new {sorted(a)}"
            f"{'; ' + '; '.join(diffs) if diffs else ''}); the two are not comparable. "
            "Set evaluate.promote=always for one run to move draft/current to this draft"
        )
    worse = [
        f"offline acceptance length {a[n, k].acceptance_length:.3f} is worse than the current draft's "
        f"{b[n, k].acceptance_length:.3f} on set {n} (k={k})"
        for n, k in common
        if a[n, k].acceptance_length < b[n, k].acceptance_length * (1 - tolerance)
    ]
    if worse:
        return False, "; ".join(worse)
    text = [f"{n} (k={k}) {a[n, k].acceptance_length:.3f} vs {b[n, k].acceptance_length:.3f}" for n, k in common]
    skipped = sorted(set(a) ^ set(b) | {key for key in a if key in b and key not in common})
    note = f" (not compared, absent from one of them or measured differently: {skipped})" if skipped else ""
    return True, f"offline acceptance length on every set in common, new vs current: {'; '.join(text)}{note}"


def compare_methods(new: EvalRecord, old: EvalRecord, tolerance: float) -> tuple[bool, str]:
    """Drafts of two methods: the modelled speed-up on the same first set, measured the same way."""
    same = (new.eval_set.model_copy(update={"draft_steps": 0}) == old.eval_set.model_copy(update={"draft_steps": 0}))
    if not same or new.modelled_speed_up is None or old.modelled_speed_up is None:
        return False, (
            f"the current draft ({old.method}) and this one ({new.method}) have no modelled speed-up on the same "
            "evaluation set to compare; set evaluate.promote=always for one run to move draft/current to this draft"
        )
    a, b = new.modelled_speed_up, old.modelled_speed_up
    if a < b * (1 - tolerance):
        return False, f"modelled speed-up {a:.3f}x ({new.method}) is below the current {old.method} draft's {b:.3f}x"
    return True, f"modelled speed-up {a:.3f}x ({new.method}) vs the current {old.method} draft's {b:.3f}x"


def choose_method(records: dict[str, EvalRecord]) -> tuple[str, str]:
    """(method, why) among the drafts of several methods trained from one store: the highest modelled speed-up
    on the first evaluation set (acceptance length where a draft has none), each at its own drafting length."""

    def score(m: str) -> float:
        r = records[m]
        return r.modelled_speed_up if r.modelled_speed_up is not None else r.acceptance_length

    ranked = sorted(records, key=score, reverse=True)
    what = "modelled speed-up" if all(r.modelled_speed_up is not None for r in records.values()) else "score"
    text = ", ".join(f"{m} {score(m):.3f}" for m in ranked)
    if len(ranked) == 1:
        return ranked[0], f"{ranked[0]} is the only method trained"
    best, second = ranked[0], ranked[1]
    margin = 100 * (score(best) / score(second) - 1) if score(second) > 0 else float("inf")
    return best, f"{best} wins by {what} ({text}): +{margin:.1f}% over {second}"


def compare(new: EvalRecord, old: EvalRecord | None, tolerance: float, block_flagged: bool) -> tuple[bool, str]:
    """(promote?, why): not worse offline (acceptance length on every named set and chain length both measured
    the same way) and, where both ran live on one device, not slower."""
    if block_flagged and new.flagged:
        return False, f"its live speed-up {new.live_speed_up:.2f}x is below 1.0 (it slows serving)"
    if old is None:
        return True, "there is no current draft (or it has no evaluation)"
    if new.method != old.method:  # another drafting procedure: acceptance per k says nothing about speed alone
        return compare_methods(new, old, tolerance)
    ok, why = compare_sets(new, old, tolerance)
    if not ok:
        return False, why
    if new.live_speed_up is not None and old.live_speed_up is not None and new.live_device == old.live_device:
        if new.live_speed_up < old.live_speed_up * (1 - tolerance):
            return False, (
                f"live speed-up {new.live_speed_up:.2f}x is worse than the current draft's {old.live_speed_up:.2f}x "
                f"({new.live_device}), though {why}"
            )
        why += f"; live speed-up {new.live_speed_up:.2f}x vs {old.live_speed_up:.2f}x"
    return True, f"not worse: {why}"


def promote(
    run_dir: Path,
    candidate: Path,
    record: EvalRecord,
    *,
    policy: PromotePolicy = "if_not_worse",
    tolerance: float = 0.0,
    block_flagged: bool = True,
    chosen: str = "",
) -> Decision:
    """Record `candidate`'s evaluation beside it, decide, move `draft/current` when promoted, and write
    draft/promotion.json. `block_flagged`: a draft that slows live serving is never promoted."""
    candidate = Path(candidate).resolve()
    atomic_write_json(candidate / EVALUATION, record.model_dump(mode="json"))
    link = current_link(run_dir)
    previous = pointed(link)
    old = read_evaluation(previous) if previous is not None else None
    if previous == candidate:
        ok, why = True, "it is already the current draft"
    elif policy == "always":
        ok, why = True, "evaluate.promote is `always`"
    elif policy == "never":
        ok, why = False, "evaluate.promote is `never`"
    else:
        ok, why = compare(record, old, tolerance, block_flagged)
    if ok and previous != candidate:
        point(link, candidate)
    decision = Decision(
        promoted=ok,
        reason=why,
        method=record.method,
        chosen=chosen,
        candidate=str(candidate),
        previous=str(previous) if previous else None,
        current=str(candidate) if ok else (str(previous) if previous else None),
        candidate_eval=record,
        previous_eval=old if previous != candidate else None,
    )
    atomic_write_json(RunPaths(run_dir).promotion_json, decision.model_dump(mode="json"))
    return decision
