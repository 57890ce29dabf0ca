"""The offline evaluator feeds the draft the residual stream (HF hidden_states): a store that recorded another tap
is refused, not measured on states its draft was not trained on."""

from __future__ import annotations

from pathlib import Path

import pytest

from eagle3.evaluate.offline import EvalError, aux_layers_of
from eagle3.store.run_store import RunInfo, RunStore


def store_with_tap(root: Path, tap: str | None) -> Path:
    fields = {"tap": tap} if tap is not None else {}
    RunStore(root).write_run_info(
        RunInfo(
            model_path="m",
            model_sha256="a",
            tokenizer_sha256="b",
            engine="sglang",
            engine_version="0.5.23",
            dtype="bfloat16",
            hidden_size=64,
            num_layers=8,
            vocab_size=100,
            aux_layers=[2, 4, 5],
            engine_layer_ids=[1, 3, 4],
            engine_layer_convention="x",
            dataset_fingerprint="d",
            versions={},
            config={},
            **fields,
        )
    )
    return root


def test_a_residual_store_and_one_written_before_the_tap_was_recorded_give_their_layers(tmp_path: Path) -> None:
    assert aux_layers_of(store_with_tap(tmp_path / "a", "residual")) == [2, 4, 5]
    assert aux_layers_of(store_with_tap(tmp_path / "b", None)) == [2, 4, 5]  # the default: residual


def test_a_store_of_another_tap_is_refused_naming_it(tmp_path: Path) -> None:
    with pytest.raises(EvalError, match=r"run.json: the store holds the 'gemma3' tap.*residual stream"):
        aux_layers_of(store_with_tap(tmp_path, "gemma3"))
