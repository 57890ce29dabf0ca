"""The whole tree (PipelineConfig: one section per stage) and run_dir's placeholders, filled in once when a
run starts."""

from __future__ import annotations

import datetime as dt
import string
from collections.abc import Callable

from pydantic import Field, field_validator, model_validator

from eagle3.config.base import DEFAULT_STAGES, STAGES, Stage, StrictModel
from eagle3.config.data import DataConfig, PromptsConfig, SynthesizeConfig
from eagle3.config.evaluate import EvaluateConfig
from eagle3.config.extract import DiskConfig, ExtractConfig, ServerConfig
from eagle3.config.train import TrainConfig
from eagle3.store.paths import dump_root


class PipelineConfig(StrictModel):
    """[prompts] -> prepare -> [synthesize] -> extract -> convert -> train -> export -> evaluate."""

    run_dir: str = Field(
        "data/runs/demo",
        description="Output directory of this run (the store). May hold `{date}` (UTC, YYYY-MM-DD) and `{model_sha}` "
        "(the first 12 hex digits of the target model's content hash), filled in once when the run starts: "
        "`data/runs/{model_sha}` gives each model checkpoint its own store.",
    )
    run_dir_template: str | None = Field(
        None, description="Set by the run, not by you: `run_dir` as written, before its placeholders were filled in."
    )
    model: str = Field(
        "demo", description="Target model: a Hugging Face model directory, or `demo` for the bundled SmolLM2-135M."
    )
    data_dir: str = Field("data", description="Where the demo model and caches are installed.")
    stages: list[Stage] = Field(
        default_factory=lambda: list(DEFAULT_STAGES), description="Stages to run, in pipeline order."
    )
    prompts: PromptsConfig = Field(default_factory=PromptsConfig)  # type: ignore[arg-type]
    data: DataConfig = Field(default_factory=DataConfig)  # type: ignore[arg-type]
    synthesize: SynthesizeConfig = Field(default_factory=SynthesizeConfig)  # type: ignore[arg-type]
    server: ServerConfig = Field(default_factory=ServerConfig)  # type: ignore[arg-type]
    extract: ExtractConfig = Field(default_factory=ExtractConfig)  # type: ignore[arg-type]
    disk: DiskConfig = Field(default_factory=DiskConfig)  # type: ignore[arg-type]
    train: TrainConfig = Field(default_factory=TrainConfig)  # type: ignore[arg-type]
    evaluate: EvaluateConfig = Field(default_factory=EvaluateConfig)  # type: ignore[arg-type]

    @model_validator(mode="after")
    def _check(self) -> PipelineConfig:
        order = {s: i for i, s in enumerate(STAGES)}
        if [order[s] for s in self.stages] != sorted(order[s] for s in set(self.stages)):
            raise ValueError(f"stages must be unique and in pipeline order {list(STAGES)}; got {self.stages}")
        return self

    @field_validator("run_dir")
    @classmethod
    def _check_run_dir_placeholders(cls, run_dir: str) -> str:
        unknown = run_dir_placeholders(run_dir) - set(RUN_DIR_PLACEHOLDERS)
        if unknown:
            raise ValueError(f"unknown placeholder(s) {sorted(unknown)}; use {{date}} or {{model_sha}}")
        return run_dir

    @model_validator(mode="after")
    def _check_attached_dump_dirs(self) -> PipelineConfig:
        """Two attached servers writing one dump directory would clear each other's files."""
        base = dump_root(self.run_dir, self.extract.dump_dir)
        dirs = [s.dump_dir or str(base) for s in self.server.servers if s.url is not None]
        if len(set(dirs)) != len(dirs):
            raise ValueError(
                f"server.servers: attached servers share a dump directory ({dirs}); launch each with its own "
                "EAGLE3_DUMP_DIR and give it as that entry's dump_dir"
            )
        return self


RUN_DIR_PLACEHOLDERS = ("date", "model_sha")


def run_dir_placeholders(run_dir: str) -> set[str]:
    try:
        return {name for _, name, _, _ in string.Formatter().parse(run_dir) if name is not None}
    except ValueError as e:
        raise ValueError(f"{e} (placeholders look like {{date}})") from None


def resolve_run_dir(cfg: PipelineConfig, *, today: dt.date, model_sha: Callable[[], str]) -> PipelineConfig:
    """`cfg` with run_dir's placeholders filled in (once, at run start; the template kept in run_dir_template).
    `model_sha()` (the model's content hash) is called only when the template uses it. No placeholders: `cfg`."""
    used = run_dir_placeholders(cfg.run_dir)
    if not used:
        return cfg
    values = {"date": today.isoformat(), "model_sha": model_sha()[:12] if "model_sha" in used else ""}
    return cfg.model_copy(update={"run_dir": cfg.run_dir.format(**values), "run_dir_template": cfg.run_dir})
