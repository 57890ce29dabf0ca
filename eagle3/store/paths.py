"""Where every file of a run directory lives: the one module that spells their names (docs/formats.md).

    <run_dir>/run.json                                 RunInfo (eagle3/store/run_store.py); import.json after an import
    <run_dir>/prepared/manifest.json, shard-NNNNN.arrow
    <run_dir>/synthesized/manifest.json, summary.json, shard-NNNNN.jsonl, samples/<sample_id>.json
    <run_dir>/synthesized/source/prepared/           the source synthesize answers (grows by intake, as prepared/)
    <run_dir>/shards/shard-NNNNN/manifest.json, <sample_id>.safetensors
    <run_dir>/leases/shard-NNNNN.lease                 who extracts a shard (eagle3/store/lease.py)
    <run_dir>/quarantine/shard-NNNNN/                  bad and orphan sample files (eagle3/store/verify.py)
    <run_dir>/dump/                                    the default extract.dump_dir (dump_root)
    <run_dir>/vocab_map.safetensors, index.arrow, convert.json       the convert stage's outputs
    <run_dir>/train/job.json, train.log, metrics.jsonl, curves.png, tb/, checkpoints/    TrainPaths
    <run_dir>/train/job-nodeN.json, train-nodeN.log, rendezvous/<token>.json  nodes 1.. of a multi-node training
    <run_dir>/draft/latest, current, exports/<step>-<sha>/export.json, promotion.json   eagle3/release/promote.py
    <run_dir>/eval/offline.json, live.json, server-<label>/
    <run_dir>/draft/<method>/{train,exports,latest,eval,trains}  a draft method other than EAGLE-3 (MethodPaths)
    <run_dir>/trains/NNNN/{train,eval}                 earlier trainings (eagle3/release/retrain.py)
    <run_dir>/server/, doctor/                          SGLang server logs

Inside a checkpoints/ root the names (`step-NNNNNNNN`, latest.json) belong to eagle3/draft/checkpoint.py.
This module imports nothing of ours but eagle3.store.fsio, so every module can use it.
"""

from __future__ import annotations

from pathlib import Path

from eagle3.store.fsio import safe_name

VOCAB_FILE = "vocab_map.safetensors"
INDEX_FILE = "index.arrow"
CONVERT_FILE = "convert.json"
EXPORT_FILE = "export.json"  # in every export directory (eagle3/release/export.py)
SAMPLE_SUFFIX = ".safetensors"
QUARANTINE_DIR = "quarantine"


def shard_name(shard: int) -> str:
    return f"shard-{shard:05d}"


class TrainPaths:
    """A training's output directory (`<run_dir>/train`, or a TrainJob's out_dir)."""

    def __init__(self, out_dir: str | Path):
        self.root = Path(out_dir)

    @property
    def job_json(self) -> Path:
        return self.root / "job.json"

    @property
    def log(self) -> Path:
        return self.root / "train.log"

    @property
    def metrics(self) -> Path:
        return self.root / "metrics.jsonl"

    @property
    def curves(self) -> Path:
        return self.root / "curves.png"

    @property
    def tensorboard_dir(self) -> Path:
        return self.root / "tb"

    @property
    def checkpoints_dir(self) -> Path:
        return self.root / "checkpoints"

    # several nodes on one training (eagle3/train/rendezvous.py): node 0 keeps the one-node names
    def node_job_json(self, node_rank: int) -> Path:
        return self.job_json if node_rank == 0 else self.root / f"job-node{node_rank}.json"

    def node_log(self, node_rank: int) -> Path:
        return self.log if node_rank == 0 else self.root / f"train-node{node_rank}.log"

    def inductor_cache(self, node_rank: int) -> Path:
        """torch.compile's cache of this training on one node: a resume compiles in seconds, not minutes."""
        return self.root / "inductor-cache" / f"node{node_rank}"

    def rendezvous(self, token: str) -> Path:
        """The c10d endpoint node 0 chose for the launch `token` (a train-fanout flow run), read by the others."""
        return self.root / "rendezvous" / f"{token}.json"


class RunPaths:
    """The path of each file and directory of one run directory; nothing is read or created."""

    def __init__(self, root: str | Path):
        self.root = Path(root)

    # what produced the store -------------------------------------------------------------
    @property
    def run_json(self) -> Path:
        return self.root / "run.json"

    @property
    def import_json(self) -> Path:
        """What an import from a peer format recorded (eagle3/convert/store_writer.py)."""
        return self.root / "import.json"

    # prepared data -----------------------------------------------------------------------
    @property
    def prepared_dir(self) -> Path:
        return self.root / "prepared"

    @property
    def prepared_manifest_path(self) -> Path:
        return self.prepared_dir / "manifest.json"

    def prepared_shard_path(self, shard: int) -> Path:
        return self.prepared_dir / f"{shard_name(shard)}.arrow"

    def prepared_shard_paths(self) -> list[Path]:
        """The prepared shard files there now (stale ones included), by name."""
        return sorted(self.prepared_dir.glob("shard-*.arrow"))

    # the prompts stage's default output (prompts.out_dir unset) -------------------------
    @property
    def prompts_dir(self) -> Path:
        return self.root / "prompts"

    # synthesized answers -----------------------------------------------------------------
    @property
    def synthesized_dir(self) -> Path:
        return self.root / "synthesized"

    @property
    def synthesized_manifest_path(self) -> Path:
        return self.synthesized_dir / "manifest.json"

    @property
    def synthesized_summary_path(self) -> Path:
        return self.synthesized_dir / "summary.json"

    @property
    def synthesized_samples_dir(self) -> Path:
        return self.synthesized_dir / "samples"

    def synthesized_shard_path(self, shard: int) -> Path:
        return self.synthesized_dir / f"{shard_name(shard)}.jsonl"

    def synthesized_shard_paths(self) -> list[Path]:
        return sorted(self.synthesized_dir.glob("shard-*.jsonl"))

    def synthesized_sample_path(self, sample_id: str) -> Path:
        return self.synthesized_samples_dir / f"{sample_id}.json"

    @property
    def synthesis_source_root(self) -> Path:
        """The root of the source's own preparation (its prepared/ grows by intake): what synthesize answers.
        Synthesized shard and sample files are keyed by this preparation's shards and sample ids."""
        return self.synthesized_dir / "source"

    # extracted samples -------------------------------------------------------------------
    @property
    def shards_dir(self) -> Path:
        return self.root / "shards"

    def shard_dir(self, shard: int) -> Path:
        return self.shards_dir / shard_name(shard)

    def manifest_path(self, shard: int) -> Path:
        return self.shard_dir(shard) / "manifest.json"

    def sample_path(self, shard: int, sample_id: str) -> Path:
        return self.shard_dir(shard) / self.sample_name(sample_id)

    @staticmethod
    def sample_name(sample_id: str) -> str:
        return f"{safe_name(sample_id)}{SAMPLE_SUFFIX}"

    @property
    def default_dump_dir(self) -> Path:
        """extract.dump_dir when the config leaves it empty."""
        return self.root / "dump"

    @property
    def leases_dir(self) -> Path:
        return self.root / "leases"

    def lease_path(self, shard: int) -> Path:
        return self.leases_dir / f"{shard_name(shard)}.lease"

    def lease_paths(self) -> list[Path]:
        """The shard lease files there now, in shard order."""
        return sorted(self.leases_dir.glob("shard-*.lease"))

    @property
    def quarantine_dir(self) -> Path:
        return self.root / QUARANTINE_DIR

    def quarantine_shard_dir(self, shard: int) -> Path:
        return self.quarantine_dir / shard_name(shard)

    # convert outputs ---------------------------------------------------------------------
    @property
    def vocab_map_path(self) -> Path:
        return self.root / VOCAB_FILE

    @property
    def index_path(self) -> Path:
        return self.root / INDEX_FILE

    @property
    def convert_json(self) -> Path:
        return self.root / CONVERT_FILE

    # training ----------------------------------------------------------------------------
    @property
    def train(self) -> TrainPaths:
        return TrainPaths(self.root / "train")

    @property
    def trains_dir(self) -> Path:
        """Earlier trainings, archived by eagle3/release/retrain.py as trains/NNNN/{train,eval}."""
        return self.root / "trains"

    @property
    def archived_names(self) -> tuple[str, ...]:
        """What an archived training moves, in order: eval first, so a kill between leaves no old evaluation
        beside a new training."""
        return (self.eval_dir.name, self.train.root.name)

    # drafts ------------------------------------------------------------------------------
    @property
    def draft_dir(self) -> Path:
        return self.root / "draft"

    @property
    def draft_latest(self) -> Path:
        """The newest export (a symlink into draft/exports/)."""
        return self.draft_dir / "latest"

    @property
    def draft_current(self) -> Path:
        """The promoted export (a symlink into draft/exports/)."""
        return self.draft_dir / "current"

    @property
    def draft_exports_dir(self) -> Path:
        return self.draft_dir / "exports"

    @property
    def promotion_json(self) -> Path:
        return self.draft_dir / "promotion.json"

    @property
    def latest_export_json(self) -> Path:
        return self.draft_latest / EXPORT_FILE

    def method(self, name: str) -> MethodPaths:
        """Where one draft method's training, exports and evaluation live (train.method)."""
        return MethodPaths(self, name)

    # evaluation --------------------------------------------------------------------------
    @property
    def eval_dir(self) -> Path:
        return self.root / "eval"

    @property
    def offline_eval_json(self) -> Path:
        return self.eval_dir / "offline.json"

    @property
    def live_eval_json(self) -> Path:
        return self.eval_dir / "live.json"

    def eval_server_log_dir(self, label: str) -> Path:
        return self.eval_dir / f"server-{label}"

    # logs --------------------------------------------------------------------------------
    @property
    def server_log_dir(self) -> Path:
        return self.root / "server"

    @property
    def doctor_log_dir(self) -> Path:
        return self.root / "doctor"


def dump_root(run_dir: str | Path, dump_dir: str | None) -> Path:
    """The dump directory of the sglang engine: `dump_dir` (extract.dump_dir), else `<run_dir>/dump` (the store's
    filesystem, so moving a dump in is a rename). Several servers of one run each get a directory below it
    (eagle3/serving/specs.py)."""
    return Path(dump_dir) if dump_dir else RunPaths(run_dir).default_dump_dir


#: The method whose files keep the places they had before there were several (a store trained before keeps working).
FIRST_METHOD = "eagle3"


class MethodPaths:
    """One draft method's directories in a run: EAGLE-3's are the run's own (train/, draft/exports/, draft/latest,
    eval/), any other method's are under draft/<method>/ (train/, exports/, latest, eval/). draft/current and
    draft/promotion.json stay the run's: one promoted draft, whichever method won."""

    def __init__(self, run: RunPaths, name: str):
        self.run, self.name = run, name
        self.root = run.root if name == FIRST_METHOD else run.draft_dir / safe_name(name)

    @property
    def train(self) -> TrainPaths:
        return self.run.train if self.name == FIRST_METHOD else TrainPaths(self.root / "train")

    @property
    def exports_dir(self) -> Path:
        return self.run.draft_exports_dir if self.name == FIRST_METHOD else self.root / "exports"

    @property
    def latest(self) -> Path:
        """The method's newest export (a symlink into its exports/)."""
        return self.run.draft_latest if self.name == FIRST_METHOD else self.root / "latest"

    @property
    def eval_dir(self) -> Path:
        return self.run.eval_dir if self.name == FIRST_METHOD else self.root / "eval"

    @property
    def offline_eval_json(self) -> Path:
        return self.eval_dir / "offline.json"

    @property
    def live_eval_json(self) -> Path:
        return self.eval_dir / "live.json"

    @property
    def latest_export_json(self) -> Path:
        return self.latest / EXPORT_FILE

    @property
    def trains_dir(self) -> Path:
        """The method's earlier trainings, trains/NNNN/{train,eval} beside its train/ (eagle3/release/retrain.py)."""
        return self.root / "trains"

    @property
    def archived_names(self) -> tuple[str, ...]:
        """What an archived training moves out of `root`, eval first (RunPaths.archived_names)."""
        return (self.eval_dir.name, self.train.root.name)
