"""The live evaluation's parts without a real EAGLE3 server (SGLang 0.5.23 cannot serve one on CPU,
docs/sglang.md): fake /generate servers speak SGLang's meta_info fields; a fake launcher prints SGLang's CPU
error. The real plain server is measured in tests/integration/test_export_sglang.py."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from eagle3.config import EvaluateConfig, ServerConfig
from eagle3.evaluate.live import (
    LiveEvalError,
    PromptRun,
    classify,
    compare,
    evaluate_live,
    first_difference,
    measure,
    summarize,
    top2_at,
    unsupported_reason,
)
from eagle3.serving.server import ServerError
from tests.ports import free_port

PROMPTS = [[1, 2, 3], [4, 5, 6, 7]]


def fake_generate(speculating: bool, new_tokens: int = 6) -> type[BaseHTTPRequestHandler]:
    """A /generate that answers like SGLang with --skip-tokenizer-init (EAGLE3 fields when speculating)."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            n = min(new_tokens, body["sampling_params"]["max_new_tokens"])
            meta: dict[str, Any] = {"prompt_tokens": len(body["input_ids"]), "completion_tokens": n}
            if body.get("return_logprob"):  # SGLang's [logprob, token id, text] per top token of each output token
                meta["output_top_logprobs"] = [[[-0.7, 100, None], [-0.8, 101, None]][: body["top_logprobs_num"]]]
            if speculating:  # 3 verify passes of a 3-step chain, 3 of 9 drafts accepted
                meta.update(spec_verify_ct=3, spec_accept_length=n / 3, spec_num_correct_drafts=3,
                            spec_num_proposed_drafts=9)  # fmt: skip
            data = json.dumps({"output_ids": list(range(100, 100 + n)), "meta_info": meta}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            return None

    return Handler


@pytest.fixture
def fake_server(request: pytest.FixtureRequest) -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), fake_generate(speculating=request.param))
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


@pytest.mark.parametrize("fake_server", [True], indirect=True)
def test_measure_reads_acceptance_from_a_fake_eagle3_server(fake_server: str) -> None:
    run, outputs = measure(fake_server, PROMPTS, label="eagle3", max_new_tokens=6)
    assert run.completion_tokens == 12 and outputs == [list(range(100, 106))] * 2
    assert run.accept_length == pytest.approx(12 / 6)  # completion tokens / verify passes, as SGLang defines it
    assert run.accept_rate == pytest.approx(6 / 18)
    assert run.tokens_per_s > 0 and [p.prompt_tokens for p in run.prompts] == [3, 4]


@pytest.mark.parametrize("fake_server", [False], indirect=True)
def test_a_fake_server_that_does_not_speculate_is_refused_as_the_eagle3_side(fake_server: str) -> None:
    plain, _ = measure(fake_server, PROMPTS, label="plain", max_new_tokens=6)
    assert plain.accept_length is None
    with pytest.raises(LiveEvalError, match="not speculating"):
        measure(fake_server, PROMPTS, label="eagle3", max_new_tokens=6)


def _run(label: str, tokens: int, seconds: float, verify: int | None = None) -> Any:
    return summarize(
        label, [PromptRun(prompt_tokens=3, completion_tokens=tokens, seconds=seconds, verify_passes=verify)]
    )  # type: ignore[arg-type]


def test_a_slower_draft_is_flagged_loudly_and_mismatches_are_counted() -> None:
    plain, eagle3 = _run("plain", 64, 1.0), _run("eagle3", 64, 2.0, verify=40)
    got = compare(plain, eagle3, [[1, 2, 3], [4, 5]], [[1, 2, 3], [4, 6]])
    assert got["speed_up"] == pytest.approx(0.5) and got["flag"] is True
    assert got["summary"].startswith("FLAGGED") and "SLOWER" in got["summary"]
    assert got["mismatched_prompts"] == 1 and got["first_mismatch"] == [None, 1]
    assert got["accept_length"] == pytest.approx(64 / 40)

    faster = compare(plain, _run("eagle3", 64, 0.5, verify=20), [[1]], [[1]])
    assert faster["flag"] is False and faster["speed_up"] == pytest.approx(2.0) and "FLAGGED" not in faster["summary"]


@pytest.mark.parametrize("fake_server", [False], indirect=True)
def test_the_top_two_next_tokens_are_read_from_sglangs_top_logprobs(fake_server: str) -> None:
    import httpx

    with httpx.Client() as client:
        assert top2_at(client, fake_server, [1, 2, 3], 10.0) == [(100, -0.7), (101, -0.8)]


def test_differing_outputs_are_near_ties_only_between_the_top_two_within_the_gap_and_never_in_float32() -> None:
    plain = [[1, 2, 3], [4, 5, 6], [7, 8], [9]]
    eagle3 = [[1, 2, 3], [4, 5, 7], [7, 2], [9]]
    tops = {(1, 2): [(6, -0.50), (7, -0.60)], (2, 1): [(8, -0.10), (2, -3.00)]}  # a near-tie; a clear choice
    diffs = classify(plain, eagle3, lambda i, d: tops[(i, d)], exact=False)
    assert [(d.prompt, d.position, d.near_tie) for d in diffs] == [(1, 2, True), (2, 1, False)]
    assert diffs[0].gap == pytest.approx(0.1) and diffs[1].gap == pytest.approx(2.9)
    assert (diffs[1].plain_token, diffs[1].eagle3_token) == (8, 2)
    run = _run("plain", 8, 1.0), _run("eagle3", 8, 1.0, verify=4)
    got = compare(*run, plain, eagle3, differences=diffs)
    assert got["unexplained"] == 1 and got["summary"].startswith("OUTPUTS CHANGED: speculation changed 1 greedy")
    assert "2/4 outputs differ (1 near-ties, 1 not: prompt 2 at 1: gap 2.900)" in got["summary"]
    exact = classify(plain, eagle3, lambda i, d: tops[(i, d)], exact=True)  # float32 on CPU: identical or wrong
    assert [d.near_tie for d in exact] == [False, False]
    assert "float32 on CPU must be identical" in compare(*run, plain, eagle3, differences=exact, exact=True)["summary"]
    same = compare(*run, plain, plain, differences=classify(plain, plain, lambda i, d: [], exact=True), exact=True)
    assert same["unexplained"] == 0 and "OUTPUTS CHANGED" not in same["summary"]


def test_on_a_cpu_server_a_slower_draft_is_not_judged() -> None:
    got = compare(_run("plain", 64, 1.0), _run("eagle3", 64, 2.0, verify=40), [[1]], [[1]], judge_speed=False)
    assert got["flag"] is False and "FLAGGED" not in got["summary"] and "speed not judged on CPU" in got["summary"]


def test_first_difference_counts_a_shorter_output_as_a_difference() -> None:
    assert first_difference([1, 2], [1, 2]) is None
    assert first_difference([1, 2, 3], [1, 2]) == 2
    assert first_difference([9], [1]) == 0


def draft_dir(tmp_path: Path) -> Path:
    d = tmp_path / "draft"
    d.mkdir()
    (d / "config.json").write_text("{}")
    return d


def test_auto_without_an_sglang_environment_skips_without_launching_and_says_how_to_build_it(tmp_path: Path) -> None:
    server = ServerConfig(engine="sglang", device="cpu", python=str(tmp_path / "no-such-python"))
    result = evaluate_live(PROMPTS, draft_dir=draft_dir(tmp_path), model_dir=tmp_path, run_dir=tmp_path,
                           server=server, evaluate=EvaluateConfig(), base_env={})  # fmt: skip
    assert result.status == "skipped" and "no SGLang environment" in (result.reason or "")
    assert "make sglang-env" in (result.reason or "")
    assert result.flag is False and result.speed_up is None
    assert json.loads((tmp_path / "eval" / "live.json").read_text())["status"] == "skipped"


def test_a_tree_draft_on_cpu_is_skipped_naming_the_chain_only_fallback(tmp_path: Path) -> None:
    python = tmp_path / "python"
    python.write_text("")
    server = ServerConfig(engine="sglang", device="cpu", python=str(python))
    result = evaluate_live(PROMPTS, draft_dir=draft_dir(tmp_path), model_dir=tmp_path, run_dir=tmp_path,
                           server=server, evaluate=EvaluateConfig(eagle_topk=4), base_env={})  # fmt: skip
    assert result.status == "skipped" and "eagle_topk is 4" in (result.reason or "")


def test_a_fake_sglang_that_fails_with_the_cpu_error_gives_unsupported_not_a_crash(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "stub").mkdir()
    (venv / "stub" / "libcuda.so.1").write_bytes(b"")
    python = venv / "bin" / "python"
    python.write_text(
        "#!/bin/sh\necho \"switch=$EAGLE3_CPU_SPEC\"\necho 'Scheduler hit an exception: Traceback'\n"
        "echo 'ValueError: EAGLE is not supported in decode attention backend torch_native'\nexit 1\n"
    )
    python.chmod(0o755)
    server = ServerConfig(engine="sglang", device="cpu", python=str(python), startup_timeout_s=30, port=free_port())
    result = evaluate_live(PROMPTS, draft_dir=draft_dir(tmp_path), model_dir=tmp_path, run_dir=tmp_path,
                           server=server, evaluate=EvaluateConfig(live="on"), base_env={})  # fmt: skip
    assert result.status == "unsupported" and result.plain is None
    assert result.reason == "ValueError: EAGLE is not supported in decode attention backend torch_native"
    log = (tmp_path / "eval" / "server-eagle3" / "sglang.log").read_text()
    assert "switch=1" in log  # on CPU the EAGLE3 server gets the plugin's switch (server_patch/cpu_spec.py)
    assert not (tmp_path / "eval" / "server-plain").exists()  # the plain run is not spent on a draft that cannot run


def test_any_other_launch_failure_is_raised() -> None:
    assert (
        unsupported_reason(ServerError("SGLang exited with code 1 while starting; log x:\nOSError: out of memory"))
        is None
    )


def test_a_block_drafter_is_served_with_its_exports_flags_and_an_eagle3_draft_with_evaluates(tmp_path: Path) -> None:
    from eagle3.evaluate.live import draft_algorithm, draft_cli_args

    spec = {"num_steps": 3, "eagle_topk": 1, "num_draft_tokens": 4}
    eagle = tmp_path / "eagle"
    eagle.mkdir()
    assert draft_algorithm(eagle) == ("EAGLE3", [])  # no export.json: an EAGLE-3 directory
    assert draft_cli_args(eagle, spec)[:2] == ["--speculative-algorithm", "EAGLE3"]
    block = tmp_path / "block"
    block.mkdir()
    (block / "export.json").write_text(json.dumps({"speculative_algorithm": "DFLASH", "sglang_args": [
        "--model-path", "/m", "--speculative-algorithm", "DFLASH", "--speculative-draft-model-path", "/old",
        "--speculative-num-draft-tokens", "16"]}))  # fmt: skip
    assert draft_cli_args(block, spec) == ["--speculative-algorithm", "DFLASH", "--speculative-draft-model-path",
                                           str(block.resolve()), "--speculative-num-draft-tokens", "16"]  # fmt: skip
