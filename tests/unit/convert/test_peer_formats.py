"""SpecForge and speculators layouts: exact round trips, the peers' reader contracts, layer ids, bad input."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from eagle3.config import PipelineConfig
from eagle3.convert import (
    FinalNorm,
    PeerFormatError,
    TargetModel,
    convert,
    export_specforge,
    export_speculators,
    hf_to_specforge,
    hf_to_vllm,
    import_specforge,
    import_speculators,
    specforge_to_hf,
    vllm_to_hf,
)
from eagle3.store.run_store import RunStore
from tests.unit.convert.convert_fixtures import AUX_LAYERS, NUM_LAYERS, make_store

SAMPLES = [([5, 6, 7, 0], [0, 1, 1, 0]), ([8] * 7, [1] * 7), ([1, 2], [0, 1]), ([3, 4, 5], [0, 0, 1]), ([9], [1])]
TARGET = TargetModel(model_path="/models/tiny", num_layers=NUM_LAYERS, vocab_size=64)
H, K = 16, len(AUX_LAYERS)


def _same_store(a: RunStore, b: RunStore) -> None:
    """Bit-identical tensors and the same metadata in every sample, same shards, same layer indices.

    (Not byte-identical files: safetensors writes the metadata map in no fixed order.)
    """
    ia, ib = a.read_run_info(), b.read_run_info()
    assert ia is not None and ib is not None
    skip = {"created_at"}
    assert ia.model_dump(exclude=skip) == ib.model_dump(exclude=skip)
    got = list(b.iter_samples())
    assert [(s, i) for s, i, _ in a.iter_samples()] == [(s, i) for s, i, _ in got]
    for (_, _, pa_), (_, _, pb) in zip(a.iter_samples(), got, strict=True):
        ta, tb = load_file(pa_), load_file(pb)
        assert ta.keys() == tb.keys()
        for key in ta:
            assert ta[key].dtype == tb[key].dtype and ta[key].shape == tb[key].shape
            assert torch.equal(ta[key].view(torch.uint8), tb[key].view(torch.uint8)), (pb, key)
        with safe_open(str(pa_), "pt") as fa, safe_open(str(pb), "pt") as fb:
            assert fa.metadata() == fb.metadata()


def _ckpt(path: Path, ids: list[int], mask: list[int], aux: torch.Tensor, last: torch.Tensor) -> None:
    """A feature file the way SpecForge's prepare_hidden_states.py writes one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    t = len(ids)
    rec = {"input_ids": torch.tensor(ids), "loss_mask": torch.tensor(mask), "aux_hidden_state": aux.reshape(1, t, -1),
           "hidden_state": last.reshape(1, t, -1)}  # fmt: skip
    torch.save(rec, path)


# layer conventions ------------------------------------------------------------------------------
def test_layer_conventions_map_specforge_output_ids_and_vllm_input_ids_to_hf_indices() -> None:
    n = 30
    assert hf_to_specforge([2, 15, 27]) == [1, 14, 26]  # SpecForge default [1, N//2-1, N-4]
    assert specforge_to_hf([1, 14, 26]) == [2, 15, 27]  # ... is EAGLE-3's HF default [2, N//2, N-3]
    assert hf_to_vllm([2, 15, 27], n) == [2, 15, 27, 30]  # speculators default [2, N//2, N-3, N]
    assert vllm_to_hf([2, 15, 27, 30], n, "x") == [2, 15, 27]
    with pytest.raises(PeerFormatError, match="must end with the model depth 30"):
        vllm_to_hf([2, 15, 27], n, "x")
    with pytest.raises(PeerFormatError, match="no exact vLLM id"):
        hf_to_vllm([2, 15, 30], n)


# SpecForge --------------------------------------------------------------------------------------
def test_specforge_round_trip_is_bit_identical_with_the_same_layer_indices(tmp_path: Path) -> None:
    src = make_store(tmp_path / "run", SAMPLES)
    convert(PipelineConfig.model_validate({"run_dir": str(src.root), "train": {"draft_vocab_size": 8}}), src)
    exp = export_specforge(src, tmp_path / "sf", workers=2)
    assert exp.num_samples == 5 and exp.peer_layer_ids == [1, 3, 4]
    back = RunStore(tmp_path / "back")
    imp = import_specforge(tmp_path / "sf", back, workers=2)
    assert imp.used_sidecar and imp.aux_layers == AUX_LAYERS and imp.peer_layer_ids == [1, 3, 4]
    _same_store(src, back)


def test_specforge_export_is_what_the_specforge_reader_loads(tmp_path: Path) -> None:
    src = make_store(tmp_path / "run", SAMPLES, shard_size=2)
    convert(PipelineConfig.model_validate({"run_dir": str(src.root), "train": {"draft_vocab_size": 8}}), src)
    export_specforge(src, tmp_path / "sf", file_group_size=2)
    files = sorted(str(p.relative_to(tmp_path / "sf")) for p in (tmp_path / "sf").rglob("*.ckpt"))
    assert files == ["rows_0-2/data_0.ckpt", "rows_0-2/data_1.ckpt", "rows_2-4/data_2.ckpt", "rows_2-4/data_3.ckpt",
                     "rows_4-6/data_4.ckpt"]  # fmt: skip
    raw = torch.load(tmp_path / "sf/rows_0-2/data_1.ckpt", weights_only=True, mmap=True)
    assert set(raw) == {"input_ids", "loss_mask", "aux_hidden_state", "hidden_state"}
    assert raw["input_ids"].dtype == raw["loss_mask"].dtype == torch.int64 and raw["input_ids"].shape == (7,)
    assert raw["aux_hidden_state"].shape == (1, 7, K * H) and raw["aux_hidden_state"].dtype == torch.bfloat16
    assert raw["hidden_state"].shape == (1, 7, H)
    sample = src.open_sample(0, "s00-001")  # SpecForge's normalizer: aux.squeeze(0) is [T, K*H], layers in order
    assert torch.equal(raw["aux_hidden_state"][0, :, H : 2 * H], sample.aux_hidden_states[:, 1])
    vm = torch.load(tmp_path / "sf/vocab_mapping/vocab_mapping.pt", weights_only=True)
    assert set(vm) == {"d2t", "t2d"} and vm["d2t"].shape == (8,) and vm["t2d"].shape == (64,)


def test_specforge_data_without_our_sidecar_imports_with_given_ids_and_trims_zero_padding(tmp_path: Path) -> None:
    sf = tmp_path / "sf"
    aux, last = torch.randn(5, K, H).bfloat16(), torch.randn(5, H).bfloat16()
    _ckpt(sf / "rows_0-2000/data_0.ckpt", [4, 5, 6, 0, 0], [0, 1, 1, 0, 0], aux, last)  # 2 rows of batch padding
    _ckpt(sf / "rows_0-2000/data_10.ckpt", [7, 8, 9, 1, 2], [1, 1, 1, 1, 0], aux, last)
    _ckpt(sf / "rows_0-2000/data_2.ckpt", [3, 3, 3, 3, 3], [1, 1, 1, 1, 1], aux, last)
    store = RunStore(tmp_path / "imp")
    imp = import_specforge(sf, store, target=TARGET, aux_layers_output_convention=[1, 3, 4], shard_size=2)
    info = store.read_run_info()
    assert info is not None and info.aux_layers == [2, 4, 5] and info.engine_layer_ids == [1, 3, 4]
    assert info.engine_layer_convention == "specforge_output_of_layer" and info.hidden_size == H
    assert imp.trimmed_rows == 2 and imp.num_samples == 3 and imp.num_shards == 2
    ids = [(m, sid) for m, sid, _ in store.iter_samples()]
    assert ids == [(0, "specforge-00000000"), (0, "specforge-00000002"), (1, "specforge-00000010")]  # by data_{i}
    s = store.open_sample(0, "specforge-00000000")
    assert s.input_ids.tolist() == [4, 5, 6] and torch.equal(s.aux_hidden_states, aux[:3])
    assert torch.equal(s.last_hidden_state, last[:3])


def test_specforge_file_missing_a_tensor_names_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "sf/rows_0-2000/data_0.ckpt"
    bad.parent.mkdir(parents=True)
    torch.save({"input_ids": torch.tensor([1, 2]), "loss_mask": torch.tensor([1, 1]),
                "aux_hidden_state": torch.zeros(1, 2, K * H)}, bad)  # fmt: skip
    with pytest.raises(PeerFormatError, match=r"data_0\.ckpt: missing \['hidden_state'\]"):
        import_specforge(tmp_path / "sf", RunStore(tmp_path / "imp"), target=TARGET, aux_layers_hf=AUX_LAYERS)


def test_specforge_file_with_mis_shaped_aux_states_names_the_file(tmp_path: Path) -> None:
    _ckpt(tmp_path / "sf/rows_0-2000/data_0.ckpt", [1, 2], [1, 1], torch.zeros(2, 2, H), torch.zeros(2, H))
    with pytest.raises(PeerFormatError, match=r"data_0\.ckpt: aux_hidden_state has 32 features.*3 layers"):
        import_specforge(tmp_path / "sf", RunStore(tmp_path / "imp"), target=TARGET, aux_layers_hf=AUX_LAYERS)


def test_specforge_file_that_is_not_a_tensor_pickle_is_refused_by_weights_only(tmp_path: Path) -> None:
    bad = tmp_path / "sf/rows_0-2000/data_0.ckpt"
    bad.parent.mkdir(parents=True)
    torch.save({"input_ids": Path("x")}, bad)  # an arbitrary object: weights_only refuses to unpickle it
    with pytest.raises(PeerFormatError, match=r"data_0\.ckpt: cannot be read as a SpecForge feature file"):
        import_specforge(tmp_path / "sf", RunStore(tmp_path / "imp"), target=TARGET, aux_layers_hf=AUX_LAYERS)


# speculators ------------------------------------------------------------------------------------
def test_speculators_round_trip_is_bit_identical_with_the_same_layer_indices(tmp_path: Path) -> None:
    src = make_store(tmp_path / "run", SAMPLES)
    exp = export_speculators(src, tmp_path / "spec", workers=2)
    assert exp.peer_layer_ids == [*AUX_LAYERS, NUM_LAYERS]
    back = RunStore(tmp_path / "back")
    imp = import_speculators(tmp_path / "spec", back, workers=2)
    assert imp.used_sidecar and imp.aux_layers == AUX_LAYERS
    _same_store(src, back)


def test_speculators_export_is_what_the_speculators_reader_loads(tmp_path: Path) -> None:
    import datasets

    src = make_store(tmp_path / "run", SAMPLES)
    convert(PipelineConfig.model_validate({"run_dir": str(src.root), "train": {"draft_vocab_size": 8}}), src)
    export_speculators(src, tmp_path / "spec")
    ds = datasets.load_from_disk(str(tmp_path / "spec"))  # ArrowDataset's first call
    assert ds.format["type"] == "torch" and set(ds.column_names) == {"input_ids", "loss_mask", "seq_len"}
    assert list(ds.with_format(None)["seq_len"]) == [len(i) for i, _ in SAMPLES]
    for i, (ids, mask) in enumerate(SAMPLES):
        hs = load_file(tmp_path / f"spec/hidden_states/hs_{i}.safetensors")  # FileTransfer.get_cached
        assert set(hs) == {"hidden_states", "token_ids"} and hs["token_ids"].dtype == torch.int64
        assert torch.equal(hs["token_ids"], ds[i]["input_ids"])  # the reader's check, on tensors
        assert ds[i]["loss_mask"].tolist() == mask and ds[i]["loss_mask"].dtype == torch.int64
        assert hs["hidden_states"].shape == (len(ids), K + 1, H) and hs["hidden_states"].dtype == torch.bfloat16
    sample = src.open_sample(0, "s00-001")
    one = load_file(tmp_path / "spec/hidden_states/hs_1.safetensors")["hidden_states"]
    assert torch.equal(one[:, :-1], sample.aux_hidden_states) and torch.equal(one[:, -1], sample.last_hidden_state)
    d2t, t2d = np.load(tmp_path / "spec/d2t.npy"), np.load(tmp_path / "spec/t2d.npy")
    assert d2t.dtype == np.int64 and d2t.shape == (8,) and t2d.dtype == np.bool_ and t2d.shape == (64,)


def _vllm_dir(root: Path, rows: list[tuple[list[int], list[int]]], hs: list[torch.Tensor]) -> None:
    """speculators' layout as prepare_data.py + data_generation_offline.py leave it (no sidecar)."""
    import datasets

    ds = datasets.Dataset.from_dict(
        {"input_ids": [i for i, _ in rows], "loss_mask": [m for _, m in rows], "seq_len": [len(i) for i, _ in rows]},
        features=datasets.Features({"input_ids": datasets.List(datasets.Value("int64")),
                                    "loss_mask": datasets.List(datasets.Value("int64")),
                                    "seq_len": datasets.Value("int64")}),
    )  # fmt: skip
    ds.set_format(type="torch")
    ds.save_to_disk(str(root))
    (root / "hidden_states").mkdir()
    for i, ((ids, _), h) in enumerate(zip(rows, hs, strict=True)):
        save_file({"hidden_states": h, "token_ids": torch.tensor(ids)}, root / f"hidden_states/hs_{i}.safetensors")


def test_vllm_extracted_data_imports_with_its_ids_and_the_final_norm_applied(tmp_path: Path) -> None:
    rows = [([1, 2, 3], [0, 1, 1]), ([4, 5], [1, 1])]
    hs = [torch.randn(3, K + 1, H).bfloat16(), torch.randn(2, K + 1, H).bfloat16()]
    _vllm_dir(tmp_path / "spec", rows, hs)
    norm = FinalNorm(weight=torch.rand(H).bfloat16() + 0.5, eps=1e-5)
    store = RunStore(tmp_path / "imp")
    with pytest.raises(PeerFormatError, match="pre-norm"):
        import_speculators(tmp_path / "spec", store, target=TARGET, vllm_layer_ids=[2, 4, 5, 8])
    imp = import_speculators(tmp_path / "spec", store, target=TARGET, vllm_layer_ids=[2, 4, 5, 8], final_norm=norm)
    info = store.read_run_info()
    assert info is not None and info.aux_layers == [2, 4, 5] and info.engine_layer_ids == [2, 4, 5, 8]
    assert info.engine_layer_convention == "vllm_input_of_layer" and imp.num_samples == 2
    s = store.open_sample(0, "speculators-00000001")
    assert torch.equal(s.aux_hidden_states, hs[1][:, :-1])
    assert torch.equal(s.last_hidden_state, norm.apply(hs[1][:, -1]))
    ref = torch.nn.functional.rms_norm(hs[1][:, -1].float(), (H,), eps=1e-5).bfloat16() * norm.weight
    assert torch.allclose(s.last_hidden_state.float(), ref.float(), rtol=1e-2, atol=1e-2)


def test_speculators_file_missing_token_ids_names_the_file(tmp_path: Path) -> None:
    _vllm_dir(tmp_path / "spec", [([1, 2], [1, 1])], [torch.zeros(2, K + 1, H).bfloat16()])
    save_file({"hidden_states": torch.zeros(2, K + 1, H).bfloat16()}, tmp_path / "spec/hidden_states/hs_0.safetensors")
    with pytest.raises(PeerFormatError, match=r"hs_0\.safetensors: missing \['token_ids'\]"):
        import_speculators(tmp_path / "spec", RunStore(tmp_path / "i"), target=TARGET, vllm_layer_ids=[2, 4, 5, 8],
                           final_norm=FinalNorm(torch.ones(H), 1e-5))  # fmt: skip


def test_speculators_file_with_the_wrong_layer_count_names_the_file(tmp_path: Path) -> None:
    _vllm_dir(tmp_path / "spec", [([1, 2], [1, 1])], [torch.zeros(2, K, H).bfloat16()])  # no last-layer slot
    with pytest.raises(PeerFormatError, match=r"hs_0\.safetensors: hidden_states is torch.bfloat16 \[2, 3, 16\]"):
        import_speculators(tmp_path / "spec", RunStore(tmp_path / "i"), target=TARGET, vllm_layer_ids=[2, 4, 5, 8],
                           final_norm=FinalNorm(torch.ones(H), 1e-5))  # fmt: skip


def test_a_missing_speculators_hidden_state_file_names_the_file_unless_skipped(tmp_path: Path) -> None:
    _vllm_dir(tmp_path / "spec", [([1, 2], [1, 1]), ([3], [1])], [torch.zeros(2, K + 1, H).bfloat16()] * 2)
    (tmp_path / "spec/hidden_states/hs_1.safetensors").unlink()
    args = {"target": TARGET, "vllm_layer_ids": [2, 4, 5, 8], "final_norm": FinalNorm(torch.ones(H), 1e-5)}
    with pytest.raises(PeerFormatError, match=r"hs_1\.safetensors: missing \(row 1"):
        import_speculators(tmp_path / "spec", RunStore(tmp_path / "a"), **args)  # type: ignore[arg-type]
    imp = import_speculators(tmp_path / "spec", RunStore(tmp_path / "b"), on_missing="skip", **args)  # type: ignore[arg-type]
    assert imp.num_samples == 1 and imp.skipped_missing[0].endswith("hs_1.safetensors")


def test_import_refuses_a_non_empty_store_and_export_a_foreign_directory(tmp_path: Path) -> None:
    src = make_store(tmp_path / "run", SAMPLES)
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk/file.txt").write_text("x")
    with pytest.raises(PeerFormatError, match="junk is not empty and is not an unfinished specforge export"):
        export_specforge(src, tmp_path / "junk")
    export_specforge(src, tmp_path / "sf")
    with pytest.raises(PeerFormatError, match="run is not empty"):
        import_specforge(tmp_path / "sf", src)


def test_an_interrupted_export_resumes_and_skips_finished_files(tmp_path: Path) -> None:
    src = make_store(tmp_path / "run", SAMPLES)
    export_speculators(src, tmp_path / "spec")
    (tmp_path / "spec/hidden_states/hs_3.safetensors").unlink()
    (tmp_path / "spec/hidden_states/.hs_3.safetensors.abc.tmp").write_bytes(b"half")  # a killed writer's temp
    again = export_speculators(src, tmp_path / "spec")
    assert again.skipped == 4 and not list((tmp_path / "spec").rglob("*.tmp"))
    _same_store(src, (lambda s: (import_speculators(tmp_path / "spec", s), s)[1])(RunStore(tmp_path / "back")))


def test_final_norm_is_read_from_a_model_directory(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text('{"num_hidden_layers": 8, "hidden_size": 16, "rms_norm_eps": 1e-06}')
    w = torch.rand(H).bfloat16()
    save_file({"model.norm.weight": w, "model.embed_tokens.weight": torch.zeros(4, H)}, tmp_path / "model.safetensors")
    norm = FinalNorm.from_model_dir(tmp_path)
    assert norm.eps == 1e-6 and torch.equal(norm.weight, w)


def test_gzipped_specforge_files_import_like_plain_ones(tmp_path: Path) -> None:
    import gzip

    aux, last = torch.randn(3, K, H).bfloat16(), torch.randn(3, H).bfloat16()
    _ckpt(tmp_path / "plain.ckpt", [1, 2, 3], [0, 1, 1], aux, last)
    gz = tmp_path / "sf/rows_0-2000/data_0.ckpt.gz"
    gz.parent.mkdir(parents=True)
    with gzip.open(gz, "wb") as f:
        f.write((tmp_path / "plain.ckpt").read_bytes())
    store = RunStore(tmp_path / "imp")
    import_specforge(tmp_path / "sf", store, target=TARGET, aux_layers_hf=AUX_LAYERS)
    s = store.open_sample(0, "specforge-00000000")
    assert torch.equal(s.aux_hidden_states, aux) and torch.equal(s.last_hidden_state, last)


def test_speculators_export_for_their_trainer_gives_back_our_post_norm_state_through_their_verifier_norm(
    tmp_path: Path,
) -> None:
    """final_norm: the last slot is post-norm / weight, whose normalisation (speculators' verifier norm, an RMSNorm
    like FinalNorm.apply) is a real post-norm state again to within bf16 rounding; importing it back needs the norm."""
    x = torch.randn(5, H, dtype=torch.bfloat16) * 3
    norm = FinalNorm(weight=torch.linspace(0.5, 2.0, H), eps=1e-6)
    post = norm.apply(x)
    assert torch.allclose(norm.apply(norm.invert(post)).float(), post.float(), rtol=2e-2, atol=2e-2)
    src = make_store(tmp_path / "run", SAMPLES)
    exp = export_speculators(src, tmp_path / "spec", final_norm=norm, workers=2)
    assert "maps it back" in exp.notes[1]
    for i, (_, _, path) in enumerate(src.iter_samples()):
        ours = load_file(path)["last_hidden_state"]
        slot = load_file(str(tmp_path / "spec" / "hidden_states" / f"hs_{i}.safetensors"))["hidden_states"][:, -1]
        assert torch.equal(slot, norm.invert(ours))
    with pytest.raises(PeerFormatError, match="norm_input"):
        import_speculators(tmp_path / "spec", RunStore(tmp_path / "refused"), workers=1)
    back = RunStore(tmp_path / "back")
    assert import_speculators(tmp_path / "spec", back, final_norm=norm, workers=1).num_samples == len(SAMPLES)


def test_both_exports_write_our_draft_vocabulary_in_the_peers_order_ascending_target_ids(tmp_path: Path) -> None:
    """speculators and SpecForge take the teacher's rows as lm_head[t2d] (ascending target id) whatever d2t says: a
    frequency-ordered d2t would pair each of their lm_head rows with another token's target (acceptance 1.0)."""
    from eagle3.convert.vocab import ascending, select_vocab, write_vocab_map

    src = make_store(tmp_path / "run", SAMPLES)
    counts = torch.zeros(64, dtype=torch.int64)
    counts[[40, 3, 17, 9]] = torch.tensor([9, 7, 5, 3])  # most frequent first: 40, 3, 17, 9
    vm = select_vocab(counts, 4)
    write_vocab_map(src.vocab_map_path, vm)
    want = torch.tensor([3, 9, 17, 40])
    assert torch.equal(torch.arange(4) + ascending(vm.d2t), want)
    export_speculators(src, tmp_path / "spec", workers=1)
    d2t = torch.from_numpy(np.load(tmp_path / "spec" / "d2t.npy"))
    assert torch.equal(torch.arange(4) + d2t, want)
    assert torch.equal(torch.from_numpy(np.load(tmp_path / "spec" / "t2d.npy")), vm.t2d)
    export_specforge(src, tmp_path / "sf", workers=1)
    mapping = torch.load(tmp_path / "sf" / "vocab_mapping" / "vocab_mapping.pt", weights_only=True)
    assert torch.equal(torch.arange(4) + mapping["d2t"], want) and torch.equal(mapping["t2d"], vm.t2d)
