"""Where a draft's decoding acceptance parts from its training-time measure, set by set (issue #18).

    .venv/bin/python bench/acceptance_gap.py --config C --run-dir R --checkpoint CKPT [--steps 3] [--max-new-tokens 64]
    (quality.sh runs it on its bf16 draft, one process per set: logs/bf16-gap-SET.log; --extra-set NAME=PATH adds
    a set of chat rows, e.g. new requests from the prompts stage: docs/performance.md "Quality run 7")

The trainer reports a teacher-forced acceptance on its held-out slice (eagle3/draft/distill.py `chain_acceptance`): a
k-step chain started at *every* answer position, fed the true tokens. Decoding starts a chain only where the
previous round ended, which is right after the target's bonus token, often where the draft had just been wrong.
Per evaluation set of the config, this prints:

    decode        acceptance length of speculative greedy decoding (what `evaluate` reports)
    replayed      the same rounds recomputed from one training-style (TTT) forward of the draft over the greedy
                  output, chains started where decoding started them: equal to `decode` unless decoding and
                  training disagree (a bug); rounds that differ are counted
    every pos.    chains from every position of the greedy output, as `chain_acceptance` counts them on the
                  held-out slice: `every pos.` - `decode` is what the choice of round starts costs, and the
                  held-out slice's figure - `every pos.` what the prompts being unlike the training data cost

The rates are the first drafted position's: at round starts and at every position. Float32 target, greedy.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from eagle3.config import EvalSetConfig, load_config
from eagle3.data.chat import ChatTokenizer
from eagle3.draft.distill import draft_to_target_ids
from eagle3.draft.eagle3.drafter import EagleDrafter
from eagle3.draft.eagle3.model import Eagle3Draft
from eagle3.draft.layers import dense_attend
from eagle3.draft.load import load_draft
from eagle3.evaluate.offline import aux_layers_of, load_eval_sets, load_target
from eagle3.evaluate.speculative import Target, speculative_decode
from eagle3.target.demo import resolve_model


def chain_runs(target: Target, draft: Eagle3Draft, seq: list[int], steps: int) -> list[int]:
    """runs[t]: how many of the k = `steps` drafts a chain after x[..t+1] gets right in a row (step i at t
    predicts x[t+2+i]), from one target forward and one TTT forward of the draft over `seq`."""
    from transformers import DynamicCache

    n = len(seq)
    _, aux = target.forward(seq, DynamicCache(), aux=True, last_only=False)  # aux [n, K, H], as decoding reads it
    assert aux is not None
    ids = torch.tensor(seq, device=target.device)
    positions = torch.arange(n, device=target.device)
    logits = draft(ids, aux, positions, n - 1 - positions, dense_attend(torch.zeros_like(ids)), steps)
    to_target = draft_to_target_ids(draft.d2t)
    preds = [to_target[x.argmax(-1)].tolist() for x in logits]  # target ids, steps x [n]
    runs = []
    for t in range(n):
        run = 0
        while run < steps and t + 2 + run < n and preds[run][t] == seq[t + 2 + run]:
            run += 1
        runs.append(run)
    return runs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", type=Path, required=True, help="the run's config: its evaluate.sets")
    ap.add_argument("--run-dir", type=Path, required=True, help="the store the draft trained on (its aux layers)")
    ap.add_argument("--checkpoint", type=Path, required=True)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--prompts", type=int, default=0, help="per set (0: the set's num_prompts)")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--data-dir", type=Path, default=None, help="where the model is installed (default: the config's)")
    ap.add_argument("--sets", default="", help="comma-separated set names (default: all of the config's)")
    ap.add_argument("--extra-set", action="append", default=[], metavar="NAME=PATH",
                    help="another set: every row of a chat-rows JSONL file (a prompts.jsonl)")  # fmt: skip
    args = ap.parse_args()
    cfg = load_config(args.config)
    extra = [EvalSetConfig(name=n, dataset=p, format="chat", kind="extra", num_prompts=10**9)
             for n, p in (e.split("=", 1) for e in args.extra_set)]  # fmt: skip
    cfg = cfg.model_copy(update={"evaluate": cfg.evaluate.model_copy(update={"sets": [*cfg.evaluate.sets, *extra]})})
    model_dir = resolve_model(cfg.model, args.data_dir or Path(cfg.data_dir))
    target = load_target(model_dir, aux_layers_of(args.run_dir), device=args.device, dtype="float32")
    draft = load_draft(model_dir, args.checkpoint, device=target.device).model
    k = args.steps
    print("| set | prompts | rounds | decode | replayed (rounds differing) | every pos. | first-position rate: "
          "round starts / every pos. |\n|---|---:|---:|---:|---:|---:|---|")  # fmt: skip
    for s in load_eval_sets(cfg.evaluate, ChatTokenizer.from_model_dir(model_dir)):
        if args.sets and s.name not in args.sets.split(","):
            continue
        prompts = s.ids[: args.prompts or None]
        rounds = accepted = replayed = differ = first = 0
        every = every_first = positions = 0
        with torch.inference_mode():
            for p in prompts:
                d = speculative_decode(target, EagleDrafter(draft), p, steps=k, max_new_tokens=args.max_new_tokens)
                seq = [*p, *d.tokens]
                runs = chain_runs(target, draft, seq, k)
                start = len(p) + 1  # tokens committed before the first round: the prompt and the prefill's token
                for r in d.rounds:
                    again = min(runs[start - 2], r.drafted)
                    rounds, accepted, replayed = rounds + 1, accepted + r.accepted, replayed + again
                    differ += again != r.accepted
                    first += r.accepted > 0
                    start += r.accepted + 1
                drafted_from = range(len(p) - 1, len(seq) - 2)  # chains whose first draft is an output token
                every += sum(runs[t] for t in drafted_from)
                every_first += sum(runs[t] > 0 for t in drafted_from)
                positions += len(drafted_from)
        print(f"| {s.name} | {len(prompts)} | {rounds} | {1 + accepted / rounds:.3f} | {1 + replayed / rounds:.3f} "
              f"({differ}) | {1 + every / positions:.3f} | {first / rounds:.3f} / {every_first / positions:.3f} |",
              flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
