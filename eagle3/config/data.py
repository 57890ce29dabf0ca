"""The data end's sections: `data` (and its `data.sources` entries), `synthesize`, `prompts`."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from eagle3.config.base import StrictModel

_DATASET = (
    "Local JSONL/JSON/Parquet file, a folder or glob of them, a save_to_disk directory, a dataset repository "
    "directory, or a Hugging Face Hub dataset id (e.g. `HuggingFaceH4/ultrachat_200k`, read with "
    "datasets.load_dataset; offline: pre-download it)."
)


class DatasetRef(StrictModel):
    """Which dataset rows are read from: the keys a `data.sources` entry and the `data` section share."""

    dataset: str = Field(description=_DATASET)
    subset: str | None = Field(None, description="Hub dataset / repository: the configuration (subset) name.")
    split: str = Field("train", description="Split to read (a saved DatasetDict, a Hub dataset or repository).")
    revision: str | None = Field(None, description="Hub dataset: a branch, tag or commit to pin.")


class DataSource(DatasetRef):
    """One input dataset of `data.sources` (or the one `data.dataset` describes)."""

    max_samples: int | None = Field(None, gt=0, description="Use at most this many rows of this source (None: all).")


class DataConfig(DatasetRef):  # dataset, subset, split, revision: DatasetRef's
    """Input conversations and how they become token ids."""

    dataset: str = Field(
        "data/demo_prompts.jsonl",
        description=f"{_DATASET} Rows hold ShareGPT `conversations` (from/value) or OpenAI `messages` (role/content).",
    )
    sources: list[DataSource] = Field(
        default_factory=list,
        description="Several datasets, read in this order, each with its own split and max_samples (then "
        "`dataset`, `subset`, `split` and `revision` above are not used). Empty: the one `dataset`.",
    )
    format: Literal["auto", "sharegpt", "openai"] = Field("auto", description="Row schema; `auto` detects it per row.")
    max_length: int = Field(2048, gt=8, le=1_048_576, description="Longest sample in tokens.")
    truncate: bool = Field(
        False, description="Cut samples longer than max_length instead of reporting them as bad rows."
    )
    max_samples: int | None = Field(
        None,
        gt=0,
        description="Use at most this many rows (None: all); with synthesize, each kept row keeps "
        "all its answers (synthesize.samples_per_prompt).",
    )
    shard_size: int = Field(2000, gt=0, le=1_000_000, description="Samples per shard.")
    on_bad_row: Literal["skip", "fail"] = Field(
        "skip", description="`skip` reports bad rows (file, row, reason) and goes on; `fail` stops the stage."
    )
    chat_template: str | None = Field(
        None,
        description="A Jinja chat template file that replaces the tokenizer's own, wherever a conversation is "
        "rendered (prepare, synthesize, evaluate). None: the model's template.",
    )
    chat_template_kwargs: dict[str, Any] = Field(
        default_factory=dict,
        description="Extra variables for the chat template everywhere it is rendered, e.g. {enable_thinking: "
        "true} for a reasoning model (as served: use the same values the server's requests use).",
    )


class SynthesizeConfig(StrictModel):
    """Regenerate assistant turns with the target model (the case study trained on such data)."""

    max_new_tokens: int = Field(256, gt=0, le=32768, description="Longest generated assistant turn.")
    temperature: float = Field(0.0, ge=0.0, le=2.0, description="0 = greedy.")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="Nucleus sampling cut-off when temperature > 0.")
    batch_size: int | None = Field(
        None,
        gt=0,
        le=4096,
        description="transformers engine: prompts generated together. None: 8 on a CPU, 2,048 on a GPU (where a "
        "batch that does not fit the memory is split in halves; docs/performance.md).",
    )
    seed: int = Field(0, description="Sampling seed (temperature > 0; transformers engine).")
    concurrency: int = Field(
        64,
        gt=0,
        le=4096,
        description="sglang engine: generation requests in flight, spread over every server of the run (the "
        "server batches them).",
    )
    request_timeout_s: float = Field(600.0, gt=0, description="sglang engine: seconds per generation request.")
    request_retries: int = Field(
        3, ge=0, le=20, description="sglang engine: resends of a request that timed out or met a dead server."
    )
    on_truncated: Literal["keep", "drop"] = Field(
        "keep",
        description="A generated turn cut at max_new_tokens (finish reason `length`): `keep` it in the data, or "
        "`drop` the sample. Counted either way in the synthesize artifact and synthesized/summary.json.",
    )
    # a varied corpus (docs/corpus.md) -------------------------------------------------------------
    samples_per_prompt: int = Field(
        1,
        gt=0,
        le=64,
        description="Answers generated per source conversation, each its own sample (checkpoint `<sample id>` for "
        "the first, `<sample id>.s<k>` for the others) with its own seed derived from `seed`, the sample id and k. "
        "More than 1 needs temperature > 0 (greedy answers would be equal).",
    )
    include_greedy: bool = Field(
        False,
        description="With temperature > 0: the first of the samples_per_prompt answers is greedy, the others "
        "sampled (the draft serves greedy decoding too).",
    )
    user_turns: int = Field(
        0,
        ge=0,
        le=16,
        description="Multi-turn: after the conversation's own turns, the target writes this many more user turns "
        "(as the user, from the conversation so far; eagle3/data/prompts.py) and answers each. 0: none.",
    )

    regenerate: Literal["all", "recorded", "last", "none"] = Field(
        "all",
        description="Which assistant turns of a multi-turn or tool-call conversation the target writes again. "
        "`all`: every one, each from the conversation with the turns before it already regenerated (a conversation "
        "with tool calls: from the recorded history, as `recorded`, since a regenerated call would not match the "
        "tool result recorded after it). `recorded`: every one, each from the recorded history before it (tool "
        "results as recorded). `last`: only the last one, from the recorded history. `none`: keep the served turns "
        "(served traffic already is the target's own output; only the user_turns appended are generated).",
    )

    @model_validator(mode="after")
    def _samples_need_sampling(self) -> SynthesizeConfig:
        if self.samples_per_prompt > 1 and self.temperature == 0:
            raise ValueError(
                "synthesize.samples_per_prompt > 1 with temperature 0 would generate the same answer each time; "
                "set synthesize.temperature > 0 (e.g. 0.8)"
            )
        return self

    def generation_key(self) -> dict[str, Any]:
        """The settings the generated text depends on (not how it is scheduled: batch size, concurrency, timeouts).
        The corpus keys appear only when set away from their defaults, so stores synthesized before they existed
        keep their key (and their generations)."""
        key = self.model_dump(
            mode="json", exclude={"batch_size", "concurrency", "request_timeout_s", "request_retries", "on_truncated"}
        )
        for name in ("samples_per_prompt", "include_greedy", "user_turns", "regenerate"):
            if key[name] == SynthesizeConfig.model_fields[name].default:
                del key[name]
        return key


class PromptsConfig(StrictModel):
    """The `prompts` stage (eagle3/data/prompts.py): user requests the target writes itself from a grid of topics x
    task types x formats, plus prompts of other files, near-duplicates removed, written as a dataset file that
    `data.dataset` (or a `data.sources` entry) then names. docs/corpus.md."""

    out_dir: str | None = Field(
        None,
        description="Where the stage writes prompts.jsonl (the dataset), summary.json and its per-prompt "
        "checkpoints. None: `<run_dir>/prompts`.",
    )
    grid: str = Field("data/prompt_grid.yaml", description="YAML with `topics`, `tasks` and `formats` lists.")
    self_instruct: int = Field(
        0,
        ge=0,
        le=10_000_000,
        description="Requests the target writes, one per grid cell, cells picked by a seeded shuffle of the whole "
        "grid (more than its cells: cells repeat with other seeds). 0: none.",
    )
    include: list[str] = Field(
        default_factory=list,
        description="Dataset files (JSONL/Parquet like data.dataset's) whose user requests join the corpus: each "
        "row's turns before its last assistant turn, deduplicated with the written ones.",
    )
    max_new_tokens: int = Field(96, gt=0, le=4096, description="Longest written request, in tokens.")
    temperature: float = Field(0.9, ge=0.0, le=2.0, description="Sampling temperature of the written requests.")
    top_p: float = Field(0.95, gt=0.0, le=1.0, description="Nucleus cut-off of the written requests.")
    seed: int = Field(0, description="Seeds the choice of cells and each request's sampling.")
    min_words: int = Field(3, ge=1, description="A written request with fewer words is dropped (counted).")
    dedup_ngram: int = Field(3, gt=0, le=16, description="Near-duplicate removal: word n-gram (shingle) length.")
    dedup_threshold: float = Field(
        0.7,
        gt=0.0,
        le=1.0,
        description="Two prompts whose shingle sets have at least this Jaccard similarity are near-duplicates: "
        "the first is kept. 1.0: exact duplicates (after normalizing case and punctuation) only.",
    )
    exclude_eval: bool = Field(
        True,
        description="Drop any prompt that equals or nearly equals a prompt of an evaluation set (evaluate.sets, "
        "every row): the draft never trains on what it is evaluated on.",
    )

    def generation_key(self) -> dict[str, Any]:
        """What a written request depends on (its checkpoint is kept while these stay the same)."""
        return self.model_dump(mode="json", include={"max_new_tokens", "temperature", "top_p", "seed"})
