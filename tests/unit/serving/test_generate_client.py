"""Generation requests (eagle3/serving/generation.py): ids never captured by the hook, one per attempt; with
affinity (server.prefix_cache) a conversation's turns on one server."""

from __future__ import annotations

from typing import Any

import pytest

from eagle3.config import SynthesizeConfig
from eagle3.serving.generation import Generated, GenerationClient, _Transient, home_server, make_generation_rid
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


class _Up:
    """A server that is up (the client reads its url and asks whether it is alive after a failed attempt)."""

    def __init__(self, url: str) -> None:
        self.url = url

    def start(self) -> None: ...

    def is_alive(self) -> bool:
        return True

    def restart(self, reason: str) -> None: ...


def test_with_affinity_a_conversations_turns_go_to_its_home_server_and_a_resend_to_the_least_busy(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    servers = [_Up("http://a"), _Up("http://b")]
    sent: list[tuple[str, str]] = []  # (rid, server url)
    fail_first = {"x.t1"}

    def attempt(server: _Up, rid: str, input_ids: list[int], sampling: dict[str, Any]) -> Generated:
        sent.append((rid, server.url))
        key = f"{rid.rsplit('-', 2)[-2]}.{rid.rsplit('-', 1)[-1]}"  # "<sample id>.t<turn>"
        if key in fail_first:
            fail_first.discard(key)
            raise _Transient("connection reset")
        return Generated([1], "stop")

    with GenerationClient(servers, SynthesizeConfig(), stop_ids=[0], run_id="r", retry_delay_s=0.0,
                          affinity=True) as client:  # fmt: skip
        monkeypatch.setattr(client, "_attempt", attempt)
        ids = [f"s{i}" for i in range(32)]
        for sid in ids:
            for turn in range(3):
                client.generate([5, 6], sample_id=sid, turn=turn)
        homes = {sid: {url for rid, url in sent if f"-{sid}-" in rid} for sid in ids}
        assert all(urls == {servers[home_server(sid, 2)].url} for sid, urls in homes.items())  # one server each
        assert {home_server(sid, 2) for sid in ids} == {0, 1}  # the conversations spread over both
        sent.clear()
        client.generate([5, 6], sample_id="x", turn=1)  # fails once on its home server, then is resent
        assert sent[0][1] == servers[home_server("x", 2)].url
        assert len(sent) == 2 and client.resent == 1
    with GenerationClient(servers, SynthesizeConfig(), stop_ids=[0], run_id="r") as plain:  # no affinity
        monkeypatch.setattr(plain, "_attempt", attempt)
        sent.clear()
        for turn in range(3):
            plain.generate([5, 6], sample_id=ids[1], turn=turn)
        assert {url for _, url in sent} == {"http://a"}  # the least busy: none in flight, the first
