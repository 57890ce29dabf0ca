"""The config read from YAML and `key.sub=value` overrides (`eagle3 run --set`, a deployment's `overrides`),
validated, with errors that name the file and the keys; and written back as YAML."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from eagle3.config.pipeline import PipelineConfig


class ConfigError(ValueError):
    """A config file or override that does not validate; the message names the file and the keys."""


def _format_errors(err: ValidationError) -> str:
    lines = []
    for e in err.errors():
        key = ".".join(str(p) for p in e["loc"]) or "<root>"
        if e["type"] == "extra_forbidden":
            lines.append(f"  {key}: unknown key (check the spelling; see docs/formats.md for the config reference)")
        else:
            lines.append(f"  {key}: {e['msg']} (got {e.get('input')!r})")
    return "\n".join(lines)


def _set_dotted(tree: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, leaf = dotted.split(".")
    node = tree
    for p in parents:
        node = node.setdefault(p, {})
        if not isinstance(node, dict):
            raise ConfigError(f"override {dotted!r}: {p!r} is not a section")
    node[leaf] = value


def override_items(overrides: list[str] | tuple[str, ...]) -> list[tuple[str, Any]]:
    """`key.sub=value` lines (`eagle3 run --set`, a deployment's `overrides`) as (dotted key, YAML value)."""
    items = []
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} must look like key.sub=value")
        key, value = item.split("=", 1)
        items.append((key.strip(), yaml.safe_load(value)))
    return items


def overrides_tree(overrides: list[str] | tuple[str, ...]) -> dict[str, Any]:
    """The nested mapping the `key.sub=value` lines set."""
    tree: dict[str, Any] = {}
    for key, value in override_items(overrides):
        _set_dotted(tree, key, value)
    return tree


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> PipelineConfig:
    """Read YAML (or the defaults when path is None), apply `key.sub=value` overrides, validate."""
    raw: dict[str, Any] = {}
    source = "<defaults>"
    if path is not None:
        source = str(path)
        try:
            loaded = yaml.safe_load(Path(path).read_text())
        except FileNotFoundError:
            raise ConfigError(f"config file {path} does not exist") from None
        except yaml.YAMLError as e:
            raise ConfigError(f"config file {path} is not valid YAML: {e}") from None
        if loaded is not None and not isinstance(loaded, dict):
            raise ConfigError(f"config file {path}: top level must be a mapping, got {type(loaded).__name__}")
        raw = loaded or {}
    for key, value in override_items(overrides or []):
        _set_dotted(raw, key, value)
    try:
        return PipelineConfig.model_validate(raw)
    except ValidationError as e:
        raise ConfigError(f"invalid config {source}:\n{_format_errors(e)}") from None


def config_to_yaml(cfg: PipelineConfig) -> str:
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)
