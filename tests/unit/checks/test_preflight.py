"""Pre-flight (eagle3/checks/preflight.py): each setting combination a later stage refuses is refused before the first
stage, naming the keys and the fix. The store's records are written directly (run.json, prepared/ and
synthesized/ manifests) for a small model directory (config.json and a tokenizer config, no weights)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from eagle3.checks.preflight import PreflightError, check_run, check_stages
from eagle3.config import PipelineConfig
from eagle3.convert.vocab import select_vocab, write_vocab_map
from eagle3.data.synthesis_key import SynthesisMixError, settings_fingerprint, synthesized_key
from eagle3.extract.shard import store_dtype_of
from eagle3.serving.aux_layers import resolve_aux_layers
from eagle3.store.fsio import atomic_write_json
from eagle3.store.run_store import PreparedManifest, RunInfo, RunStore, SynthesisOf
from eagle3.target.files import model_fingerprint, tokenizer_fingerprint

GROW = ["prepare", "synthesize", "extract"]


@pytest.fixture
def model(tmp_path: Path) -> Path:
    d = tmp_path / "model"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"model_type": "llama", "num_hidden_layers": 12, "hidden_size": 64,
                                               "vocab_size": 100, "architectures": ["LlamaForCausalLM"]}))  # fmt: skip
    (d / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{{ messages }}"}))
    return d


def config(tmp_path: Path, stages: list[str] = GROW, **sections: Any) -> PipelineConfig:
    return PipelineConfig.model_validate(
        {"run_dir": str(tmp_path / "run"), "stages": stages, "data": {"dataset": str(tmp_path / "grow")}, **sections}
    )


def made_by(cfg: PipelineConfig, model: Path, *, synthesized: bool = True) -> RunStore:
    """A store whose samples were extracted under `cfg` (records only)."""
    store = RunStore(cfg.run_dir)
    key = synthesized_key(cfg, model)
    synthesis = SynthesisOf(settings_fingerprint=settings_fingerprint(key, cfg.synthesize.on_truncated),
                            source_fingerprint="src") if synthesized else None  # fmt: skip
    store.write_prepared_manifest(
        PreparedManifest(
            dataset=f"synthesized:{cfg.data.dataset}" if synthesized else cfg.data.dataset,
            dataset_fingerprint="fp",
            tokenizer_sha256=tokenizer_fingerprint(model),
            num_samples=0,
            num_tokens=0,
            num_loss_tokens=0,
            shards=[],
            shard_tokens=[],
            config=cfg.data.model_dump(mode="json"),
            synthesis=synthesis,
        )
    )
    if synthesized:
        atomic_write_json(store.synthesized_manifest_path, key.model_dump(mode="json"))
    layers = resolve_aux_layers(cfg.extract.aux_layers, 12)
    store.write_run_info(
        RunInfo(
            model_path=str(model),
            model_sha256=model_fingerprint(model),
            tokenizer_sha256=tokenizer_fingerprint(model),
            engine="transformers",
            engine_version="x",
            dtype=cfg.server.dtype,
            store_dtype=store_dtype_of(cfg),
            hidden_size=64,
            num_layers=12,
            vocab_size=100,
            aux_layers=layers,
            engine_layer_ids=layers,
            engine_layer_convention="hf",
            dataset_fingerprint="fp",
            versions={},
            config=cfg.model_dump(mode="json"),
        )
    )
    return store


def test_the_same_settings_on_a_grown_store_and_a_new_store_pass(tmp_path: Path, model: Path) -> None:
    cfg = config(tmp_path)
    check_run(cfg, model)  # no run.json: anything goes
    made_by(cfg, model)
    check_run(cfg, model)
    check_run(config(tmp_path, data={"dataset": str(tmp_path / "grow"), "shard_size": 7}), model)  # not a mix key


def test_aux_layers_beyond_the_model_are_refused_before_any_stage(tmp_path: Path, model: Path) -> None:
    with pytest.raises(
        PreflightError, match=r"extract.aux_layers \[2, 6, 13\].*12-layer model.*Fix extract.aux_layers"
    ):
        check_run(config(tmp_path, extract={"aux_layers": [2, 6, 13]}), model)


@pytest.mark.parametrize(
    ("sections", "named"),
    [
        ({"extract": {"store_dtype": "float8_e4m3"}}, r"extract.store_dtype: store has 'bfloat16', now 'float8_e4m3'"),
        ({"server": {"dtype": "float16"}}, r"server.dtype: store has 'bfloat16', now 'float16'"),
        (
            {"extract": {"aux_layers": [1, 5, 9]}},
            r"extract.aux_layers \(HF hidden_states indices\): store has \[2, 6, 9\]",
        ),
    ],
)
def test_an_extraction_setting_other_than_the_stores_is_refused_naming_it(
    tmp_path: Path, model: Path, sections: dict, named: str
) -> None:
    made_by(config(tmp_path), model)
    with pytest.raises(PreflightError, match=named + r"(.|\n)*new run_dir"):
        check_run(config(tmp_path, ["extract"], **sections), model)


def test_another_model_or_max_length_is_refused_naming_it(tmp_path: Path, model: Path) -> None:
    made_by(config(tmp_path, ["prepare", "extract"]), model, synthesized=False)
    longer = config(tmp_path, ["prepare", "extract"], data={"dataset": str(tmp_path / "grow"), "max_length": 4096})
    with pytest.raises(PreflightError, match=r"data.max_length: store has 2048, now 4096"):
        check_run(longer, model)
    (model / "config.json").write_text((model / "config.json").read_text().replace("100", "101"))
    with pytest.raises(PreflightError, match=r"model \(model_sha256\): store has"):
        check_run(config(tmp_path, ["prepare", "extract"]), model)


def test_a_changed_synthesize_setting_on_a_grown_store_is_refused_naming_it(tmp_path: Path, model: Path) -> None:
    made_by(config(tmp_path), model)
    with pytest.raises(SynthesisMixError, match=r"synthesize.temperature: store has 0.0, now 0.7(.|\n)*new run_dir"):
        check_run(config(tmp_path, synthesize={"temperature": 0.7}), model)
    with pytest.raises(SynthesisMixError, match=r"synthesize.on_truncated"):
        check_run(config(tmp_path, synthesize={"on_truncated": "drop"}), model)
    kwargs = {"dataset": str(tmp_path / "grow"), "chat_template_kwargs": {"enable_thinking": False}}
    with pytest.raises(SynthesisMixError, match=r"data.chat_template_kwargs: store has \{\}"):
        check_run(config(tmp_path, data=kwargs), model)


def test_synthesize_added_to_a_store_of_the_datasets_own_answers_is_refused(tmp_path: Path, model: Path) -> None:
    made_by(config(tmp_path, ["prepare", "extract"]), model, synthesized=False)
    check_run(config(tmp_path, ["prepare", "extract"]), model)
    with pytest.raises(
        SynthesisMixError, match=r"synthesize: the store's samples were extracted from the dataset's own"
    ):
        check_run(config(tmp_path), model)


def test_a_synthesized_store_prepared_without_synthesize_is_refused(tmp_path: Path, model: Path) -> None:
    made_by(config(tmp_path), model)
    with pytest.raises(PreflightError, match=r"prepare without synthesize(.|\n)*Add synthesize to stages"):
        check_run(config(tmp_path, ["prepare", "extract"]), model)
    check_run(config(tmp_path, ["extract"]), model)  # extracting what is prepared mixes nothing


def test_a_synthesis_from_before_growing_is_used_with_its_own_inputs_and_refused_once_they_grew(
    tmp_path: Path, model: Path
) -> None:
    """A store synthesized and extracted by the version before synthesis could grow (eagle3-synthesized/2): an
    unchanged re-run passes (make demo twice), a grown dataset is refused naming the format, before any stage."""
    import hashlib

    from eagle3.data.prepare import dataset_fingerprint
    from eagle3.target.files import model_fingerprint

    (tmp_path / "grow").mkdir()
    (tmp_path / "grow" / "day1.jsonl").write_text('{"messages": []}\n')
    cfg = config(tmp_path)
    store = made_by(cfg, model, synthesized=False)
    old = {"format": "eagle3-synthesized/2", "source_fingerprint": dataset_fingerprint(cfg.data),
           "model_sha256": model_fingerprint(model), "dtype": "bfloat16", "engine": "transformers",
           "synthesize": cfg.synthesize.generation_key()}  # fmt: skip
    atomic_write_json(store.synthesized_manifest_path, old)
    key_fp = hashlib.sha256(json.dumps(old, sort_keys=True).encode()).hexdigest()
    prepared = store.read_prepared_manifest()
    assert prepared is not None
    store.write_prepared_manifest(prepared.model_copy(update={
        "dataset": f"synthesized:{cfg.data.dataset}",
        "dataset_fingerprint": hashlib.sha256(f"{key_fp}:on_truncated=keep".encode()).hexdigest(),
    }))  # fmt: skip
    check_run(cfg, model)
    (tmp_path / "grow" / "day2.jsonl").write_text('{"messages": []}\n')
    with pytest.raises(SynthesisMixError, match=r"synthesized/manifest.json format: .*could not grow"):
        check_run(cfg, model)


def target(tmp_path: Path, model_type: str, architecture: str, **text: Any) -> Path:
    """A target directory (config.json only) of a family, its language model's config under text_config."""
    d = tmp_path / model_type
    d.mkdir(parents=True)
    lm = {"num_hidden_layers": 12, "hidden_size": 64, "vocab_size": 100, **text}
    (d / "config.json").write_text(json.dumps({"model_type": model_type, "architectures": [architecture], **lm,
                                               "text_config": lm}))  # fmt: skip
    return d


def test_a_target_sglang_feeds_another_tap_is_refused_before_the_first_stage_naming_the_stages(tmp_path: Path) -> None:
    gemma = target(tmp_path, "gemma3_text", "Gemma3ForCausalLM")
    cfg = config(tmp_path, ["prepare", "extract", "convert", "train", "export"], evaluate={"live": "off"})
    with pytest.raises(PreflightError) as e:
        check_run(cfg, gemma)
    msg = str(e.value)
    assert "Gemma3ForCausalLM" in msg and "not the residual stream" in msg and "gemma3_causal.py" in msg, msg
    assert "export (" in msg and "extract (" not in msg, msg  # the transformers engine stores; export would serve
    sglang = config(tmp_path, ["prepare", "extract"], server={"engine": "sglang"})
    with pytest.raises(PreflightError, match=r"not the residual stream.*extract \(server.engine sglang"):
        check_run(sglang, gemma)
    check_run(config(tmp_path, ["prepare", "extract", "convert", "train"]), gemma)  # nothing served: allowed


def test_a_family_without_a_rule_is_refused_when_a_stage_needs_sglangs_ids_and_allowed_with_the_users_ids(
    tmp_path: Path,
) -> None:
    smollm3 = target(tmp_path, "smollm3", "SmolLM3ForCausalLM")
    with pytest.raises(PreflightError, match=r"'smollm3': no SGLang layer-id rule.*export \(") as e:
        check_run(config(tmp_path, ["prepare", "extract", "export"], evaluate={"live": "off"}), smollm3)
    assert "extract.sglang_layer_ids" in str(e.value)  # the advice: the user's ids, or a row
    check_run(config(tmp_path, ["prepare", "extract"]), smollm3)  # the transformers engine needs no SGLang ids
    with_ids = config(tmp_path, ["prepare", "extract"], server={"engine": "sglang"},
                      extract={"aux_layers": [2, 6, 9], "sglang_layer_ids": [1, 5, 8]})  # fmt: skip
    check_run(with_ids, smollm3)


def test_a_block_drafter_only_family_and_a_config_that_changes_the_tap_are_refused_for_eagle3(tmp_path: Path) -> None:
    laguna = target(tmp_path, "laguna", "LagunaForCausalLM")
    with pytest.raises(PreflightError, match=r"block drafters only.*laguna.py.*evaluate \(evaluate.live"):
        check_run(config(tmp_path, ["prepare", "extract", "evaluate"], evaluate={"live": "on"}), laguna)
    plain = target(tmp_path / "a", "glm5_next", "Glm5NextForConditionalGeneration", mhc=False)
    mhc = target(tmp_path / "b", "glm5_next", "Glm5NextForConditionalGeneration", mhc=True, hc_mult=4)
    export = config(tmp_path, ["prepare", "extract", "export"], evaluate={"live": "off"})
    check_run(export, plain)
    with pytest.raises(PreflightError, match=r"hyper-connection streams"):
        check_run(export, mhc)


def test_the_served_capture_follows_the_trained_methods_eagle3_and_the_block_drafters_each_their_own(
    tmp_path: Path,
) -> None:
    """A block drafter is served through SGLang's DFlash capture: its export passes on a family captured for block
    drafters only and is refused on one captured for EAGLE-3 only; with both methods trained, each side's refusal
    names its own method and stages."""
    laguna = target(tmp_path / "a", "laguna", "LagunaForCausalLM")
    qwen2 = target(tmp_path / "b", "qwen2", "Qwen2ForCausalLM")
    stages = ["prepare", "extract", "convert", "train", "export"]
    five = {"aux_layers": [2, 4, 6, 8, 10]}  # the block drafters' five (12 layers)
    dflash = config(tmp_path, stages, evaluate={"live": "off"}, train={"method": "dflash"}, extract=five)
    check_run(dflash, laguna)
    with pytest.raises(PreflightError, match=r"'qwen2'.*no DFlash capture.*export \(the dflash draft's SGLang config"):
        check_run(dflash, qwen2)
    both = config(tmp_path, stages, evaluate={"live": "off"}, train={"methods": ["eagle3", "dflash"]}, extract=five)
    with pytest.raises(PreflightError, match=r"block drafters only.*export \(the eagle3 draft's") as e:
        check_run(both, laguna)
    assert "dflash draft" not in str(e.value)


def test_a_method_whose_layers_the_store_lacks_is_refused_before_training_naming_them(
    tmp_path: Path, model: Path
) -> None:
    """The store holds [2, 6, 9]; train.aux_layers asks [2, 5, 9]: refused, naming the missing layer and the
    extraction that adds it; the store's own layers, and a subset of a 5-layer store's, pass."""
    cfg = config(tmp_path, stages=["train", "export"], train={"method": "eagle3.1", "aux_layers": [2, 5, 9]})
    made_by(config(tmp_path), model)
    named = (
        r"train.method eagle3.1: train.aux_layers \[2, 5, 9\]: the store holds aux layers \[2, 6, 9\], not \[5\]"
        r".*extract.aux_layers: \[2, 5, 6, 9\]"
    )
    with pytest.raises(PreflightError, match=named):
        check_run(cfg, model)
    check_run(config(tmp_path, stages=["convert", "train"], train={"methods": ["eagle3", "eagle3.1"]}), model)
    five = config(tmp_path / "b", stages=["extract", "convert", "train"], extract={"aux_layers": [1, 2, 5, 6, 9]},
                  train={"aux_layers": [2, 6, 9]})  # fmt: skip
    check_run(five, model)  # the layers this run extracts hold the draft's three
    with pytest.raises(PreflightError, match=r"train.method's default layers|train.aux_layers"):
        check_run(five.model_copy(update={"train": five.train.model_copy(update={"aux_layers": [3, 6, 9]})}), model)


@pytest.mark.parametrize(
    ("layers", "named"),
    [
        ([2, 6], r"2 layers; a store holds 3 to 8"),
        (list(range(1, 10)), r"9 layers"),
        ([2, 6, 6], r"each layer once"),
        ([6, 2, 9], r"increasing order"),
    ],
)
def test_aux_layers_of_a_wrong_count_or_order_are_refused_by_the_config(layers: list[int], named: str) -> None:
    with pytest.raises(ValueError, match=named):
        PipelineConfig.model_validate({"extract": {"aux_layers": layers}})


def test_an_unknown_method_and_a_repeated_one_are_refused_naming_the_key() -> None:
    with pytest.raises(ValueError, match=r"train.method[\s\S]*eagle3"):
        PipelineConfig.model_validate({"train": {"method": "medusa"}})
    with pytest.raises(ValueError, match=r"train.methods \['eagle3', 'eagle3'\] names a method twice"):
        PipelineConfig.model_validate({"train": {"methods": ["eagle3", "eagle3"]}})
    assert PipelineConfig().train.trained_methods() == ["eagle3"]
    assert PipelineConfig.model_validate({"train": {"methods": ["eagle3.1", "eagle3"]}}).train.trained_methods() == [
        "eagle3.1", "eagle3"]  # fmt: skip


NO_GPU = {"cuda": lambda: False, "gpu_node": lambda: False}


def test_a_device_set_to_cuda_on_a_worker_without_one_is_refused_naming_each_key(tmp_path: Path, model: Path) -> None:
    cuda = {"device": "cuda"}
    cfg = config(tmp_path, ["extract", "convert", "train", "evaluate"], train=cuda, evaluate={**cuda, "live": "on"},
                 server={**cuda, "engine": "sglang"})  # fmt: skip
    with pytest.raises(PreflightError) as e:
        check_stages(cfg, model, **NO_GPU)
    msg = str(e.value)
    for key, users in (("train.device", "train"), ("evaluate.device", "evaluate (offline)"),
                       ("server.device", "extract, evaluate (live, SGLang)")):  # fmt: skip
        assert f"{key}: cuda, but this worker has no CUDA device" in msg and f"; {users} would fail" in msg, msg
        assert f"Set {key} to cpu, or to auto" in msg
    check_stages(cfg, model, cuda=lambda: True, gpu_node=lambda: True)  # a GPU worker: nothing refused
    nodes = config(tmp_path, ["convert", "train"], train={**cuda, "nodes": 2})  # the nodes check their own device
    check_stages(nodes, model, **NO_GPU)
    with pytest.raises(PreflightError, match=r"train\.device: cuda"):
        check_stages(nodes, model, train_here=True, **NO_GPU)  # the train-node flow on its node
    auto = config(tmp_path, ["extract", "convert", "train", "evaluate"])  # `auto` resolves where the stage runs
    check_stages(auto, model, **NO_GPU)
    transformers = config(tmp_path, ["extract"], server=cuda)  # the engine in this process: torch's view
    with pytest.raises(PreflightError, match=r"server.device: cuda.*server.engine transformers"):
        check_stages(transformers, model, cuda=lambda: False, gpu_node=lambda: True)
    check_stages(transformers, model, on_nodes=True, **NO_GPU)  # a fan-out: its nodes check their own devices
    with pytest.raises(PreflightError, match=r"extract\.aux_layers \[2, 6, 13\]: \[13\] out of range"):
        check_run(config(tmp_path, ["extract"], server=cuda, extract={"aux_layers": [2, 6, 13]}), model, on_nodes=True)


@pytest.mark.parametrize("flag", ["--enable-two-batch-overlap", "--enable-two-batch", "--enable-tw"])
def test_two_batch_overlap_in_the_servers_flags_is_refused_before_the_first_stage_naming_the_key_and_the_users(
    tmp_path: Path, model: Path, flag: str
) -> None:
    """SGLang's two-batch overlap skips the capture of most layers (eagle3/serving/launch_args.py); argparse takes
    the flag's unambiguous prefixes too."""
    server = {"engine": "sglang", "extra_args": ["--mem-fraction-static", "0.8", flag]}
    cfg = config(tmp_path, ["extract", "convert", "train", "evaluate"], server=server, evaluate={"live": "on"})
    with pytest.raises(PreflightError) as e:
        check_stages(cfg, model, **NO_GPU)
    msg = str(e.value)
    assert msg.startswith("Refused before the first stage") and f"server.extra_args has '{flag}'" in msg, msg
    assert "(--enable-two-batch-overlap)" in msg and "Remove it from server.extra_args" in msg
    assert "extract (server.engine sglang launches the capturing server), evaluate (evaluate.live" in msg
    attached = config(tmp_path, ["extract"], server={**server, "url": "http://b:30000"})
    check_stages(attached, model, **NO_GPU)  # launched elsewhere, and nothing here launches one
    synthesis_only = config(tmp_path, ["prepare", "synthesize"], server=server)
    check_stages(synthesis_only, model, **NO_GPU)  # generation captures nothing


def test_flags_that_leave_the_capture_alone_are_not_refused(tmp_path: Path, model: Path) -> None:
    for flag in ("--enable-single-batch-overlap", "--enable-torch-compile", "--enable-two-batch-overlapping"):
        cfg = config(tmp_path, ["extract"], server={"engine": "sglang", "extra_args": [flag]})
        check_stages(cfg, model, **NO_GPU)


def test_train_without_convert_is_refused_when_the_vocabulary_map_does_not_fit_or_is_missing(
    tmp_path: Path, model: Path
) -> None:
    cfg = config(tmp_path, ["train", "export"], evaluate={"live": "off"}, train={"draft_vocab_size": 80})
    with pytest.raises(PreflightError, match=r"vocab_map.safetensors, .*index.arrow missing: train reads"):
        check_stages(cfg, model)
    store = made_by(cfg, model)
    store.index_path.write_bytes(b"")
    write_vocab_map(store.vocab_map_path, select_vocab(torch.arange(100), 64))
    with pytest.raises(PreflightError) as e:
        check_run(cfg, model)  # the pipeline asks the same
    assert (
        f"{store.vocab_map_path} has 64 draft ids, train.draft_vocab_size asks 80. Set train.draft_vocab_size: 64"
        in (str(e.value))
    )
    check_stages(cfg.model_copy(update={"stages": ["convert", "train"]}), model)  # convert builds it again
    check_stages(config(tmp_path, ["train"], train={"draft_vocab_size": 64}), model)
    write_vocab_map(store.vocab_map_path, select_vocab(torch.arange(100), 100))  # the whole target vocabulary
    check_stages(config(tmp_path, ["train"], train={"draft_vocab_size": 5000}), model)  # asks for more: capped
    write_vocab_map(store.vocab_map_path, select_vocab(torch.arange(100), 64))
    check_stages(config(tmp_path, ["train"]), model)  # train.draft_vocab_size unset: the store's map, whatever size


def test_a_chain_longer_than_a_block_drafter_drafts_is_refused_naming_the_keys(tmp_path: Path, model: Path) -> None:
    cfg = config(tmp_path, stages=["export", "evaluate"], train={"method": "dflash", "block_size": 4},
                 evaluate={"draft_steps": 3, "compare_steps": [3, 5]})  # fmt: skip
    with pytest.raises(PreflightError, match=r"train.method dflash drafts at most 3 tokens a round .*not \[5\]"):
        check_run(cfg, model)
    check_run(config(tmp_path, stages=["export", "evaluate"], train={"method": "dflash", "block_size": 6},
                     evaluate={"draft_steps": 3, "compare_steps": [3, 5]}), model)  # fmt: skip


def test_a_data_max_length_longer_than_the_sglang_server_takes_is_refused_before_the_first_stage(
    tmp_path: Path, model: Path
) -> None:
    """SGLang refuses a prompt of min(context, KV pool) - 6 tokens or more: extraction would fail those samples after
    prepare and synthesize ran, so a data.max_length above that is refused up front, naming the bound."""

    def cfg(max_length: int, **server: Any) -> PipelineConfig:
        return config(tmp_path, data={"dataset": "d", "max_length": max_length},
                      server={"engine": "sglang", "device": "cpu", **server})  # fmt: skip

    with pytest.raises(PreflightError) as e:
        check_stages(cfg(4096, max_total_tokens=4096), model, **NO_GPU)
    assert ("data.max_length: 4096, but the SGLang server takes prompts of at most 4089 tokens "
            "(server.max_total_tokens (its KV pool): 4096, less the 7 SGLang holds back)") in str(e.value)  # fmt: skip
    check_stages(cfg(4089, max_total_tokens=4096), model, **NO_GPU)
    check_stages(cfg(4096), model, **NO_GPU)  # no pool size and no context: nothing known before the server starts
    check_stages(cfg(4096, max_total_tokens=4096, url="http://h:1"), model, **NO_GPU)  # attached: its own limits
    transformers = config(tmp_path, data={"dataset": "d", "max_length": 1 << 20}, server={"engine": "transformers"})
    check_stages(transformers, model, **NO_GPU)

    facts = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**facts, "max_position_embeddings": 2048}))
    with pytest.raises(PreflightError, match=r"at most 2041 tokens \(the target's context \(max_position_embeddings"):
        check_stages(cfg(2048, max_total_tokens=16384), model, **NO_GPU)
    for given in (["--context-length", "512"], ["--context-l=512"], ["--context-len", "99", "--context-length", "512"]):
        with pytest.raises(PreflightError, match=r"at most 505 tokens \(--context-length in server.extra_args: 512,"):
            check_stages(cfg(1024, extra_args=given), model, **NO_GPU)  # argparse's prefixes, the last value wins


def test_a_sparse_attention_target_on_the_transformers_engine_is_refused_past_its_index_topk(tmp_path: Path) -> None:
    """DeepSeek-V3.2's indexer in transformers is not causal past index_topk keys (the premise:
    tests/integration/test_sparse_attention.py): a store from longer samples would not be what SGLang feeds."""
    v32 = target(tmp_path, "deepseek_v32", "DeepseekV32ForCausalLM", index_topk=2048)

    def cfg(max_length: int, engine: str = "transformers") -> PipelineConfig:
        return config(tmp_path, data={"dataset": "d", "max_length": max_length}, server={"engine": engine})

    with pytest.raises(PreflightError) as e:
        check_stages(cfg(4096), v32, **NO_GPU)
    msg = str(e.value)
    assert f"data.max_length: 4096, but {v32}/config.json's index_topk is 2048" in msg, msg
    assert "Set server.engine: sglang, or data.max_length to 2048 or less" in msg, msg
    check_stages(cfg(2048), v32, **NO_GPU)  # every sample within the keys the indexer keeps: dense, causal
    check_stages(cfg(4096, "sglang"), v32, **NO_GPU)  # SGLang's indexer is causal


def test_longcat_flash_counts_its_decoder_layers_by_num_layers_as_sglang_does(tmp_path: Path) -> None:
    """Its config.json says num_layers (each decoder layer holds two attention blocks); SGLang builds and numbers
    that many layers, and transformers' hidden_states has that many + 1 entries."""
    from eagle3.target.files import ModelError, read_model_facts

    d = tmp_path / "longcat"
    d.mkdir()
    facts = {"num_layers": 28, "hidden_size": 64, "vocab_size": 100}
    (d / "config.json").write_text(json.dumps({"model_type": "longcat_flash", **facts}))
    assert read_model_facts(d).num_layers == 28
    (d / "config.json").write_text(json.dumps({"model_type": "llama", **facts}))
    with pytest.raises(ModelError, match="missing 'num_hidden_layers'"):  # any other family: num_hidden_layers
        read_model_facts(d)
