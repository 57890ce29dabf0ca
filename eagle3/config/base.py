"""What every section of the config tree shares: the strict base model, the stage names, and the
auto/on/off setting type."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict

Stage = Literal["prompts", "prepare", "synthesize", "extract", "convert", "train", "export", "evaluate"]
STAGES: tuple[Stage, ...] = (
    "prompts", "prepare", "synthesize", "extract", "convert", "train", "export", "evaluate"
)  # fmt: skip
DEFAULT_STAGES: tuple[Stage, ...] = ("prepare", "synthesize", "extract")


def _on_off_from_bool(v: Any) -> Any:
    """YAML reads `on`/`off` (and true/false) as booleans: they mean `on` and `off`."""
    return ("on" if v else "off") if isinstance(v, bool) else v


#: A setting that is `auto`, `on` or `off` (YAML's booleans accepted for on/off: `--set evaluate.live=off`).
OnOff = Annotated[Literal["auto", "on", "off"], BeforeValidator(_on_off_from_bool)]


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)
