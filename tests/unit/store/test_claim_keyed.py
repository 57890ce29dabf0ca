"""claim_keyed: outputs made under the same key stay; under another key they go and the new key is recorded."""

from __future__ import annotations

from pathlib import Path

from eagle3.store.fsio import claim_keyed, read_json


def test_same_key_keeps_outputs_another_key_clears_them_and_temps_always_go(tmp_path: Path) -> None:
    manifest, out = tmp_path / "manifest.json", tmp_path / "samples"
    out.mkdir()

    def outputs() -> list[Path]:
        return sorted(out.glob("*.json"))

    claim_keyed(manifest, {"k": 1}, outputs, out)
    (out / "a.json").write_text("{}")
    (out / ".b.json.tmp").write_text("half")
    claim_keyed(manifest, {"k": 1}, outputs, out)
    assert [p.name for p in out.iterdir()] == ["a.json"]  # kept; the killed writer's temp removed
    claim_keyed(manifest, {"k": 2}, outputs, out)
    assert list(out.iterdir()) == [] and read_json(manifest) == {"k": 2}
