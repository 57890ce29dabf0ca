"""eagle3.evaluate.speculative on a target with recurrent layers (gated DeltaNet, short convolutions, Mamba-2): a
round with rejected drafts cannot crop them out of a recurrent state, so the evaluator goes back to the state before
the round and replays the accepted prefix. Checked on tiny random targets built from their configs (nothing read
from disk), with an oracle drafter (a test instrument: it knows greedy's tokens and drafts a wrong one at chosen
places, so rounds accept all, some and none of their drafts)."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

from eagle3.evaluate.speculative import Target, greedy_decode, is_recurrent, speculative_decode
from eagle3.target.tiny import tiny_config

pytestmark = pytest.mark.usefixtures("one_torch_thread")


class OracleDrafter:
    """Drafts greedy's next tokens, except every `wrong_every`-th drafted position, which is off by one."""

    def __init__(self, greedy: list[int], prompt_len: int, wrong_every: int):
        self.greedy, self.prompt_len, self.wrong_every = greedy, prompt_len, wrong_every
        self.emitted = 0
        self.drafted = 0

    def start(self, tokens: list[int], aux: Tensor) -> None:
        self.emitted = len(tokens) - self.prompt_len

    def propose(self, n: int) -> list[int]:
        out = []
        for i in range(n):
            self.drafted += 1
            t = self.greedy[self.emitted + i]
            out.append(t + 1 if self.drafted % self.wrong_every == 0 else t)
        return out

    def commit(self, tokens: list[int], aux: Tensor) -> None:
        self.emitted += len(tokens)


@pytest.mark.parametrize("arch", ["Lfm2ForCausalLM", "NemotronHForCausalLM"])  # short convolutions; Mamba-2
def test_speculative_decoding_of_a_recurrent_target_is_greedy_whatever_the_drafts_accepted(arch: str) -> None:
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(tiny_config(arch), dtype=torch.float32).eval()
    target = Target(model, aux_layers=[2, 4, 5], stop_ids=frozenset())
    assert is_recurrent(target.new_cache())
    prompt = [int(t) for t in torch.randint(0, 49152, (12,))]
    with torch.inference_mode():  # as the offline evaluator decodes
        greedy = greedy_decode(target, prompt, max_new_tokens=24)
        assert len(set(greedy)) > 3  # a sequence to get wrong, not one token repeated
        for wrong_every in (3, 1):  # some drafts rejected each round; every draft rejected
            drafter = OracleDrafter(greedy, len(prompt), wrong_every)
            out = speculative_decode(target, drafter, prompt, steps=3, max_new_tokens=24)
            assert out.tokens == greedy, (arch, wrong_every)
            rounds = [r for r in out.rounds if r.drafted]
            if wrong_every == 3:  # rolled back past accepted drafts: the replay ran
                assert any(0 < r.accepted < r.drafted for r in rounds), rounds
            else:
                assert all(r.accepted == 0 for r in rounds), rounds


def test_an_attention_only_target_keeps_the_cache_that_crops() -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_config(tiny_config("LlamaForCausalLM"), dtype=torch.float32).eval()
    assert not is_recurrent(Target(model, aux_layers=[2, 4, 5], stop_ids=frozenset()).new_cache())
