"""Generation request ids (eagle3/serving/generation.py): never captured by the hook, one per attempt."""

from __future__ import annotations

from eagle3.serving.generation import make_generation_rid
from eagle3.store import dump_protocol as proto
from server_patch.capture import plan_batch


def test_generation_rids_are_never_captured_by_the_hook_and_each_attempt_has_its_own() -> None:
    rids = [
        make_generation_rid("0123456789", "abcdef0123456789", turn, attempt) for turn in (0, 1) for attempt in (0, 1, 2)
    ]
    assert len(set(rids)) == len(rids)
    assert not any(r.startswith(proto.RID_PREFIX) for r in rids)
    extraction = proto.make_rid("0123456789", "abcdef0123456789")
    plan = plan_batch([*rids, extraction], [4] * 7, [0] * 7, [4] * 7, proto.RID_PREFIX)
    assert [s.rid for s in plan.segments] == [extraction]  # the hook takes only the extraction request
