"""The parts of a failure report that need no server: which task an error went through (from its traceback),
which stage that is, and the one thing to do, filled in for the run directory."""

from __future__ import annotations

import errno
import pickle
from pathlib import Path

import pytest

from eagle3.checks.preflight import PreflightError, ServingRefusedError
from eagle3.config import load_config
from eagle3.data.prepare import BadRowError, DatasetUnreadableError, PrepareError, StoreMismatchError
from eagle3.draft.method import MethodError, pick_layers
from eagle3.serving.server import ServerError
from eagle3.store.nearby import NoStoreError, NothingExtractedError
from tasks.evaluate import DraftSlowerError
from tasks.failure import advice, failed_task, first_error, stage_of
from tasks.train import TrainFailedError


def test_the_failed_task_is_read_from_the_errors_traceback(tmp_path: Path) -> None:
    from tasks.model import resolve_model_task

    with pytest.raises(Exception) as caught:
        resolve_model_task.fn(load_config(None, [f"model={tmp_path / 'no-model'}"]))
    assert failed_task(caught.value) == "model"
    assert failed_task(RuntimeError("never raised")) is None and failed_task(None) is None


def test_task_run_names_map_to_their_stage_and_its_advice() -> None:
    assert stage_of("extract-shard") == "extract" and stage_of("prepare") == "prepare"
    assert stage_of("plan-retry") == "plan-retry" and stage_of("something-else") == "something-else"
    text = advice("extract", None, "data/runs/k2")
    assert "`k2-extract-failed-shards`" in text and "retry-failed deployment with run_dir `data/runs/k2`" in text
    locked = type("RunLockedError", (RuntimeError,), {})("held")  # advice goes by the error's class name
    assert "Another run holds `data/runs/k2`" in advice(None, locked, "data/runs/k2")
    assert "run the same deployment again" in advice(None, ValueError("x"), "r")
    refused = ServingRefusedError("Gemma3ForCausalLM: SGLang 0.5.23 feeds ...")  # not the store's keys: its own fix
    assert "SGLang cannot serve this target's EAGLE-3 draft" in advice("preflight", refused, "r")
    assert "run.json" in advice("preflight", PreflightError("extract.aux_layers: store has ..."), "r")


def test_the_first_error_is_one_line_and_bounded() -> None:
    assert first_error(ValueError("bad\n  row 3"), None) == "ValueError: bad row 3"
    relayed = TrainFailedError.of_launch(1, Path("/r/train/train.log"), ["boilerplate"], "TrainError: the worker's own")
    assert (
        first_error(relayed, None)
        == "TrainError: the worker's own (torchrun exited with 1; whole log: /r/train/train.log)"
    )
    again = pickle.loads(pickle.dumps(relayed))  # as Prefect keeps a Failed state's exception
    assert first_error(again, None) == first_error(relayed, None) and again.worker_error == relayed.worker_error
    killed = TrainFailedError.of_launch(
        -9, Path("/r/train/train.log"), ["a", "b"], None
    )  # no worker exception: the log's tail
    assert (
        first_error(killed, None)
        == "TrainFailedError: torchrun exited with -9; whole log: /r/train/train.log; last lines: a b"
    )
    assert first_error(None, "shards [1] did not complete") == "shards [1] did not complete"
    assert len(first_error(None, "x" * 10_000)) == 2000


@pytest.mark.parametrize(
    ("stage", "error", "says", "never"),
    [
        ("prepare", DatasetUnreadableError("data/x.jsonl: no such file"), "Check `data.dataset`", "on_bad_row"),
        ("prepare", BadRowError("data/x.jsonl: row 3: no messages"), "`data.on_bad_row: skip`", "data.dataset"),
        (
            "prepare",
            StoreMismatchError("holds samples prepared differently"),
            "give this run a new `run_dir`",
            "on_bad_row",
        ),
        ("prepare", PrepareError("something else"), "Fix what the first error names", "on_bad_row"),
        ("verify", NoStoreError("data/runs/x does not exist"), "holds no store", "Run the retry-failed"),
        ("verify", NothingExtractedError("run.json missing"), "never extracted", "Run the retry-failed"),
        ("run-config", NoStoreError("data/runs/x does not exist"), "holds no store", "e.g. data/runs/demo"),
        ("verify", None, "Run the retry-failed deployment", "holds no store"),  # bad samples found: retry them
    ],
    ids=[
        "dataset-missing",
        "bad-row",
        "store-mismatch",
        "prepare-other",
        "verify-no-store",
        "verify-not-extracted",
        "retry-no-store",
        "verify-bad-samples",
    ],
)
def test_what_to_do_is_chosen_by_the_errors_cause(
    stage: str, error: BaseException | None, says: str, never: str
) -> None:
    text = advice(stage, error, "data/runs/x")
    assert says in text and never not in text
    assert "{" not in text.replace("{date}", "").replace("{model_sha}", "")  # every placeholder filled in


def _raised_from(outer: Exception, inner: Exception) -> Exception:
    try:
        try:
            raise inner
        except Exception as e:
            raise outer from e
    except Exception as e:
        return e


@pytest.mark.parametrize(
    ("stage", "error", "says", "never"),
    [
        (
            "evaluate",
            AssertionError("Torch not compiled with CUDA enabled"),
            "no usable CUDA device: set `evaluate.device` and `server.device` to `cpu`",
            "slower",
        ),
        (
            "train",
            TrainFailedError.of_launch(
                1,
                Path("data/runs/x/train/train.log"),
                [],
                "TrainError: data/runs/x/vocab_map.safetensors has 2048 draft ids, train.draft_vocab_size asks "
                "32000; re-run convert",
            ),
            "set `train.draft_vocab_size` to the number of draft ids the map has",
            "Read the trainer's own log",
        ),
        ("train", None, "set `train.aux_layers` to layers in `data/runs/x/run.json`", "Read the trainer's own log"),
        (None, DraftSlowerError("the draft makes serving slower: speed-up 0.81x"), "train longer", "Fix the cause"),
        (
            "extract",
            _raised_from(RuntimeError("shard 0 failed"), ServerError("SGLang exited with code 1 while starting")),
            "The SGLang server did not start: read its log",
            "retry-failed",
        ),
        ("train", OSError(errno.ENOSPC, "No space left on device"), "free space there", "Read the trainer's"),
    ],
    ids=["device-unavailable", "vocabulary-mismatch", "missing-layers", "slowdown", "server-start", "disk"],
)
def test_what_to_do_is_chosen_by_the_cause_whatever_the_stage(
    stage: str | None, error: BaseException | None, says: str, never: str
) -> None:
    if error is None:  # the method's own refusal of layers the store lacks
        with pytest.raises(MethodError) as caught:
            pick_layers("eagle3", [2, 4, 5], [2, 3], [2, 4, 5])
        error = caught.value
    text = advice(stage, error, "data/runs/x")
    assert says in text and never not in text, text
