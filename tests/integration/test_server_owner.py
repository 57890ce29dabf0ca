"""The live evaluation's servers never outlive the process that runs it (real SGLang on CPU, a random draft):
SIGKILL of a process in the middle of `evaluate_live`, while its EAGLE3 server (draft + target, the heavier of
its two servers) serves, leaves within 10 s no process of that server and a free port. The plain server is the
same code path (eagle3/evaluate/live.py serve_and_measure -> SGLangServer); the full flow's SIGKILL and cancel are
in tests/e2e/test_server_owner_flow.py, a complete live evaluation in tests/integration/test_live_sglang_cpu.py."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from eagle3.serving import procs
from eagle3.serving.record import read_record
from tests.integration.sglang_support import export_random_draft, require_sglang_env
from tests.integration.test_faults_sglang import wait_for
from tests.ports import free_port

pytestmark = [pytest.mark.sglang, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]
_EVALUATE = """
import os, sys
from pathlib import Path
from eagle3.config import EvaluateConfig
from eagle3.evaluate.live import evaluate_live
from tests.integration.sglang_support import sglang_config

root, model, draft, port, prompt = *map(Path, sys.argv[1:4]), int(sys.argv[4]), sys.argv[5]
server = sglang_config(root / "run", model).server
ev = EvaluateConfig.model_validate({"live": "on", "draft_steps": 3, "eagle_topk": 1, "num_draft_tokens": 4,
                                    "max_new_tokens": 512, "request_timeout_s": 3600})
evaluate_live([[int(t) for t in prompt.split(",")]] * 50, draft_dir=draft, model_dir=model, run_dir=root / "run",
              server=server, evaluate=ev, base_env=dict(os.environ), port=port)
"""


def test_sigkill_of_a_process_in_the_live_evaluation_ends_its_eagle3_server_within_10_s(
    demo_model: Path, demo_tokenizer: Any, tmp_path: Path
) -> None:
    require_sglang_env()
    result, _ = export_random_draft(demo_model, tmp_path / "draft", 4096)
    chat = [{"role": "user", "content": "Count from 1 to 100."}]
    text = demo_tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
    prompt = demo_tokenizer(text, add_special_tokens=False).input_ids
    port = free_port()
    owner = subprocess.Popen(
        [sys.executable, "-c", _EVALUATE, str(tmp_path), str(demo_model), str(result.out_dir), str(port),
         ",".join(map(str, prompt))],
        cwd=REPO, stdout=(tmp_path / "owner.log").open("wb"), stderr=subprocess.STDOUT,
    )  # fmt: skip
    path = tmp_path / "run" / "eval" / "server-eagle3" / "server.json"
    try:

        def serving() -> bool:
            assert owner.poll() is None, (tmp_path / "owner.log").read_text()[-3000:]
            record = read_record(path)
            return record is not None and record.server is not None

        wait_for("the EAGLE3 server serving", serving, 900, every_s=0.2)
        time.sleep(2.0)  # requests in flight
        record = read_record(path)
        assert record is not None and record.port == port and record.owner.pid == owner.pid
        assert "--speculative-draft-model-path" in record.server.cmdline  # type: ignore[union-attr]
        pids = sorted(set(procs.group_members(record.pgid)) | set(procs.descendants(record.keeper.pid)))
        assert len(pids) >= 4, pids  # keeper, SGLang, scheduler, detokenizer
        owner.send_signal(signal.SIGKILL)
        owner.wait(30)
        t0 = time.monotonic()

        def gone() -> bool:
            live = [p for p in pids if procs.identity(p) is not None and not procs.is_zombie(p)]
            return not live and procs.port_holders(port) == []

        wait_for("every process of the server gone and its port free", gone, 10.0, every_s=0.1)
        print(f"EAGLE3 server gone {time.monotonic() - t0:.1f} s after SIGKILL of its owner")
        assert not path.exists()  # the keeper removed its record
        assert not (tmp_path / "run" / "eval" / "server-plain").exists()  # killed before the plain server
    finally:
        owner.kill()
        owner.wait(30)
