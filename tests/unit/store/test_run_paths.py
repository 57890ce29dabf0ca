"""One source of truth for the run directory: each file name is spelled in one module (checked on the source
with `ast`), RunStore's readers name the file they cannot read, and each format has one validator."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch
from safetensors.torch import save

from eagle3.convert.stage import read_convert_result
from eagle3.convert.vocab import VOCAB_FORMAT
from eagle3.draft.checkpoint import read_latest
from eagle3.draft.data import DataError, load_vocab_map, read_layout
from eagle3.evaluate.live import read_live_result
from eagle3.evaluate.offline import read_offline_result
from eagle3.release.export import read_export
from eagle3.release.promote import read_promotion
from eagle3.store.fsio import atomic_write_json
from eagle3.store.paths import RunPaths
from eagle3.store.run_store import RunStore
from eagle3.store.sample_format import encode_sample

REPO = Path(__file__).resolve().parents[3]
#: file and directory names of the run directory -> the one module that spells them
RUN_PATHS_NAMES = (
    "run.json", "import.json", "prepared", "synthesized", "shards", "leases", "quarantine", "index.arrow",
    "vocab_map.safetensors", "convert.json", "export.json", "job.json", "train.log", "metrics.jsonl", "curves.png",
    "checkpoints", "trains", "exports", "promotion.json", "offline.json", "live.json", "dump", "server", "doctor",
    "prompts",
)  # fmt: skip
OWNERS = {
    **dict.fromkeys(RUN_PATHS_NAMES, "eagle3/store/paths.py"),
    "latest.json": "eagle3/draft/checkpoint.py",
    "step-": "eagle3/draft/checkpoint.py",
}
DIRECTORIES = {"prompts", "prepared", "synthesized", "shards", "leases", "quarantine", "checkpoints", "trains",
               "exports", "dump", "server", "doctor"}  # fmt: skip


def spelled(path: Path) -> set[str]:
    """The names of OWNERS this file spells as a path: a string literal (or f-string part) equal to a file name,
    or a directory name on the right of `/`. Docstrings and messages do not count."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in OWNERS:
            if node.value not in DIRECTORIES:
                found.add(node.value)
        elif (
            isinstance(node, ast.BinOp)
            and isinstance(node.op, ast.Div)
            and isinstance(node.right, ast.Constant)
            and node.right.value in DIRECTORIES
        ):
            found.add(str(node.right.value))
    return found


def test_each_run_directory_file_name_is_spelled_in_one_module() -> None:
    where: dict[str, list[str]] = {}
    for package in ("eagle3", "tasks", "flows"):
        for path in sorted((REPO / package).rglob("*.py")):
            for name in spelled(path):
                where.setdefault(name, []).append(str(path.relative_to(REPO)))
    strays = {name: files for name, files in where.items() if files != [OWNERS[name]]}
    assert not strays, f"run-directory names spelled outside their module (use RunPaths/RunStore): {strays}"


def test_paths_follow_the_documented_layout(tmp_path: Path) -> None:
    p = RunPaths(tmp_path)
    assert p.manifest_path(3) == tmp_path / "shards" / "shard-00003" / "manifest.json"
    assert p.lease_path(3) == tmp_path / "leases" / "shard-00003.lease"
    assert p.quarantine_shard_dir(3) == tmp_path / "quarantine" / "shard-00003"
    assert p.train.checkpoints_dir == tmp_path / "train" / "checkpoints"
    assert p.latest_export_json == tmp_path / "draft" / "latest" / "export.json"
    assert p.offline_eval_json == tmp_path / "eval" / "offline.json"
    assert isinstance(RunStore(tmp_path), RunPaths)


def test_readers_return_none_without_a_file_and_name_a_file_they_cannot_read(tmp_path: Path) -> None:
    store = RunStore(tmp_path)
    assert read_convert_result(store) is None and read_export(store.draft_latest) is None
    assert read_promotion(store.root) is None and read_live_result(store.root) is None
    assert read_offline_result(store.root) is None and read_latest(store.train.checkpoints_dir) is None
    atomic_write_json(store.convert_json, {"format": "eagle3-convert/1", "run_dir": str(tmp_path)})
    with pytest.raises(ValueError, match=r"convert\.json: not a valid ConvertResult \(12 bad fields, .*re-run"):
        read_convert_result(store)
    store.train.checkpoints_dir.mkdir(parents=True)
    atomic_write_json(store.train.checkpoints_dir / "latest.json", {"step": 7, "dir": "step-00000007"})
    assert read_latest(store.train.checkpoints_dir) == (7, store.train.checkpoints_dir / "step-00000007")


def write_vocab_map(path: Path, d2t: torch.Tensor, t2d: torch.Tensor) -> None:
    path.write_bytes(save({"d2t": d2t, "t2d": t2d}, metadata={"format": VOCAB_FORMAT}))


def test_the_trainer_refuses_a_vocab_map_that_maps_two_draft_ids_to_one_target_id(tmp_path: Path) -> None:
    t2d = torch.zeros(10, dtype=torch.bool)
    t2d[[2, 3]] = True
    write_vocab_map(RunPaths(tmp_path).vocab_map_path, torch.tensor([2, 1]), t2d)  # both -> target id 2
    with pytest.raises(DataError, match=r"vocab_map\.safetensors: d2t maps two draft ids to the same target id"):
        load_vocab_map(tmp_path)
    write_vocab_map(RunPaths(tmp_path).vocab_map_path, torch.tensor([2, 9]), t2d)  # 1 + 9 = 10: outside
    with pytest.raises(DataError, match=r"vocab_map\.safetensors: d2t maps draft ids outside"):
        load_vocab_map(tmp_path)


def test_the_trainer_refuses_a_sample_file_of_another_format_naming_it(tmp_path: Path) -> None:
    t = 4
    data = encode_sample("s", [1, 2], torch.arange(t), torch.ones(t, dtype=torch.uint8), torch.randn(t, 2, 8),
                         torch.randn(t, 8))  # fmt: skip
    good = tmp_path / "good.safetensors"
    good.write_bytes(data)
    assert read_layout(good).num_tokens == t
    foreign = tmp_path / "foreign.safetensors"
    foreign.write_bytes(
        save({"input_ids": torch.arange(t), "loss_mask": torch.ones(t, dtype=torch.uint8),
              "aux_hidden_states": torch.randn(t, 2, 8), "last_hidden_state": torch.randn(t, 8)},
             metadata={"format": "somebody-else/1"})
    )  # fmt: skip
    with pytest.raises(DataError, match=r"foreign\.safetensors: format 'somebody-else/1'.*re-run extract"):
        read_layout(foreign)
