"""How synthesize and the prompts stage cut their prompts into batches (eagle3.data.generate.generate_batches):
the default batch for where the model lives, and a batch the GPU cannot hold generated again in halves. The
out-of-memory error is raised by a fake generate_batch: this machine has no GPU to run out of."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from eagle3.config import SynthesizeConfig
from eagle3.data import generate
from eagle3.data.generate import CPU_BATCH, Turn, batch_size, generate_batches


def test_the_default_batch_is_the_cpus_for_a_model_on_the_cpu_and_a_set_one_wins() -> None:
    model = torch.nn.Linear(2, 2)
    assert batch_size(model, SynthesizeConfig()) == CPU_BATCH
    assert batch_size(model, SynthesizeConfig(batch_size=5)) == 5


def test_a_batch_the_gpu_cannot_hold_is_generated_again_in_halves_fake_oom(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    calls: list[int] = []

    def fake_generate_batch(model: Any, chat: Any, prompts: list[str], scfg: Any, on_step: Any, sampling: Any) -> Any:
        calls.append(len(prompts))
        if len(prompts) > 3:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (fake)")
        assert [s[1] for s in sampling] == [int(p) for p in prompts]  # each prompt keeps its own seed
        return [Turn(text=f"answer {p}", finish_reason="stop", tokens=1) for p in prompts]

    monkeypatch.setattr(generate, "generate_batch", fake_generate_batch)
    prompts = [str(i) for i in range(11)]
    out = list(generate_batches(torch.nn.Linear(2, 2), None, prompts, SynthesizeConfig(batch_size=8), print,
                                [(0.0, i) for i in range(11)]))  # fmt: skip

    assert calls == [8, 4, 2, 2, 2, 2, 2, 1]  # 8 and 4 did not fit; from then on batches of 2
    assert [first for first, _ in out] == [0, 2, 4, 6, 8, 10]
    assert [t.text for _, turns in out for t in turns] == [f"answer {i}" for i in range(11)]
    assert "batches of 2 from here" in caplog.text


def test_one_prompt_the_gpu_cannot_hold_is_an_error_fake_oom(monkeypatch: pytest.MonkeyPatch) -> None:
    def fake_generate_batch(*args: Any) -> Any:
        raise torch.cuda.OutOfMemoryError("CUDA out of memory (fake)")

    monkeypatch.setattr(generate, "generate_batch", fake_generate_batch)
    with pytest.raises(torch.cuda.OutOfMemoryError):
        list(generate_batches(torch.nn.Linear(2, 2), None, ["0", "1"], SynthesizeConfig(batch_size=2), print,
                              [(0.0, 0), (0.0, 1)]))  # fmt: skip
