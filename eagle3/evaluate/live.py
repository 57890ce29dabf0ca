"""Live evaluation: the exported draft served by SGLang with EAGLE3 against the plain target, on the same prompts.

    result = evaluate_live(prompts, draft_dir=..., model_dir=..., run_dir=..., server=cfg.server,
                           evaluate=cfg.evaluate, base_env=os.environ, progress=...)   # also <run_dir>/eval/live.json

Phases, each returning its stats:
    serve     launch SGLang (eagle3/serving/server.py) with the draft (`--speculative-algorithm EAGLE3 ...`), or plain
    generate  warm up with one short request, then every prompt alone (batch 1, temperature 0, max_new_tokens):
              wall time, completion tokens, and from meta_info `spec_verify_ct` (verify passes) and
              `spec_num_correct_drafts` / `spec_num_proposed_drafts`
    compare   tokens/s of each server and the speed-up; acceptance length = completion tokens / verify passes
              over all prompts (SGLang's `spec_accept_length`, bonus token included)
    classify  each prompt whose outputs differ, at its first differing position, asked of the plain server (still
              up) with the top-2 log-probabilities: a near-tie (the two tokens are the target's top two, at most
              NEAR_TIE_GAP apart: a 4-token bf16 verify and a 1-token decode may round them either way) or not.
              Where the comparison can be exact (float32 on CPU) every difference counts; `unexplained` > 0 means
              speculation changed the target's greedy output: a serving bug, never a weak draft.

The draft server runs first, so a draft SGLang cannot serve is found before the plain run is spent. A
speed-up below 1.0 sets `flag` and a loud `summary`: a draft that slows serving down must not pass quietly. On a CPU
server the speed is not judged (no flag; the summary says so): SGLang's CPU drafting fallback says nothing of a GPU.
On CPU, stock SGLang 0.5.23 cannot serve EAGLE3 (docs/sglang.md); the EAGLE3 server is started there with
EAGLE3_CPU_SPEC=1, which makes our plugin supply what is missing for chain drafting (server_patch/cpu_spec.py;
eagle_topk 1 only). `evaluate.live: auto` skips, without launching anything, when there is no SGLang
environment; a launch that fails with the known "cannot serve EAGLE3 here" errors gives status "unsupported",
not a crash.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import httpx
from pydantic import BaseModel, ConfigDict, Field

from eagle3.config import EvaluateConfig, ServerConfig
from eagle3.evaluate.sizes import new_tokens
from eagle3.progress import ProgressCounter, ProgressFn, no_progress
from eagle3.serving.server import ServerError, SGLangServer, server_device
from eagle3.store import dump_protocol as proto
from eagle3.store.fsio import atomic_write_json, read_json
from eagle3.store.paths import EXPORT_FILE, FIRST_METHOD, RunPaths
from eagle3.store.run_store import now, read_record

LIVE_FORMAT = "eagle3-eval-live/1"
WARMUP_TOKENS = 8
#: The widest top-2 log-probability gap a bf16 verify may flip: bf16 keeps 8 bits of mantissa, so logits of 10-30
#: round by up to ~0.06-0.12 each, and their difference by twice that.
NEAR_TIE_GAP = 0.25
NOT_JUDGED_ON_CPU = "speed not judged on CPU: SGLang's CPU drafting fallback says nothing about serving on a GPU"
#: The plugin's switch for EAGLE3 on a CPU server (server_patch/cpu_spec.py).
#: Log lines by which SGLang 0.5.23 (or the plugin's CPU fallback) says it cannot run EAGLE3 here (docs/sglang.md).
UNSUPPORTED_SIGNS = (
    "EAGLE is not supported in",
    "no attribute 'copy_all_layer_kv_cache_cpu'",
    "object has no attribute 'verify_tree_greedy_cpu'",
    "eagle3 cpu_spec drafts chains only",
    "eagle3 cpu_spec refused to load",
)


class LiveEvalError(RuntimeError):
    """A server answered something the evaluation cannot use; the message names the server and the prompt."""


class PromptRun(BaseModel):
    model_config = ConfigDict(extra="forbid")
    prompt_tokens: int
    completion_tokens: int
    seconds: float
    verify_passes: int | None = None  # spec_verify_ct
    correct_drafts: int | None = None  # spec_num_correct_drafts
    proposed_drafts: int | None = None  # spec_num_proposed_drafts


class ServerRun(BaseModel):
    """One server's pass over the prompts."""

    model_config = ConfigDict(extra="forbid")
    label: Literal["plain", "eagle3"]
    completion_tokens: int
    seconds: float
    tokens_per_s: float
    accept_length: float | None = Field(None, description="completion tokens / verify passes (eagle3 only)")
    accept_rate: float | None = Field(None, description="correct / proposed draft tokens (eagle3 only)")
    startup_s: float | None = None
    server_args: list[str] = Field(default_factory=list)
    prompts: list[PromptRun]


class OutputDifference(BaseModel):
    """Where one prompt's EAGLE3 output first leaves the plain server's, and whether that is a near-tie."""

    model_config = ConfigDict(extra="forbid")
    prompt: int
    position: int
    plain_token: int | None  # None: the plain output ended there
    eagle3_token: int | None
    top2: list[tuple[int, float]] = Field(description="the plain target's two likeliest tokens there: (id, logprob)")
    gap: float | None = Field(None, description="top-1 minus top-2 log-probability")
    near_tie: bool


class LiveEvalResult(BaseModel):
    """<run_dir>/eval/live.json."""

    model_config = ConfigDict(extra="forbid")
    format: str = LIVE_FORMAT
    status: Literal["ok", "skipped", "unsupported"]
    reason: str | None = None
    device: str
    draft_dir: str
    model_dir: str
    num_prompts: int
    max_new_tokens: int
    speculative: dict[str, int] = Field(description="num_steps, eagle_topk, num_draft_tokens")
    plain: ServerRun | None = None
    eagle3: ServerRun | None = None
    speed_up: float | None = Field(None, description="eagle3 tokens/s over plain tokens/s")
    accept_length: float | None = None
    mismatched_prompts: int | None = Field(None, description="prompts whose greedy outputs differ")
    first_mismatch: list[int | None] | None = Field(None, description="per prompt: first differing position")
    exact: bool = Field(False, description="float32 on CPU: outputs must be identical, near-ties included")
    differences: list[OutputDifference] = Field(default_factory=list, description="each differing prompt, classified")
    unexplained: int | None = Field(
        None, description="differences that are not near-ties (every difference where `exact`): a serving bug"
    )
    flag: bool = Field(False, description="speed-up below 1.0: the draft makes serving slower")
    summary: str
    created_at: str = Field(default_factory=now)


def speculative_args(evaluate: EvaluateConfig) -> dict[str, int]:
    draft_tokens = evaluate.num_draft_tokens or evaluate.draft_steps + 1
    return {"num_steps": evaluate.draft_steps, "eagle_topk": evaluate.eagle_topk, "num_draft_tokens": draft_tokens}


#: The algorithms the plugin's CPU fallback (server_patch/cpu_spec.py) serves; SGLang 0.5.23 refuses the block
#: drafters (DFLASH, DSPARK) off CUDA at argument resolution, before any model loads.
CPU_ALGORITHMS = ("EAGLE3",)


def draft_algorithm(draft_dir: Path) -> tuple[str, list[str]]:
    """(SGLang's --speculative-algorithm, the export's own serving flags) of an exported draft, from its export.json
    (eagle3/release/export.py); EAGLE3 and no flags for a directory without one."""
    path = Path(draft_dir) / EXPORT_FILE
    record = read_json(path) if path.is_file() else {}
    args = list(record.get("sglang_args", []))
    if "--model-path" in args:  # the server adds the target itself
        i = args.index("--model-path")
        del args[i : i + 2]
    return str(record.get("speculative_algorithm", "EAGLE3")), args


def draft_cli_args(draft_dir: Path, spec: Mapping[str, int]) -> list[str]:
    """The server's flags for the draft: EAGLE-3's chain from evaluate's settings (`spec`), a block drafter's from
    its export (its block size), with the draft path where it is now."""
    algorithm, args = draft_algorithm(draft_dir)
    if algorithm == "EAGLE3":
        return eagle3_cli_args(draft_dir, spec)
    if "--speculative-draft-model-path" in args:
        args[args.index("--speculative-draft-model-path") + 1] = str(Path(draft_dir).resolve())
    return args


def eagle3_cli_args(draft_dir: Path, spec: Mapping[str, int]) -> list[str]:
    return [
        "--speculative-algorithm", "EAGLE3",
        "--speculative-draft-model-path", str(Path(draft_dir).resolve()),
        "--speculative-num-steps", str(spec["num_steps"]),
        "--speculative-eagle-topk", str(spec["eagle_topk"]),
        "--speculative-num-draft-tokens", str(spec["num_draft_tokens"]),
    ]  # fmt: skip


# generate ------------------------------------------------------------------------------------------------------------
def generate_one(
    client: httpx.Client, url: str, prompt: Sequence[int], max_new_tokens: int, timeout_s: float
) -> tuple[list[int], dict[str, Any], float]:
    """(output ids, meta_info, wall seconds) of one greedy request."""
    body = {"input_ids": list(prompt), "sampling_params": {"temperature": 0.0, "max_new_tokens": max_new_tokens}}
    t0 = time.perf_counter()
    r = client.post(f"{url}/generate", json=body, timeout=timeout_s)
    seconds = time.perf_counter() - t0
    if r.status_code != 200:
        raise LiveEvalError(f"{url}/generate answered {r.status_code}: {r.text[:500]}")
    out = r.json()
    ids, meta = out.get("output_ids"), out.get("meta_info") or {}
    if not isinstance(ids, list):
        raise LiveEvalError(f"{url}/generate returned no output_ids (is the server run with --skip-tokenizer-init?)")
    return [int(t) for t in ids], meta, seconds


def top2_at(client: httpx.Client, url: str, ids: Sequence[int], timeout_s: float) -> list[tuple[int, float]]:
    """The server's two likeliest next tokens after `ids`, with their log-probabilities (one greedy token asked with
    SGLang's top_logprobs_num)."""
    body = {"input_ids": list(ids), "sampling_params": {"temperature": 0.0, "max_new_tokens": 1},
            "return_logprob": True, "top_logprobs_num": 2}  # fmt: skip
    r = client.post(f"{url}/generate", json=body, timeout=timeout_s)
    if r.status_code != 200:
        raise LiveEvalError(f"{url}/generate (top_logprobs_num 2) answered {r.status_code}: {r.text[:500]}")
    tops = (r.json().get("meta_info") or {}).get("output_top_logprobs") or [None]
    if not tops[0]:
        raise LiveEvalError(f"{url}/generate returned no meta_info.output_top_logprobs for top_logprobs_num 2")
    return [(int(token), float(logprob)) for logprob, token, *_ in tops[0]]


def measure(
    url: str,
    prompts: Sequence[Sequence[int]],
    *,
    label: Literal["plain", "eagle3"],
    max_new_tokens: int,
    timeout_s: float = 600.0,
    counter: ProgressCounter | None = None,
) -> tuple[ServerRun, list[list[int]]]:
    """Warm up, then generate each prompt alone; the server's stats and the generated ids per prompt."""
    runs, outputs = [], []
    with httpx.Client() as client:
        generate_one(client, url, prompts[0], WARMUP_TOKENS, timeout_s)  # first-request costs stay out of the timing
        for i, prompt in enumerate(prompts):
            ids, meta, seconds = generate_one(client, url, prompt, max_new_tokens, timeout_s)
            run = PromptRun(
                prompt_tokens=int(meta.get("prompt_tokens", len(prompt))),
                completion_tokens=int(meta.get("completion_tokens", len(ids))),
                seconds=seconds,
                verify_passes=meta.get("spec_verify_ct"),
                correct_drafts=meta.get("spec_num_correct_drafts"),
                proposed_drafts=meta.get("spec_num_proposed_drafts"),
            )
            if label == "eagle3" and run.completion_tokens > 0 and not run.verify_passes:
                raise LiveEvalError(
                    f"{url}: prompt {i} came back without meta_info.spec_verify_ct: the server is not speculating "
                    "(was it launched with --speculative-algorithm EAGLE3?)"
                )
            runs.append(run)
            outputs.append(ids)
            if counter is not None:
                counter.add(tokens=run.completion_tokens)
    return summarize(label, runs), outputs


def summarize(label: Literal["plain", "eagle3"], runs: list[PromptRun]) -> ServerRun:
    tokens, seconds = sum(r.completion_tokens for r in runs), sum(r.seconds for r in runs)
    verify = sum(r.verify_passes or 0 for r in runs)
    proposed = sum(r.proposed_drafts or 0 for r in runs)
    return ServerRun(
        label=label,
        completion_tokens=tokens,
        seconds=seconds,
        tokens_per_s=tokens / seconds if seconds > 0 else 0.0,
        accept_length=tokens / verify if verify else None,
        accept_rate=sum(r.correct_drafts or 0 for r in runs) / proposed if proposed else None,
        prompts=runs,
    )


# compare -------------------------------------------------------------------------------------------------------------
def first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def classify(
    plain_out: Sequence[Sequence[int]],
    eagle3_out: Sequence[Sequence[int]],
    top2: Callable[[int, int], list[tuple[int, float]]],
    *,
    exact: bool,
) -> list[OutputDifference]:
    """Each prompt whose outputs differ, at its first differing position: `top2(prompt, position)` is the plain
    target's top two there. A near-tie unless `exact` (float32 on CPU, where verify and decode compute alike)."""
    out = []
    for i, (a, b) in enumerate(zip(plain_out, eagle3_out, strict=True)):
        d = first_difference(a, b)
        if d is None:
            continue
        best = top2(i, d)
        plain_token, eagle3_token = (a[d] if d < len(a) else None), (b[d] if d < len(b) else None)
        gap = best[0][1] - best[1][1] if len(best) >= 2 else None
        top_two = {t for t, _ in best[:2]}
        near = (not exact and gap is not None and gap <= NEAR_TIE_GAP
                and eagle3_token in top_two and (plain_token is None or plain_token in top_two))  # fmt: skip
        out.append(OutputDifference(prompt=i, position=d, plain_token=plain_token, eagle3_token=eagle3_token,
                                    top2=best, gap=gap, near_tie=near))  # fmt: skip
    return out


def differences_text(diffs: Sequence[OutputDifference], exact: bool) -> str:
    """`2 near-ties, 1 not (prompt 3 at 17: gap 1.84)`, or `identical required (float32 on CPU)`."""
    if not diffs:
        return ""
    wrong = [d for d in diffs if not d.near_tie]
    where = ", ".join(f"prompt {d.prompt} at {d.position}: gap {d.gap:.3f}" if d.gap is not None else
                      f"prompt {d.prompt} at {d.position}" for d in wrong[:3])  # fmt: skip
    if exact:
        return f" (float32 on CPU must be identical: {where})"
    near = len(diffs) - len(wrong)
    return f" ({near} near-ties" + (f", {len(wrong)} not: {where})" if wrong else ")")


def compare(
    plain: ServerRun,
    eagle3: ServerRun,
    plain_out: Sequence[Sequence[int]],
    eagle3_out: Sequence[Sequence[int]],
    *,
    differences: Sequence[OutputDifference] = (),
    exact: bool = False,
    judge_speed: bool = True,
) -> dict[str, Any]:
    """speed_up, accept_length, mismatches and their classification, flag and the one-line summary. `judge_speed`
    off (a CPU server): no flag, and the summary says the speed is not judged."""
    speed_up = eagle3.tokens_per_s / plain.tokens_per_s if plain.tokens_per_s > 0 else 0.0
    diffs = [first_difference(a, b) for a, b in zip(plain_out, eagle3_out, strict=True)]
    mismatched = sum(d is not None for d in diffs)
    flag = judge_speed and speed_up < 1.0
    unexplained = sum(not d.near_tie for d in differences)
    acc = f"{eagle3.accept_length:.2f}" if eagle3.accept_length is not None else "n/a"
    line = (
        f"EAGLE3 {eagle3.tokens_per_s:.1f} tok/s vs plain {plain.tokens_per_s:.1f} tok/s: {speed_up:.2f}x, "
        f"accept length {acc}, {mismatched}/{len(diffs)} outputs differ{differences_text(differences, exact)}"
    )
    if not judge_speed:
        line += f"; {NOT_JUDGED_ON_CPU}"
    summary = f"FLAGGED: the draft makes serving SLOWER. {line}" if flag else line
    if unexplained:
        summary = f"OUTPUTS CHANGED: speculation changed {unexplained} greedy output(s) beyond a near-tie. {summary}"
    return {
        "exact": exact,
        "differences": list(differences),
        "unexplained": unexplained,
        "speed_up": speed_up,
        "accept_length": eagle3.accept_length,
        "mismatched_prompts": mismatched,
        "first_mismatch": diffs,
        "flag": flag,
        "summary": summary,
    }


# serve ---------------------------------------------------------------------------------------------------------------
def serve_and_measure(
    server: ServerConfig,
    model_dir: Path,
    extra_args: list[str],
    prompts: Sequence[Sequence[int]],
    *,
    label: Literal["plain", "eagle3"],
    evaluate: EvaluateConfig,
    log_dir: Path,
    base_env: Mapping[str, str],
    port: int | None = None,
    counter: ProgressCounter | None = None,
    then: Callable[[str, list[list[int]]], None] | None = None,
) -> tuple[ServerRun, list[list[int]]]:
    """Launch SGLang (server section + extra_args), measure the prompts, `then(url, outputs)` while it is still up
    (the plain server classifies the differences), stop it. Raises ServerError if it does not start (the message
    quotes its log)."""
    cfg = server.model_copy(update={"url": None, "extra_args": [*server.extra_args, *extra_args]})
    launched = SGLangServer(cfg, model_dir, dump_dir=None, layers=None, log_dir=log_dir, base_env=base_env, port=port)
    t0 = time.monotonic()
    with launched:
        startup = time.monotonic() - t0
        run, out = measure(
            launched.url, prompts, label=label, max_new_tokens=new_tokens(evaluate),
            timeout_s=evaluate.request_timeout_s, counter=counter,
        )  # fmt: skip
        if then is not None:
            then(launched.url, out)
    return run.model_copy(update={"startup_s": startup, "server_args": extra_args}), out


def unsupported_reason(error: ServerError) -> str | None:
    """The log line by which SGLang said it cannot serve EAGLE3 here, when that is why it did not start (the
    quoted log below the message's first line, which may repeat it after our own words)."""
    first, *log = str(error).splitlines()
    for line in [*log, first]:
        if any(sign in line for sign in UNSUPPORTED_SIGNS):
            return line.strip()
    return None


def skip_reason(evaluate: EvaluateConfig, server: ServerConfig, device: str) -> str | None:
    """Why the live evaluation is not run here, or None."""
    if evaluate.live == "off":
        return "evaluate.live is off"
    if evaluate.live == "auto" and not Path(server.python).exists():
        return (
            f"evaluate.live is auto and there is no SGLang environment at server.python={server.python} (build it "
            "with `make sglang-env`, i.e. deploy/sglang_env.sh)"
        )
    if device == "cpu" and evaluate.eagle_topk != 1:
        return (
            f"evaluate.eagle_topk is {evaluate.eagle_topk}: on CPU, SGLang serves EAGLE3 through server_patch/"
            "cpu_spec.py, which drafts chains only (eagle_topk 1)"
        )
    return None


def eagle3_env(device: str) -> dict[str, str]:
    """Environment of the EAGLE3 server: on CPU, the plugin's switch that makes SGLang able to serve it."""
    return {proto.ENV_CPU_SPEC: "1"} if device == "cpu" else {}


def evaluate_live(
    prompts: Sequence[Sequence[int]],
    *,
    draft_dir: Path,
    model_dir: Path,
    run_dir: Path,
    server: ServerConfig,
    evaluate: EvaluateConfig,
    base_env: Mapping[str, str],
    port: int | None = None,
    progress: ProgressFn = no_progress,
    method: str = FIRST_METHOD,
) -> LiveEvalResult:
    """Serve the draft with EAGLE3 and the plain target in turn on the same prompts (token ids, chat template
    applied); write and return the result (the method's eval/live.json: `method` is the draft's train.method).
    Server logs: <run_dir>/eval/server-{eagle3,plain}/sglang.log."""
    if not prompts:
        raise LiveEvalError("no prompts to evaluate on")
    run_dir, draft_dir, model_dir = Path(run_dir), Path(draft_dir), Path(model_dir)
    if not (draft_dir / "config.json").is_file():
        raise LiveEvalError(f"{draft_dir}: no config.json; export the draft first (eagle3.release.export.export_draft)")
    device = server_device(server)
    spec = speculative_args(evaluate)
    base: dict[str, Any] = {
        "device": device,
        "draft_dir": str(draft_dir),
        "model_dir": str(model_dir),
        "num_prompts": len(prompts),
        "max_new_tokens": new_tokens(evaluate),
        "speculative": spec,
    }
    skip = skip_reason(evaluate, server, device)
    algorithm, _ = draft_algorithm(draft_dir)
    if skip is None and device == "cpu" and algorithm not in CPU_ALGORITHMS:
        skip = (f"SGLang 0.5.23 serves --speculative-algorithm {algorithm} on CUDA only (it refuses the CPU platform "
                "before loading); the GPU bench measures it (docs/methods.md)")  # fmt: skip
    if skip is not None:
        return _write(
            run_dir,
            {**base, "status": "skipped", "reason": skip, "summary": f"live evaluation skipped: {skip}"},
            method,
        )

    counter = ProgressCounter("evaluate-live", total=2 * len(prompts), report=progress)

    def serve(
        label: Literal["plain", "eagle3"],
        extra: list[str],
        env: Mapping[str, str] | None = None,
        then: Callable[[str, list[list[int]]], None] | None = None,
    ) -> tuple[ServerRun, list[list[int]]]:
        cfg = server.model_copy(update={"env": {**server.env, **(env or {})}})
        return serve_and_measure(
            cfg, model_dir, extra, prompts, label=label, evaluate=evaluate,
            log_dir=RunPaths(run_dir).eval_server_log_dir(label), base_env=base_env, port=port, counter=counter,
            then=then,
        )  # fmt: skip

    try:
        eagle3, eagle3_out = serve("eagle3", draft_cli_args(draft_dir, spec), eagle3_env(device))
    except ServerError as e:
        reason = unsupported_reason(e)
        if reason is None:
            raise
        return _write(
            run_dir,
            {
                **base,
                "status": "unsupported",
                "reason": reason,
                "summary": f"SGLang cannot serve EAGLE3 here: {reason}",
            },
            method,
        )
    exact = device == "cpu" and server.dtype == "float32"
    differences: list[OutputDifference] = []

    def classify_on(url: str, plain_out: list[list[int]]) -> None:  # the plain server, still up
        with httpx.Client() as client:

            def top2(i: int, d: int) -> list[tuple[int, float]]:
                return top2_at(client, url, [*prompts[i], *plain_out[i][:d]], evaluate.request_timeout_s)

            differences.extend(classify(plain_out, eagle3_out, top2, exact=exact))

    plain, plain_out = serve("plain", [], then=classify_on)
    counter.finish()
    compared = compare(plain, eagle3, plain_out, eagle3_out, differences=differences, exact=exact,
                       judge_speed=device != "cpu")  # fmt: skip
    return _write(run_dir, {**base, "status": "ok", "plain": plain, "eagle3": eagle3, **compared}, method)


def read_live_result(run_dir: Path, method: str = FIRST_METHOD) -> LiveEvalResult | None:
    """The method's eval/live.json, None when there is none."""
    return read_record(RunPaths(run_dir).method(method).live_eval_json, LiveEvalResult)


def _write(run_dir: Path, fields: dict[str, Any], method: str) -> LiveEvalResult:
    result = LiveEvalResult.model_validate(fields)
    path = RunPaths(run_dir).method(method).live_eval_json
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(path, result.model_dump(mode="json"))
    return result
