"""Two real SGLang servers (CPU) launched by one extract flow run fill one run directory, each with its own shards,
and the store holds the same samples with bit-identical tensors and the same headers as the one a single launched
SGLang server made, byte for byte (real Prefect server).

Bit-identical tensors hold for SGLang because every request is prefilled alone (window 1, no radix cache): the
same sample goes through the same kernels with the same shapes on either server. The files are byte-identical too:
the sample encoder writes its header in one order in every process (safetensors' own `save` did not). Three
server start-ups (about a minute each on two cores): one for the
reference, two at once for the scaled-out run.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from eagle3.config import load_config
from eagle3.store.run_store import RunStore
from tests.integration.sglang_support import SGLANG_PYTHON, require_sglang_env
from tests.store_compare import store_contents

pytestmark = [pytest.mark.slow, pytest.mark.sglang]

REPO = Path(__file__).resolve().parents[2]
PORTS = (31210, 31211, 31212)  # this test file's range (31200-31299 is scale-out's)
CHATS = [
    ("What is the capital of France?", "Paris is the capital of France."),
    ("Name a colour of the sky.", "The sky is blue on a clear day."),
    ("What is 3 times 4?", "3 times 4 is 12."),
    ("Say hello in Spanish.", "Hola."),
    ("Give one word that rhymes with cat.", "Hat rhymes with cat."),
    ("What do bees make?", "Bees make honey."),
]


def write_config(tmp: Path, run_dir: Path, server: dict[str, Any]) -> Path:
    data = tmp / "chats.jsonl"
    if not data.exists():
        data.write_text(
            "".join(
                json.dumps({"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]}) + "\n"
                for q, a in CHATS
            )
        )
    cfg = {
        "run_dir": str(run_dir),
        "model": "demo",
        "data_dir": str(REPO / "data"),
        "stages": ["prepare", "extract"],
        "data": {"dataset": str(data), "max_length": 64, "shard_size": 2},
        "server": {
            "engine": "sglang",
            "device": "cpu",
            "python": str(SGLANG_PYTHON),
            "max_total_tokens": 16384,
            "startup_timeout_s": 600,
            **server,
        },
        "extract": {"shard_retries": 0},
    }
    path = tmp / f"{run_dir.name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def test_two_launched_sglang_servers_fill_one_run_with_bit_identical_tensors_and_headers_to_one_server(
    prefect_server: str, demo_model: Path, tmp_path: Path
) -> None:
    require_sglang_env()
    from flows.pipeline import pipeline

    one = pipeline(load_config(write_config(tmp_path, tmp_path / "one", {"port": PORTS[0]})), return_state=True)
    assert one.is_completed(), one.message
    reference = RunStore(tmp_path / "one")
    assert [m.status for m in reference.manifests()] == ["complete"] * 3

    servers = {"servers": [{"port": PORTS[1]}, {"port": PORTS[2]}]}
    two = pipeline(load_config(write_config(tmp_path, tmp_path / "two", servers)), return_state=True)
    assert two.is_completed(), two.message
    store = RunStore(tmp_path / "two")
    assert store_contents(store) == store_contents(reference)
    logs = sorted(p.parent.name for p in (store.root / "server").glob("*/sglang.log"))
    assert [name.rsplit("-", 1)[1] for name in logs] == [str(PORTS[1]), str(PORTS[2])]  # one log each
    by_server = {p.parent.name for p in (store.root / "dump").glob("*/.plugin")}
    assert len(by_server) == 2  # one dump directory each: neither server clears the other's files
    assert not list((store.root / "dump").rglob("*.safetensors"))  # every dump moved into the store
    summary = latest_artifact("two-extract-summary").data
    assert "extracted by #0 sglang" in summary and "extracted by #1 sglang" in summary  # both did shards


def latest_artifact(key: str) -> Any:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey
    from prefect.client.schemas.sorting import ArtifactSort

    with get_client(sync_client=True) as client:
        (artifact,) = client.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key])), sort=ArtifactSort.CREATED_DESC, limit=1
        )
    return artifact
