"""The run directory: run.json, prepared data, shards of sample files and their manifests.

    <run_dir>/run.json                               RunInfo
    <run_dir>/prepared/manifest.json                 PreparedManifest
    <run_dir>/prepared/shard-00000.arrow             Arrow IPC, PREPARED_SCHEMA
    <run_dir>/shards/shard-00000/manifest.json       ShardManifest
    <run_dir>/shards/shard-00000/<sample_id>.safetensors

Truth about what is done is the sample files themselves (each written atomically); manifests are
summaries rebuilt from them, so a killed run loses nothing it had finished.
"""

from __future__ import annotations

import datetime as dt
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal, TypeVar

import pyarrow as pa
import torch
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from eagle3.store.fsio import atomic_write_bytes, atomic_write_json, read_json
from eagle3.store.paths import SAMPLE_SUFFIX, RunPaths
from eagle3.store.sample_format import (
    FP8,
    FP8_NAME,
    SampleFormatError,
    SampleTensors,
    check_header,
    read_sample,
    verify_sample,
)

ShardStatus = Literal["pending", "running", "complete", "partial", "failed"]
#: data settings that change what a sample is: a store never mixes samples made under two of them.
DATA_MIX_KEYS = ("max_length", "truncate", "chat_template", "chat_template_kwargs")
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
STORE_DTYPES = {**DTYPES, FP8_NAME: FP8}  # what run.json's store_dtype may say


def now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


class Record(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Intake(Record):
    """One intake of source data into the store: what it read and what it added (prepared/manifest.json and
    run.json list them in order; the first is the store's first prepare)."""

    at: str = Field(default_factory=now)
    files: dict[str, str] = Field(description="source files read in this intake (new or changed) -> sha256")
    missing_files: list[str] = Field(default_factory=list, description="files taken in before and gone now")
    new_samples: int
    new_tokens: int
    shards: list[int] = Field(description="the prepared shards this intake appended")
    known_samples: int = Field(0, description="rows read whose sample the store already held (not added again)")
    vanished_samples: int = Field(
        0,
        description="samples whose recorded source row (file:row) is gone: its file changed without it, or went "
        "missing; kept in the store, not deleted",
    )
    bad_rows: int = 0
    dataset_fingerprint: str


class RunInfo(Record):
    """run.json: what produced this store. Resume refuses a store whose RunInfo disagrees."""

    format: str = "eagle3-store/1"
    model_path: str
    model_sha256: str
    tokenizer_sha256: str
    engine: str
    engine_version: str
    dtype: str = Field(description="the model's compute dtype (server.dtype)")
    store_dtype: str = Field(
        default="",
        description="the dtype of the states in the sample files: dtype, or float8_e4m3 (with per-token scales). "
        "Empty in a run.json written before it existed: then it is dtype.",
    )
    hidden_size: int
    num_layers: int
    vocab_size: int
    aux_layers: list[int] = Field(description="HF hidden_states indices")
    engine_layer_ids: list[int] = Field(description="the same layers in the engine's own convention")
    engine_layer_convention: str
    tap: str = Field(
        default="residual",
        description="what the aux states are: `residual`, the residual stream entering each layer (HF "
        "hidden_states[i], what SGLang feeds an EAGLE-3 draft of the families eagle3/target/families.py marks "
        "so). Absent in a run.json written before it existed: then residual, the only tap ever stored",
    )
    dataset_fingerprint: str = Field(description="of the dataset as of the latest intake")
    versions: dict[str, str]
    config: dict
    created_at: str = Field(default_factory=now)
    intakes: list[Intake] = Field(default_factory=list, description="copied from prepared/manifest.json")
    run_dir_template: str | None = Field(default=None, description="`run_dir` as configured, before {date}/{model_sha}")

    @model_validator(mode="after")
    def _store_dtype(self) -> RunInfo:
        self.store_dtype = self.store_dtype or self.dtype
        if self.store_dtype not in STORE_DTYPES:
            raise ValueError(f"store_dtype {self.store_dtype!r}: expected one of {sorted(STORE_DTYPES)}")
        return self

    @property
    def stored(self) -> torch.dtype:
        """The torch dtype of the states in the sample files."""
        return STORE_DTYPES[self.store_dtype]


class SampleEntry(Record):
    num_tokens: int
    num_bytes: int
    crc32: str


class ShardManifest(Record):
    shard: int
    status: ShardStatus = "pending"
    expected: int = Field(description="samples in the prepared shard")
    samples: dict[str, SampleEntry] = Field(default_factory=dict)
    errors: dict[str, str] = Field(default_factory=dict, description="sample id -> reason")
    tokens: int = 0
    bytes: int = 0
    log: str | None = None
    updated_at: str = Field(default_factory=now)


class BadRow(Record):
    file: str
    row: int
    reason: str


class SynthesisOf(Record):
    """What a synthesized prepared/ was made from: the settings that must never mix (model, tokenizer, dtype, data
    settings, the synthesize generation settings and on_truncated; eagle3.data.synthesis_key), and the source's
    preparation as of the last synthesize (its dataset fingerprint: the rows)."""

    settings_fingerprint: str
    source_fingerprint: str
    source_intakes: int = 0  # the source's intakes answered so far (the next synthesis records those after them)


class PreparedManifest(Record):
    dataset: str
    dataset_fingerprint: str
    tokenizer_sha256: str
    num_samples: int
    num_tokens: int
    num_loss_tokens: int
    shards: list[int] = Field(description="samples per shard")
    shard_tokens: list[int]
    bad_rows: list[BadRow] = Field(default_factory=list)
    duplicates: int = 0
    config: dict
    created_at: str = Field(default_factory=now)
    files: dict[str, str] = Field(default_factory=dict, description="source files taken in so far -> sha256")
    intakes: list[Intake] = Field(default_factory=list)
    synthesis: SynthesisOf | None = None  # set when synthesize wrote prepared/ (the target's answers)


PREPARED_SCHEMA = pa.schema(
    [
        ("sample_id", pa.string()),
        ("input_ids", pa.list_(pa.int32())),
        ("loss_mask", pa.list_(pa.uint8())),
        ("num_tokens", pa.int32()),
        ("source", pa.string()),  # "<file>:<row>" of the input row
        ("messages", pa.string()),  # the normalized conversation as JSON [{"role", "content"}]
    ]
)


class RunStore(RunPaths):
    """Paths (RunPaths) and typed access to one run directory: the only reader of its files."""

    def sample_file_sizes(self, shard: int) -> dict[str, int]:
        """File name -> size of the sample files in shard's directory (one listing; no file is opened)."""
        try:
            with os.scandir(self.shard_dir(shard)) as it:
                return {e.name: e.stat().st_size for e in it if e.name.endswith(SAMPLE_SUFFIX) and e.is_file()}
        except FileNotFoundError:
            return {}

    def synthesis_source(self) -> RunStore:
        """The store whose prepared/ holds the source that synthesize answers (synthesized/source/)."""
        return RunStore(self.synthesis_source_root)

    # run.json ----------------------------------------------------------------------------
    def read_run_info(self) -> RunInfo | None:
        return RunInfo.model_validate(read_json(self.run_json)) if self.run_json.exists() else None

    def require_run_info(self, fix: str = "run the extract stage (or an import) first") -> RunInfo:
        """run.json, or FileNotFoundError naming it and `fix`."""
        info = self.read_run_info()
        if info is None:
            raise FileNotFoundError(f"{self.run_json} missing: {fix}")
        return info

    def write_run_info(self, info: RunInfo) -> None:
        atomic_write_json(self.run_json, info.model_dump(mode="json"))

    # prepared data -----------------------------------------------------------------------
    def read_prepared_manifest(self) -> PreparedManifest | None:
        p = self.prepared_manifest_path
        return PreparedManifest.model_validate(read_json(p)) if p.exists() else None

    def write_prepared_manifest(self, m: PreparedManifest) -> None:
        atomic_write_json(self.prepared_manifest_path, m.model_dump(mode="json"))

    def write_prepared_shard(self, shard: int, table: pa.Table) -> None:
        sink = pa.BufferOutputStream()
        with pa.ipc.new_file(sink, table.schema) as w:
            w.write_table(table)
        atomic_write_bytes(self.prepared_shard_path(shard), sink.getvalue().to_pybytes())

    def read_prepared_shard(self, shard: int) -> pa.Table:
        path = self.prepared_shard_path(shard)
        if not path.exists():
            raise FileNotFoundError(f"{path}: prepared shard missing; run the prepare stage first")
        with pa.memory_map(str(path)) as src:
            return pa.ipc.open_file(src).read_all()

    def prepared_ids(self, shard: int) -> list[str]:
        """The sample ids of a prepared shard (one Arrow column)."""
        return self.read_prepared_shard(shard).column("sample_id").to_pylist()

    def prepared_samples(self, shard: int) -> list[PreparedSample]:
        t = self.read_prepared_shard(shard).to_pydict()
        return [
            PreparedSample(sid, ids, mask, src)
            for sid, ids, mask, src in zip(t["sample_id"], t["input_ids"], t["loss_mask"], t["source"], strict=True)
        ]

    # shards ------------------------------------------------------------------------------
    def num_shards(self) -> int:
        m = self.read_prepared_manifest()
        return len(m.shards) if m else 0

    def read_manifest(self, shard: int) -> ShardManifest | None:
        p = self.manifest_path(shard)
        return ShardManifest.model_validate(read_json(p)) if p.exists() else None

    def read_manifest_fast(self, shard: int) -> dict[str, Any] | None:
        """A shard's manifest.json as plain JSON, not validated: validating thousands of entries costs more than
        the checks that only need its status, sample ids, sizes and token total."""
        p = self.manifest_path(shard)
        return read_json(p) if p.is_file() else None  # type: ignore[no-any-return]

    def write_manifest(self, m: ShardManifest) -> None:
        m.updated_at = now()
        m.tokens = sum(e.num_tokens for e in m.samples.values())
        m.bytes = sum(e.num_bytes for e in m.samples.values())
        atomic_write_json(self.manifest_path(m.shard), m.model_dump(mode="json"))

    def manifests(self) -> Iterator[ShardManifest]:
        for i in range(self.num_shards()):
            yield self.read_manifest(i) or ShardManifest(shard=i, expected=self.read_prepared_manifest().shards[i])  # type: ignore[union-attr]

    # samples -----------------------------------------------------------------------------
    def existing_ok(self, shard: int, sample: PreparedSample, info: RunInfo) -> int | None:
        """Token count of an already-written sample whose header matches, else None (redo it)."""
        path = self.sample_path(shard, sample.sample_id)
        if not path.exists():
            return None
        try:
            return check_header(
                path,
                num_tokens=len(sample.input_ids),
                num_aux=len(info.aux_layers),
                hidden_size=info.hidden_size,
                dtype=info.stored,
            )
        except SampleFormatError:
            return None

    def verify(self, shard: int, sample: PreparedSample, info: RunInfo, crc32: str | None) -> SampleEntry:
        rec = verify_sample(
            self.sample_path(shard, sample.sample_id),
            num_tokens=len(sample.input_ids),
            num_aux=len(info.aux_layers),
            hidden_size=info.hidden_size,
            dtype=info.stored,
            crc32=crc32,
            input_ids=torch.tensor(sample.input_ids),
        )
        return SampleEntry(num_tokens=rec.num_tokens, num_bytes=rec.num_bytes, crc32=rec.crc32)

    def open_sample(self, shard: int, sample_id: str) -> SampleTensors:
        return read_sample(self.sample_path(shard, sample_id))

    def iter_samples(self) -> Iterator[tuple[int, str, Path]]:
        """(shard, sample_id, path) of every sample recorded in a manifest, in shard order."""
        for m in self.manifests():
            for sid in m.samples:
                yield m.shard, sid, self.sample_path(m.shard, sid)


M = TypeVar("M", bound=BaseModel)


def read_record(path: Path, model: type[M]) -> M | None:
    """The pydantic record in the JSON file `path`, None when there is no file; one that does not validate raises
    ValueError naming the file, its first bad fields and the fix. Each run-directory JSON file has one reader that
    calls this, beside its model (RunStore's below; convert.json, export.json, eval/*.json, promotion.json)."""
    if not path.is_file():
        return None
    try:
        return model.model_validate(read_json(path))
    except ValidationError as e:
        bad = "; ".join(f"{'.'.join(map(str, err['loc'])) or '<top>'}: {err['msg']}" for err in e.errors()[:4])
        why = f"{e.error_count()} bad fields, {bad}"
    except ValueError as e:  # not JSON
        why = str(e)
    raise ValueError(f"{path}: not a valid {model.__name__} ({why}); delete it and re-run the stage that writes it")


class PreparedSample:
    """One tokenized conversation ready for extraction."""

    __slots__ = ("input_ids", "loss_mask", "sample_id", "source")

    def __init__(self, sample_id: str, input_ids: list[int], loss_mask: list[int], source: str):
        self.sample_id = sample_id
        self.input_ids = input_ids
        self.loss_mask = loss_mask
        self.source = source

    def __len__(self) -> int:
        return len(self.input_ids)
