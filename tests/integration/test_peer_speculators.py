"""speculators 0.9.0's own trainer consumes our export, and we consume its checkpoint (issue 48's interop).

Their trainer runs in its own pinned venv (.venv-speculators, `make speculators-env`), through their `speculators
train` entry point (bench/peers/speculators_train.py: on a CPU two device shims, named there), for a few steps on
the shared demo store exported with export_speculators(final_norm=...). Its checkpoint comes back through
import_speculators_draft, loads as our EAGLE-3 draft with exactly their trained weights, and, exported again by our
release export, loads in SGLang 0.5.23's own loader with the same weights (when .venv-sglang exists).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from bench.peers.speculators_peer import PYTHON as SPECULATORS_PYTHON
from bench.peers.speculators_peer import flags
from eagle3.config import PipelineConfig
from eagle3.convert import FinalNorm, export_speculators, import_speculators_draft, read_vocab_map
from eagle3.convert.vocab import ascending
from eagle3.draft.load import load_draft
from eagle3.release.export import export_draft
from eagle3.store.run_store import RunStore
from tests.integration.sglang_support import SGLANG_PYTHON
from tests.ports import free_port

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
STEPS = 3
pytestmark = pytest.mark.skipif(
    not SPECULATORS_PYTHON.is_file(),
    reason=f"speculators' environment is absent ({SPECULATORS_PYTHON}): `make speculators-env` builds it",
)


@pytest.fixture(scope="module")
def trained(demo_store: PipelineConfig, demo_model: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Their trainer, STEPS steps on our export of the demo store; its last checkpoint imported as ours."""
    root = tmp_path_factory.mktemp("speculators")
    cfg = demo_store.model_copy(update={"train": demo_store.train.model_copy(update={"max_steps": STEPS})})
    info = RunStore(cfg.run_dir).require_run_info()
    export_speculators(RunStore(cfg.run_dir), root / "export", final_norm=FinalNorm.from_model_dir(demo_model))
    argv = [str(SPECULATORS_PYTHON), str(REPO / "bench" / "peers" / "speculators_train.py"), str(root / "run.json"),
            *flags(cfg, root / "export", root / "ckpt", list(info.aux_layers))]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": "", "TQDM_DISABLE": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(argv, cwd=root, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    epochs = sorted((p for p in (root / "ckpt").iterdir() if p.name.isdigit()), key=lambda p: int(p.name))
    imported = import_speculators_draft(epochs[-1], root / "imported")
    return {"cfg": cfg, "info": info, "run": json.loads((root / "run.json").read_text()), "theirs": epochs[-1],
            "imported": imported, "root": root}  # fmt: skip


def test_their_trainer_takes_our_export_for_the_steps_we_asked(trained: dict[str, Any]) -> None:
    steps = trained["run"]["steps"]
    assert [s["step"] for s in steps] == list(range(1, STEPS + 1))
    assert all(torch.isfinite(torch.tensor(s["loss"])) and s["tokens"] > 0 for s in steps)
    config = json.loads((trained["theirs"] / "config.json").read_text())
    assert config["eagle_aux_hidden_state_layer_ids"] == trained["info"].aux_layers  # vLLM ids = our HF indices
    assert config["draft_vocab_size"] == trained["cfg"].train.draft_vocab_size
    ours, _, _ = read_vocab_map(RunStore(trained["cfg"].run_dir).vocab_map_path)
    theirs = load_file(str(trained["theirs"] / "model.safetensors"))["d2t"]
    assert torch.equal(theirs, ascending(ours))  # their lm_head rows are lm_head[t2d]: d2t in that order


def test_their_checkpoint_loads_as_our_draft_with_exactly_their_weights(
    trained: dict[str, Any], demo_model: Path
) -> None:
    imported = trained["imported"]
    assert imported.aux_layers == trained["info"].aux_layers and imported.dropped == ["embed_tokens.weight"]
    loaded = load_draft(demo_model, Path(imported.out_dir))
    assert loaded.method.name == "eagle3" and loaded.aux_layers == trained["info"].aux_layers
    ours = loaded.model.trainable_state_dict()  # type: ignore[operator]
    theirs = load_file(str(trained["theirs"] / "model.safetensors"))
    for key, value in theirs.items():
        if key == "embed_tokens.weight":
            continue
        mine = ours["midlayer." + key.removeprefix("layers.0.") if key.startswith("layers.0.") else key]
        assert torch.equal(mine.to(value.dtype), value), key


@pytest.mark.sglang
def test_their_checkpoint_exported_by_us_loads_in_sglangs_loader(trained: dict[str, Any], demo_model: Path) -> None:
    if not SGLANG_PYTHON.is_file():
        pytest.skip(f"SGLang's environment is absent ({SGLANG_PYTHON}): `make sglang-env` builds it")
    root = trained["root"]
    export = export_draft(Path(trained["imported"].out_dir), Path(trained["cfg"].run_dir), demo_model, root / "sglang")
    out, cwd = root / "sglang_view.safetensors", root / "cwd"
    cwd.mkdir()
    env = {**{k: v for k, v in os.environ.items() if k != "EAGLE3_CPU_SPEC"},
           "SGLANG_USE_CPU_ENGINE": "1", "LD_LIBRARY_PATH": str(SGLANG_PYTHON.parent.parent / "stub")}  # fmt: skip
    proc = subprocess.run(
        [str(SGLANG_PYTHON), str(HERE / "sglang_load_draft.py"), "--draft", export.out_dir, "--target", str(demo_model),
         "--out", str(out), "--port", str(free_port())],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    with safe_open(str(out), "pt") as f:
        meta = json.loads(f.metadata()["result"])
        fc = f.get_tensor("param.model.fc.weight")
    assert meta["class"] == "LlamaForCausalLMEagle3"
    assert meta["target_layers_to_capture"] == trained["info"].aux_layers
    theirs = load_file(str(trained["theirs"] / "model.safetensors"))["fc.weight"]
    assert torch.equal(fc, theirs.to(torch.bfloat16))  # their bf16 checkpoint -> ours (fp32) -> served bf16
