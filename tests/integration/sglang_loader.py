"""Imported by the scripts SGLang's interpreter runs (sglang_load_draft.py, sglang_load_block_draft.py): the steps
SGLang 0.5.23's draft worker takes to load an exported draft and its target on CPU, shared by both."""

from __future__ import annotations

from typing import Any


def load_draft_and_target(server_args: Any, draft: str, target: str) -> tuple[Any, Any, Any, Any]:
    """With `server_args` published: a one-process gloo group, the draft through SGLang's own loader in draft mode
    (the real weights) and the target's model config. Returns (draft model, draft config, target config, device)."""
    from sglang.srt.configs.device_config import DeviceConfig
    from sglang.srt.configs.load_config import LoadConfig
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.distributed.parallel_state import init_distributed_environment, initialize_model_parallel
    from sglang.srt.model_loader import get_model

    init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo")
    initialize_model_parallel(backend="gloo")
    device = DeviceConfig("cpu")
    draft_cfg = ModelConfig.from_server_args(server_args, model_path=draft, is_draft_model=True)
    model = get_model(model_config=draft_cfg, load_config=LoadConfig(), device_config=device)
    return model, draft_cfg, ModelConfig.from_server_args(server_args, model_path=target), device
