"""A run's config from its deployment's config and the part of it a caller gave, and where each value came from.

Prefect merges a run's parameters over its deployment's one level deep: `--params '{"config": {"run_dir": ...}}'`
replaces the deployment's whole `config`, so a train deployment's `stages` and `train.device` would silently fall
back to the pipeline defaults. The flows merge again, key by key and deeply (`merge_config`), and the run summary
says which keys this run set, which it kept from its deployment and that the rest are defaults (`ConfigSources`).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from eagle3.config import PipelineConfig, overrides_tree


class ConfigSources(BaseModel):
    """Where a run's config came from, as dotted keys (`train.device`)."""

    deployment: str | None = None  # `flow/deployment`, None for a run not started from a deployment
    given: list[str] = []  # set by this run's parameters to something other than the deployment's value
    kept: list[str] = []  # the deployment's own settings (differing from the defaults) this run kept
    overridden: list[str] = []  # the deployment's own settings this run's parameters replaced

    def lines(self) -> list[str]:
        """The summary's lines: one per source, the defaults last."""
        if self.deployment is None:
            return ["Settings: this run's config; keys it does not give have the defaults of eagle3/config/."]
        return [
            f"Settings given by this run: {', '.join(self.given) or 'none'}"
            + (f" (replacing the deployment's {', '.join(self.overridden)})" if self.overridden else ""),
            f"Settings of the deployment `{self.deployment}` kept: {', '.join(self.kept) or 'none'}",
            "Every other key: the default of eagle3/config/.",
        ]


def deep_merge(base: dict[str, Any], given: dict[str, Any]) -> dict[str, Any]:
    """`given` over `base`, key by key into nested mappings; a list or scalar in `given` replaces base's."""
    out = dict(base)
    for key, value in given.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def without_nulls(tree: Any) -> Any:
    """`tree` without the keys whose value is None, in every nested mapping (and mappings in lists). Lossless for
    a PipelineConfig: each of its nullable keys defaults to None (tests/unit/test_config_merge.py checks), so the
    UI form's fields can be plain `string`/`integer` ones (no str/None switch) and what is sent still validates."""
    if isinstance(tree, dict):
        return {k: without_nulls(v) for k, v in tree.items() if v is not None}
    if isinstance(tree, list):
        return [without_nulls(v) for v in tree]
    return tree


def leaves(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Dotted key -> value of every non-mapping value in `tree`."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            out.update(leaves(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def merge_config(
    deployment_config: dict[str, Any],
    given: dict[str, Any],
    deployment: str | None,
    overrides: list[str] | tuple[str, ...] = (),
) -> tuple[PipelineConfig, ConfigSources]:
    """The run's config: `given` (what the run's parameters hold) and then `overrides` (`key.sub=value` lines,
    for the keys a form does not show) merged deeply over the deployment's `config`, validated; and which keys
    came from where. A ValueError (pydantic's, or ConfigError for a bad line) names the bad key."""
    given = deep_merge(given, overrides_tree(overrides))
    config = PipelineConfig.model_validate(deep_merge(deployment_config, given))
    defaults = leaves(PipelineConfig.model_validate({}).model_dump(mode="json"))
    base = leaves(PipelineConfig.model_validate(deployment_config).model_dump(mode="json"))
    final = leaves(config.model_dump(mode="json"))
    own = sorted(k for k, v in base.items() if v != defaults.get(k) and k != "run_dir_template")
    given_keys = sorted(k for k in leaves(given) if k == "run_dir" or final.get(k) != base.get(k))
    sources = ConfigSources(
        deployment=deployment,
        given=given_keys,
        kept=[k for k in own if k not in given_keys],
        overridden=[k for k in own if k in given_keys],
    )
    return config, sources
