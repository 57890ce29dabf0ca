"""server_patch.hook's start-up check of a worker (what it reports before any capture): a server launched with
two-batch overlap, which skips the capture of most layers in the MoE families, is refused with the fix, and the
same worker without it writes. SGLang's worker and its parallel state are stand-ins (SimpleNamespace): SGLang's
scheduler does not run in a unit test; the status file is the one the server checks read."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from eagle3.store import dump_protocol as proto
from server_patch import hook


@pytest.mark.parametrize("overlap", [True, False])
def test_a_worker_running_two_batch_overlap_is_refused_and_one_without_it_writes(
    overlap: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(hook, "_state", hook._State(tmp_path, "e3-", [2, 4, 5], 4))
    monkeypatch.setattr(hook, "_ranks", lambda: {"tp_rank": 0, "attn_tp_rank": 0})
    model = SimpleNamespace(model=SimpleNamespace(layers_to_capture=[4, 2, 5]))
    worker = SimpleNamespace(model_runner=SimpleNamespace(model=model),
                             server_args=SimpleNamespace(enable_two_batch_overlap=overlap))  # fmt: skip
    try:
        hook._after_init(None, worker)
    finally:
        if hook._state is not None and hook._state.writer is not None:
            hook._state.writer.close()
    (status,) = proto.read_statuses(tmp_path)
    assert status["layers_to_capture"] == [2, 4, 5]
    if overlap:
        assert (
            "--enable-two-batch-overlap" in status["problem"] and "relaunch the server without it" in status["problem"]
        )
        assert status["writes"] is False
    else:
        assert status["problem"] is None and status["writes"] is True
