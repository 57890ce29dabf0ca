"""When a grown store is trained again: a finished training of an older store state is archived and a new one
starts once train.min_new_tokens were extracted since; fewer: the draft stages wait; an unfinished one resumes."""

from __future__ import annotations

import json
from pathlib import Path

from eagle3.config import TrainConfig
from eagle3.draft.checkpoint import FILES
from eagle3.release.retrain import archive_training, plan_training
from eagle3.store.run_store import RunStore, SampleEntry, ShardManifest
from eagle3.train.job import TrainJob, write_job
from tests.unit.tiny_store import make_store

CFG = TrainConfig(max_steps=4)


def extracted(store: RunStore, shard: int, tokens: int) -> None:
    entry = SampleEntry(num_tokens=tokens, num_bytes=1, crc32="0")
    store.write_manifest(ShardManifest(shard=shard, status="complete", expected=1, samples={"x": entry}))


def training(run: Path, key: str, tokens: int, step: int = 4) -> None:
    ckpt = run / "train" / "checkpoints" / f"step-{step:08d}"
    ckpt.mkdir(parents=True)
    for f in FILES:
        (ckpt / f).write_text("{}")
    state = {"step": step, "total_steps": 4, "config": CFG.model_dump(mode="json")}
    (ckpt / "state.json").write_text(json.dumps(state))
    job = TrainJob(train=CFG, run_dir=str(run), model_dir="m", out_dir=str(run / "train"), data_key=key,
                   data_tokens=tokens)  # fmt: skip
    write_job(run / "train" / "job.json", job)


def grow(store: RunStore, key: str) -> None:
    info = store.read_run_info()
    assert info is not None
    store.write_run_info(info.model_copy(update={"dataset_fingerprint": key}))


def test_a_grown_store_trains_again_only_after_min_new_tokens_and_archives_the_old_training(tmp_path: Path) -> None:
    store, _ = make_store(tmp_path / "run", [[10], [10]])
    extracted(store, 0, 100)
    assert plan_training(store.root, CFG).action == "train"  # nothing trained yet
    training(store.root, "d", 100)
    (store.root / "eval").mkdir()
    assert plan_training(store.root, CFG).action == "done"  # the store has not grown

    grow(store, "d2")
    extracted(store, 1, 40)
    wait = plan_training(store.root, CFG.model_copy(update={"min_new_tokens": 50}))
    assert wait.action == "wait" and wait.new_tokens == 40 and "train.min_new_tokens=50" in wait.reason
    go = plan_training(store.root, CFG.model_copy(update={"min_new_tokens": 40}))
    assert go.action == "train" and go.archive and (go.data_key, go.data_tokens, go.new_tokens) == ("d2", 140, 40)

    dest = archive_training(store.root)
    assert (
        dest == store.root / "trains" / "0001" and (dest / "train" / "job.json").is_file() and (dest / "eval").is_dir()
    )
    assert not (store.root / "train").exists() and not (store.root / "eval").exists()
    assert plan_training(store.root, CFG).action == "train"


def test_an_unfinished_training_resumes_whatever_the_store_did(tmp_path: Path) -> None:
    store, _ = make_store(tmp_path / "run", [[10]])
    extracted(store, 0, 100)
    training(store.root, "d", 100, step=2)
    grow(store, "d2")
    assert plan_training(store.root, CFG).action == "resume"


def test_each_method_plans_and_archives_its_own_training(tmp_path: Path) -> None:
    """A finished EAGLE-3 training does not make EAGLE-3.1's 'done': each method has its directory (MethodPaths),
    and archiving one leaves the other in place."""
    store, _ = make_store(tmp_path / "run", [[10]])
    extracted(store, 0, 100)
    training(store.root, "d", 100)
    other = CFG.model_copy(update={"method": "eagle3.1"})
    assert plan_training(store.root, CFG).action == "done"
    assert plan_training(store.root, other).action == "train"
    paths = store.method("eagle3.1")
    assert paths.train.root == store.root / "draft" / "eagle3.1" / "train"
    assert paths.latest == store.root / "draft" / "eagle3.1" / "latest"
    assert paths.offline_eval_json == store.root / "draft" / "eagle3.1" / "eval" / "offline.json"
    assert store.method("eagle3").train.root == store.train.root and store.method("eagle3").latest == store.draft_latest
    training(paths.root, "d", 100)  # an EAGLE-3.1 training in its own directory
    assert plan_training(store.root, other).action == "done"
    grow(store, "d2")
    dest = archive_training(store.root, "eagle3.1")
    assert dest == paths.root / "trains" / "0001" and (dest / "train" / "job.json").is_file()
    assert not paths.train.root.exists() and (store.root / "train" / "job.json").is_file()  # EAGLE-3's stays
