"""EAGLE3 served live by real SGLang 0.5.23 on CPU, through the opt-in fallback in server_patch/cpu_spec.py.

SGLang cannot serve EAGLE3 on this CPU by itself (docs/sglang.md); with EAGLE3_CPU_SPEC=1 the installed plugin
supplies the missing sgl_kernel ops and torch_native draft attention backends. One EAGLE3 server and one plain
server, float32 (in bf16 a 4-token verify and a 1-token decode round differently and can flip near-tie argmaxes):

* the target side: draft -> chain verify -> commit must give exactly the plain server's greedy output, and every
  request must report its speculation (meta_info.spec_verify_ct, spec_accept_length);
* the draft side: a random draft is never accepted, so acceptance says nothing about it. Instead every round's
  drafted chain (traced in the server) must equal what our own offline drafter (eagle3/evaluate/speculative.py,
  EagleDrafter, on the exported weights) proposes at the same point: draft extend, each draft decode step's
  attention over the draft KV cache, the hidden-state chaining and the vocab map all have to be right for that.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from eagle3.config import EvaluateConfig
from eagle3.draft.eagle3.drafter import EagleDrafter
from eagle3.draft.eagle3.model import Eagle3Draft
from eagle3.draft.methods import method_named
from eagle3.draft.shape import DraftConfig
from eagle3.evaluate.live import eagle3_cli_args, serve_and_measure, speculative_args
from eagle3.evaluate.offline import load_target
from eagle3.evaluate.speculative import speculative_decode
from tests.integration.sglang_support import AUX, export_random_draft, require_sglang_env, sglang_config
from tests.ports import free_port

pytestmark = [pytest.mark.sglang, pytest.mark.slow]
DRAFT_VOCAB = 4096
QUESTIONS = ("What is the capital of France?", "Name three colours.", "Count from 1 to 10.")
MAX_NEW_TOKENS = 32
SWITCH_LINE = "eagle3 cpu_spec: EAGLE3_CPU_SPEC=1"

# Imported at start-up by the EAGLE3 server's processes (PYTHONPATH): logs each round's drafted chain, keyed by the
# request's prompt and its committed length, through SGLang's plugin HookRegistry (applied by load_plugins()).
TRACE_SITECUSTOMIZE = """
import json, os
if os.environ.get("CPU_SPEC_TEST_TRACE"):
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    def _trace(original, batch, draft_input, parent_list, top_scores_index, draft_tokens, *args, **kwargs):
        with open(os.environ["CPU_SPEC_TEST_TRACE"], "a") as f:
            for req, seq, drafts in zip(batch.reqs, batch.seq_lens.tolist(), draft_tokens.tolist()):
                f.write(json.dumps({"prompt": list(req.origin_input_ids), "seq": seq, "drafts": drafts}) + "\\n")
        return original(batch, draft_input, parent_list, top_scores_index, draft_tokens, *args, **kwargs)

    HookRegistry.register(
        "sglang.srt.speculative.eagle_worker_common.build_eagle_verify_input", _trace, HookType.AROUND
    )
"""


@pytest.fixture(scope="module", params=["eagle3", "eagle3.1"])
def draft_dir(demo_model: Path, tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Path:
    """A random draft for SmolLM2 of each EAGLE-3 method (EAGLE-3.1: its per-aux norms before fc, and the post-norm
    state chained to the next step), exported by our pipeline (export_draft) as SGLang serves it. Its o_proj is
    scaled up so that attention, not the residual stream, decides its proposals: with small random weights a
    draft KV cache read one token short changes almost no proposal (measured: 3 of 383), with this one 40."""
    root = tmp_path_factory.mktemp(f"cpu-spec-{request.param}")
    result, _ = export_random_draft(demo_model, root, DRAFT_VOCAB, o_proj_scale=30.0, method=request.param)
    return Path(result.out_dir)


class RecordingDrafter(EagleDrafter):
    """Our offline drafter, recording each round's proposals under SGLang's key: the committed length then (the
    bonus token excluded), which is the drafter's last step-0 position + 1."""

    def __init__(self, draft: Eagle3Draft):
        super().__init__(draft)
        self.rounds: dict[int, list[int]] = {}

    def propose(self, n: int) -> list[int]:
        proposed = super().propose(n)
        self.rounds[self.pos + 1] = proposed
        return proposed


def reference_rounds(demo_model: Path, draft_dir: Path, prompts: list[list[int]]) -> dict[tuple[Any, ...], list[int]]:
    """(prompt, committed length) -> the chain our drafter proposes there, with the exported (bf16) weights and
    the transformers target in float32, greedy, as the server ran."""
    cfg = DraftConfig.from_target(json.loads((demo_model / "config.json").read_text()), num_aux=3,
                                  draft_vocab_size=DRAFT_VOCAB)  # fmt: skip
    method = method_named(json.loads((draft_dir / "export.json").read_text())["method"])
    embed = load_file(str(demo_model / "model.safetensors"))["model.embed_tokens.weight"].float()
    draft = method.build(cfg, embed)
    assert isinstance(draft, Eagle3Draft)
    weights = load_file(str(draft_dir / "model.safetensors"))
    draft.load_state_dict({k: v.float() if v.is_floating_point() else v for k, v in weights.items()}, strict=False)
    draft.eval()
    target = load_target(demo_model, AUX, device="cpu", dtype="float32")
    out: dict[tuple[Any, ...], list[int]] = {}
    with torch.no_grad():
        for prompt in prompts:
            drafter = RecordingDrafter(draft)
            speculative_decode(target, drafter, prompt, steps=3, max_new_tokens=MAX_NEW_TOKENS)
            out.update({(tuple(prompt), seq): chain for seq, chain in drafter.rounds.items()})
    return out


def chat_prompts(demo_tokenizer: Any) -> list[list[int]]:
    texts = [
        demo_tokenizer.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=False)
        for q in QUESTIONS
    ]
    return [demo_tokenizer(t, add_special_tokens=False).input_ids for t in texts]


EVALUATE = {"draft_steps": 3, "eagle_topk": 1, "num_draft_tokens": 4, "max_new_tokens": MAX_NEW_TOKENS}


def serve(
    root: Path, demo_model: Path, prompts: list[list[int]], label: Any, env: dict[str, str], args: list[str]
) -> tuple[Any, list[list[int]], str]:
    server = sglang_config(root, demo_model, dtype="float32").server
    run, out = serve_and_measure(
        server.model_copy(update={"env": env}), demo_model, args, prompts, label=label,
        evaluate=EvaluateConfig.model_validate(EVALUATE), log_dir=root / label, base_env=dict(os.environ),
        port=free_port(),
    )  # fmt: skip
    return run, out, (root / label / "sglang.log").read_text(errors="replace")


@pytest.fixture(scope="module")
def plain(demo_model: Path, demo_tokenizer: Any, tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Any, str]:
    """The plain server's greedy run of the prompts, once for every method's draft."""
    require_sglang_env()
    return serve(tmp_path_factory.mktemp("plain"), demo_model, chat_prompts(demo_tokenizer), "plain", {}, [])


def test_eagle3_on_cpu_gives_the_plain_servers_greedy_output_and_our_drafters_proposals(
    demo_model: Path,
    demo_tokenizer: Any,
    draft_dir: Path,
    plain: tuple[Any, Any, str],
    tmp_path: Path,
    one_torch_thread: None,
) -> None:
    require_sglang_env()
    prompts = chat_prompts(demo_tokenizer)
    spec = speculative_args(EvaluateConfig.model_validate(EVALUATE))
    assert spec == {"num_steps": 3, "eagle_topk": 1, "num_draft_tokens": 4}
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(TRACE_SITECUSTOMIZE)
    trace = tmp_path / "draft-trace.jsonl"

    eagle3_env = {"EAGLE3_CPU_SPEC": "1", "PYTHONPATH": str(site), "CPU_SPEC_TEST_TRACE": str(trace)}
    eagle3, eagle3_out, eagle3_log = serve(tmp_path, demo_model, prompts, "eagle3", eagle3_env,
                                           eagle3_cli_args(draft_dir, spec))  # fmt: skip
    plain_run, plain_out, plain_log = plain

    # the target side
    assert SWITCH_LINE in eagle3_log  # the installed plugin did it, not a source folder
    assert "cpu_spec" not in plain_log  # inert without the switch
    assert eagle3_out == plain_out, [
        (demo_tokenizer.decode(a), demo_tokenizer.decode(b)) for a, b in zip(eagle3_out, plain_out, strict=True)
    ]
    assert "Paris" in demo_tokenizer.decode(eagle3_out[0])
    assert all(p.verify_passes and p.verify_passes > 0 for p in eagle3.prompts)  # meta_info.spec_verify_ct
    assert eagle3.accept_length is not None and 1.0 <= eagle3.accept_length <= 4.0  # ~1: a random draft
    assert eagle3.completion_tokens == plain_run.completion_tokens > 0

    # the draft side: SGLang's drafted chains vs our drafter's at the same (prompt, committed length)
    reference = reference_rounds(demo_model, draft_dir, prompts)
    served = [json.loads(line) for line in trace.read_text().splitlines()]
    compared = differing = 0
    for r in served:
        want = reference.get((tuple(r["prompt"]), r["seq"]))
        if want is None:  # SGLang's own warm-up request, or a round past our token budget
            continue
        compared += len(want)
        differing += sum(a != b for a, b in zip(r["drafts"][: len(want)], want, strict=True))
    assert compared >= 150, (compared, len(served), len(reference))
    assert differing == 0, f"{differing} of {compared} drafted tokens differ from our drafter's"
