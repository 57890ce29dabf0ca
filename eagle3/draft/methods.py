"""The draft methods, one row each: `train.method`'s value -> the method folder's METHOD (eagle3/draft/method.py
says what a method provides; docs/methods.md what each one needs and where it is tested). Adding a method: its folder
eagle3/draft/<method>/, its row here, its name in eagle3/config/train.py's DraftMethodName (the form's drop-down;
tests/unit/draft/test_methods.py keeps the two equal), a row in docs/methods.md, and its tests.
"""

from __future__ import annotations

from eagle3.draft import dflash, dspark, eagle3, eagle3_1
from eagle3.draft.method import DraftMethod, MethodError

METHODS: dict[str, DraftMethod] = {m.name: m for m in (eagle3.METHOD, eagle3_1.METHOD, dflash.METHOD, dspark.METHOD)}


def method_named(name: str) -> DraftMethod:
    """The method `train.method` names; MethodError listing the known ones otherwise."""
    try:
        return METHODS[name]
    except KeyError:
        raise MethodError(f"train.method {name!r} is not a draft method; choose one of {sorted(METHODS)}") from None
