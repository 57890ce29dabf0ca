"""The method table (eagle3/draft/methods.py) and train.method's drop-down (eagle3/config/train.py DraftMethodName)
name the same methods; each method says its algorithm and refuses a store without its layers."""

from __future__ import annotations

from typing import get_args

import pytest

from eagle3.config.train import DraftMethodName
from eagle3.draft.method import MethodError
from eagle3.draft.methods import METHODS, method_named


def test_the_form_and_the_table_name_the_same_methods() -> None:
    assert sorted(get_args(DraftMethodName)) == sorted(METHODS)


def test_each_method_names_its_sglang_algorithm_and_an_unknown_one_lists_the_known() -> None:
    assert {m.name: m.algorithm for m in METHODS.values()} == {
        "eagle3": "EAGLE3", "eagle3.1": "EAGLE3", "dflash": "DFLASH", "dspark": "DSPARK"}  # fmt: skip
    with pytest.raises(MethodError, match=r"train.method 'medusa' is not a draft method; choose one of"):
        method_named("medusa")


@pytest.mark.parametrize("name", ["eagle3", "eagle3.1"])
def test_an_eagle3_method_reads_a_three_layer_store_as_it_is_and_a_larger_ones_default_three(name: str) -> None:
    method = METHODS[name]
    assert method.layers([3, 7, 9], 12, None) == [3, 7, 9]
    assert method.layers([1, 2, 6, 9, 11], 12, None) == [2, 6, 9]  # [2, N//2, N-3]
    assert method.layers([1, 2, 6, 9, 11], 12, [11, 1, 6]) == [1, 6, 11]  # in the store's order
    with pytest.raises(MethodError, match=r"not \[6, 9\].*extract.aux_layers: \[1, 2, 5, 6, 9, 11\]"):
        method.layers([1, 2, 5, 11], 12, None)
