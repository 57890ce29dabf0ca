"""export_draft on a tiny synthetic target: SGLang's config fields and key names, dtypes, the speculators copy,
skip by key, atomic replacement, and refusals that name what is wrong."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import eagle3.release.export as export_mod
from eagle3.draft.checkpoint import save_checkpoint
from eagle3.draft.eagle3.model import Eagle3Draft
from eagle3.draft.shape import DraftConfig
from eagle3.draft.synthetic import SyntheticSpec, write_target_model
from eagle3.release.export import ExportError, export_draft
from eagle3.serving.layers import sglang_layer_ids
from eagle3.store.run_store import RunInfo, RunStore
from eagle3.target.files import model_fingerprint

SPEC = SyntheticSpec(hidden_size=32, intermediate_size=64, num_heads=4, num_kv_heads=2, vocab_size=128,
                     draft_vocab_size=96, num_layers=8, aux_layers=(2, 4, 5))  # fmt: skip
SGLANG_KEYS = {
    "fc.weight", "norm.weight", "lm_head.weight", "d2t", "t2d",
    "midlayer.hidden_norm.weight", "midlayer.input_layernorm.weight", "midlayer.post_attention_layernorm.weight",
    "midlayer.self_attn.q_proj.weight", "midlayer.self_attn.k_proj.weight", "midlayer.self_attn.v_proj.weight",
    "midlayer.self_attn.o_proj.weight", "midlayer.mlp.gate_proj.weight", "midlayer.mlp.up_proj.weight",
    "midlayer.mlp.down_proj.weight",
}  # fmt: skip


def write_checkpoint(root: Path, cfg: DraftConfig, step: int, seed: int) -> Path:
    """A trainer checkpoint of a draft with random weights (norms too, so a swapped key shows)."""
    torch.manual_seed(seed)
    draft = Eagle3Draft(cfg)
    with torch.no_grad():
        for p in draft.parameters():
            if p.requires_grad:
                p.copy_(torch.randn_like(p))
    used = torch.randperm(cfg.vocab_size)[: cfg.draft_vocab_size]
    t2d = torch.zeros(cfg.vocab_size, dtype=torch.bool)
    t2d[used] = True
    draft.set_vocab_map(used - torch.arange(cfg.draft_vocab_size), t2d)
    opt = torch.optim.AdamW([p for p in draft.parameters() if p.requires_grad])
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    return save_checkpoint(root, step, draft, opt, sched, {"data_position": {}}, keep=5)


@pytest.fixture
def run(tmp_path: Path) -> dict[str, Path]:
    model, run_dir = tmp_path / "target", tmp_path / "run"
    write_target_model(model, SPEC)
    RunStore(run_dir).write_run_info(
        RunInfo(
            model_path=str(model),
            model_sha256=model_fingerprint(model),
            tokenizer_sha256="t",
            engine="transformers",
            engine_version="0",
            dtype="bfloat16",
            hidden_size=32,
            num_layers=8,
            vocab_size=128,
            aux_layers=[2, 4, 5],
            engine_layer_ids=[2, 4, 5],
            engine_layer_convention="hf_hidden_states",
            dataset_fingerprint="d",
            versions={},
            config={},
        )
    )
    cfg = DraftConfig.from_target(json.loads((model / "config.json").read_text()), num_aux=3, draft_vocab_size=96)
    ckpt = write_checkpoint(tmp_path / "train" / "checkpoints", cfg, step=7, seed=0)
    return {"model": model, "run": run_dir, "ckpt": ckpt, "train": tmp_path / "train", "out": run_dir / "draft"}


def do_export(run: dict[str, Path], ckpt: Path | None = None) -> export_mod.ExportResult:
    return export_draft(ckpt or run["ckpt"], run["run"], run["model"], run["out"])


def test_config_json_is_sglangs_eagle3_llama_with_the_extraction_layer_ids(run: dict[str, Path]) -> None:
    result = do_export(run)
    cfg = json.loads((run["out"] / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"]
    assert cfg["draft_vocab_size"] == 96 and cfg["vocab_size"] == 128
    assert cfg["target_hidden_size"] == 32 and cfg["hidden_size"] == 32 and cfg["num_hidden_layers"] == 1
    assert cfg["tie_word_embeddings"] is False  # True would make SGLang use the embedding as lm_head
    # llama: SGLang adds 1 to each id, so HF indices 2, 4, 5 are ids 1, 3, 4 (as capture-only extraction uses)
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 3, 4]
    assert result.sglang_layer_ids == sglang_layer_ids("llama", [2, 4, 5], 8).layer_ids == [1, 3, 4]
    assert result.aux_layers == [2, 4, 5] and result.checkpoint_step == 7
    args = result.sglang_args
    assert args[args.index("--speculative-draft-model-path") + 1] == str(run["out"].resolve())


def test_weights_are_bf16_in_sglang_key_names_with_the_vocab_map_and_no_embedding(run: dict[str, Path]) -> None:
    do_export(run)
    ours = load_file(str(run["ckpt"] / "model.safetensors"))
    out = load_file(str(run["out"] / "model.safetensors"))
    assert set(out) == SGLANG_KEYS  # no embed_tokens: SGLang shares the target's
    for k, v in out.items():
        if k in ("d2t", "t2d"):
            assert v.dtype == (torch.int64 if k == "d2t" else torch.bool) and torch.equal(v, ours[k])
        else:
            assert v.dtype == torch.bfloat16 and torch.equal(v, ours[k].to(torch.bfloat16)), k
    target_ids = torch.arange(96) + out["d2t"]  # SGLang's hot_token_id
    assert bool(out["t2d"][target_ids].all()) and int(out["t2d"].sum()) == 96


def test_speculators_copy_renames_midlayer_and_names_hf_indices(run: dict[str, Path]) -> None:
    do_export(run)
    sglang = load_file(str(run["out"] / "model.safetensors"))
    spec = load_file(str(run["out"] / "speculators" / "model.safetensors"))
    assert set(spec) == {k.replace("midlayer.", "layers.0.") for k in sglang}
    assert torch.equal(spec["layers.0.self_attn.q_proj.weight"], sglang["midlayer.self_attn.q_proj.weight"])
    cfg = json.loads((run["out"] / "speculators" / "config.json").read_text())
    assert cfg["speculators_model_type"] == "eagle3" and cfg["draft_vocab_size"] == 96
    assert cfg["eagle_aux_hidden_state_layer_ids"] == [2, 4, 5]  # vLLM: input of layer k = HF index k
    assert cfg["norm_before_residual"] is False and cfg["target_hidden_size"] == 32
    assert cfg["transformer_layer_config"]["hidden_size"] == 32
    assert cfg["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 3


def test_reexport_of_the_same_checkpoint_does_no_work_and_a_new_one_replaces_it(run: dict[str, Path]) -> None:
    first = do_export(run)
    weights = run["out"] / "model.safetensors"
    stamp = weights.stat().st_mtime_ns
    again = export_draft(run["train"], run["run"], run["model"], run["out"])  # the training dir: its latest checkpoint
    assert again.skipped and again.key == first.key and weights.stat().st_mtime_ns == stamp

    cfg = DraftConfig.from_target(
        json.loads((run["model"] / "config.json").read_text()), num_aux=3, draft_vocab_size=96
    )
    newer = write_checkpoint(run["train"] / "checkpoints", cfg, step=9, seed=1)
    third = export_draft(run["train"], run["run"], run["model"], run["out"])
    assert not third.skipped and third.checkpoint_step == 9 and third.key != first.key
    assert torch.equal(
        load_file(str(weights))["fc.weight"], load_file(str(newer / "model.safetensors"))["fc.weight"].bfloat16()
    )
    assert [p.name for p in run["out"].parent.iterdir() if p.name.startswith(".")] == []  # no temp or old dirs left

    weights.unlink()  # a damaged export is rebuilt, not trusted
    assert not export_draft(newer, run["run"], run["model"], run["out"]).skipped and weights.is_file()


def test_a_failing_export_leaves_the_previous_one_whole(run: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    first = do_export(run)
    cfg = DraftConfig.from_target(
        json.loads((run["model"] / "config.json").read_text()), num_aux=3, draft_vocab_size=96
    )
    newer = write_checkpoint(run["train"] / "checkpoints", cfg, step=9, seed=1)
    real = export_mod.atomic_write_bytes

    def disk_full_on_speculators(path: Path, data: bytes | memoryview) -> None:
        if "speculators" in str(path):
            raise OSError(28, "No space left on device")
        real(path, data)

    monkeypatch.setattr(export_mod, "atomic_write_bytes", disk_full_on_speculators)
    with pytest.raises(OSError, match="No space"):
        export_draft(newer, run["run"], run["model"], run["out"])
    assert json.loads((run["out"] / "export.json").read_text())["key"] == first.key
    assert [p.name for p in run["out"].parent.iterdir() if p.name.startswith(".")] == []


def test_a_checkpoint_with_missing_or_unknown_keys_is_refused_by_name(run: dict[str, Path]) -> None:
    path = run["ckpt"] / "model.safetensors"
    weights = load_file(str(path))
    del weights["lm_head.weight"]
    weights["midlayer.extra.weight"] = torch.zeros(2)
    save_file(weights, str(path))
    with pytest.raises(ExportError, match=r"missing \['lm_head.weight'\], unexpected \['midlayer.extra.weight'\]"):
        do_export(run)
    assert not run["out"].exists()


def test_a_vocab_map_outside_the_target_vocabulary_is_refused(run: dict[str, Path]) -> None:
    path = run["ckpt"] / "model.safetensors"
    weights = load_file(str(path))
    weights["d2t"][0] = 10_000
    save_file(weights, str(path))
    with pytest.raises(ExportError, match="outside the target vocabulary"):
        do_export(run)


def test_a_run_extracted_from_another_model_is_refused(run: dict[str, Path]) -> None:
    store = RunStore(run["run"])
    info = RunInfo.model_validate(json.loads((run["run"] / "run.json").read_text()))
    store.write_run_info(info.model_copy(update={"hidden_size": 64}))
    with pytest.raises(ExportError, match="extracted from another model"):
        do_export(run)


def test_no_checkpoint_is_an_error_that_says_where_it_looked(tmp_path: Path, run: dict[str, Path]) -> None:
    with pytest.raises(ExportError, match="no checkpoint here"):
        export_draft(tmp_path / "nothing", run["run"], run["model"], run["out"])


def _rewrite_target(run: dict[str, Path], **fields: object) -> None:
    cfg_path = run["model"] / "config.json"
    cfg_path.write_text(json.dumps({**json.loads(cfg_path.read_text()), **fields}))


def _rewrite_run_info(run: dict[str, Path], **fields: object) -> None:
    store = RunStore(run["run"])
    info = RunInfo.model_validate(json.loads((run["run"] / "run.json").read_text()))
    (run["run"] / "run.json").unlink()
    store.write_run_info(info.model_copy(update=fields))


def test_a_store_extracted_through_sglang_exports_the_layer_ids_run_json_recorded(run: dict[str, Path]) -> None:
    # A family without a rule extracts with extract.sglang_layer_ids; export must name those ids, not re-derive.
    _rewrite_target(run, model_type="mystery_moe")
    _rewrite_run_info(
        run,
        engine="sglang",
        engine_layer_ids=[2, 4, 5],
        engine_layer_convention="sglang mystery_moe: ids set by extract.sglang_layer_ids",
        config={"extract": {"sglang_layer_ids": [2, 4, 5]}},
    )
    result = do_export(run)
    cfg = json.loads((run["out"] / "config.json").read_text())
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [2, 4, 5] == result.sglang_layer_ids


def test_a_transformers_store_exports_with_the_recorded_sglang_override(run: dict[str, Path]) -> None:
    _rewrite_target(run, model_type="mystery_moe")
    _rewrite_run_info(run, config={"extract": {"sglang_layer_ids": [3, 5, 6]}})
    assert do_export(run).sglang_layer_ids == [3, 5, 6]


def test_a_target_sglang_feeds_another_tap_than_the_stores_is_refused_and_nothing_is_written(
    run: dict[str, Path],
) -> None:
    _rewrite_target(run, model_type="gemma3_text", architectures=["Gemma3ForCausalLM"])
    with pytest.raises(ExportError, match=r"Gemma3ForCausalLM.*not the residual stream.*cannot give SGLang a draft"):
        do_export(run)
    assert not run["out"].exists()


def test_a_store_that_recorded_another_tap_is_refused(run: dict[str, Path]) -> None:
    _rewrite_run_info(run, tap="gemma3")
    with pytest.raises(ExportError, match=r"run.json: the store holds the 'gemma3' tap"):
        do_export(run)
    assert not run["out"].exists()
