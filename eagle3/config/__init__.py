"""The one config tree. The CLI reads it from YAML, Prefect renders it as the deployment form, and every run
records it in run.json. Unknown keys are errors (extra="forbid"). One module per part of the tree: base.py (the
strict base model, the stage names, auto/on/off settings), data.py (`data`, `synthesize`, `prompts`), extract.py
(`server`, `extract`, `disk`), train.py, evaluate.py, pipeline.py (PipelineConfig, run_dir's placeholders) and
load.py (YAML and `key.sub=value` overrides in, errors that name the keys). `from eagle3.config import X` is the
interface: the names below.

May import: eagle3.store
"""

from eagle3.config.base import DEFAULT_STAGES, STAGES, OnOff, Stage, StrictModel
from eagle3.config.data import DataConfig, DatasetRef, DataSource, PromptsConfig, SynthesizeConfig
from eagle3.config.evaluate import EvalSetConfig, EvaluateConfig
from eagle3.config.extract import DiskConfig, ExtractConfig, ServerConfig, ServerSlot
from eagle3.config.load import ConfigError, config_to_yaml, load_config, override_items, overrides_tree
from eagle3.config.pipeline import RUN_DIR_PLACEHOLDERS, PipelineConfig, resolve_run_dir, run_dir_placeholders
from eagle3.config.train import DraftMethodName, TrainConfig

__all__ = [
    "DEFAULT_STAGES",
    "RUN_DIR_PLACEHOLDERS",
    "STAGES",
    "ConfigError",
    "DataConfig",
    "DataSource",
    "DatasetRef",
    "DiskConfig",
    "DraftMethodName",
    "EvalSetConfig",
    "EvaluateConfig",
    "ExtractConfig",
    "OnOff",
    "PipelineConfig",
    "PromptsConfig",
    "ServerConfig",
    "ServerSlot",
    "Stage",
    "StrictModel",
    "SynthesizeConfig",
    "TrainConfig",
    "config_to_yaml",
    "load_config",
    "override_items",
    "overrides_tree",
    "resolve_run_dir",
    "run_dir_placeholders",
]
