"""Run by SGLang's interpreter (.venv-sglang/bin/python): load an exported block draft (DFlash, DSpark) through SGLang
0.5.23's own loader on CPU in draft mode, the way its DFlash worker does, and dump what SGLang made of it.

    python sglang_load_block_draft.py --draft DIR --target DIR --out FILE.safetensors --port P --block-size B \
        [--algorithm DFLASH|DSPARK]

Dumped tensors: every parameter of the draft class SGLang chose ("param.<name>"). Metadata (JSON in the safetensors
header): the class, its block size and context feature count, the dflash config SGLang parsed (block size, mask
token id, target layer ids), the target's resolved layers_to_capture (HF hidden_states indices) for this draft, and
what SGLang answers when asked to serve the algorithm on this CPU.
"""

from __future__ import annotations

import argparse
import json
import os

from safetensors.torch import save_file


class AllowsAlgorithm:
    """The CPU platform, except that it says it supports the speculative algorithm and any draft attention backend
    (seen by speculative_hook only)."""

    def __init__(self, real: object) -> None:
        self._real = real

    def __getattr__(self, name: str) -> object:
        return getattr(self._real, name)

    def is_out_of_tree(self) -> bool:
        return True

    def supports_speculative_algorithm(self, algorithm: str) -> bool:
        return True

    def supports_speculative_draft_attention_backend(self, algorithm: str, backend: str) -> bool:
        return True

    def get_default_speculative_draft_attention_backend(self, algorithm: str) -> str:
        return "torch_native"  # never built here: the loader needs no attention backend


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--draft", required=True)
    p.add_argument("--target", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--port", type=int, required=True, help="gloo rendezvous port")
    p.add_argument("--block-size", type=int, required=True)
    p.add_argument("--algorithm", default="DFLASH")
    args = p.parse_args()
    from sglang_loader import load_draft_and_target  # beside this script, which SGLang's interpreter runs
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(args.port), RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")

    from sglang.srt.configs.load_config import LoadConfig
    from sglang.srt.model_executor.model_runner_components.attention_backend_setup import (
        configure_aux_hidden_state_capture,
    )
    from sglang.srt.model_executor.model_runner_components.spec_aux_hidden_state import (
        resolve_spec_aux_hidden_state_config,
    )
    from sglang.srt.model_loader import get_model
    from sglang.srt.runtime_context import SpawnRanks, publish, reset_context
    from sglang.srt.server_args import ServerArgs
    from sglang.srt.speculative.dflash_utils import parse_dflash_draft_config
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    def make_args() -> ServerArgs:
        return ServerArgs(
            model_path=args.target,
            device="cpu",
            dtype="bfloat16",
            skip_tokenizer_init=True,
            speculative_algorithm=args.algorithm,
            speculative_draft_model_path=args.draft,
            speculative_num_draft_tokens=args.block_size,
        )

    # SGLang refuses to serve DFLASH and DSPARK on a CPU at argument resolution; that refusal is recorded, then
    # passed in the speculative hook only (the platform says it supports DFLASH; DSPARK's checks are skipped), so
    # the loader itself runs as it would
    refusal = None
    reset_context()
    try:
        server_args = make_args()
        publish(server_args, role="test", ranks=SpawnRanks(world_rank=0))
    except ValueError as e:
        refusal = str(e)
        from sglang.srt.arg_groups import speculative_hook

        speculative_hook.current_platform = AllowsAlgorithm(speculative_hook.current_platform)  # DFLASH's check
        speculative_hook._handle_dspark = lambda server_args: None  # DSPARK's: only checks (device, parallelism)
        reset_context()
        server_args = make_args()
        publish(server_args, role="test", ranks=SpawnRanks(world_rank=0))
    # the draft, as the draft worker loads it (is_draft_model=True, the real weights), and the target's config
    draft, draft_cfg, target_cfg, device = load_draft_and_target(server_args, args.draft, args.target)
    tensors = {f"param.{n}": p.detach().clone().contiguous() for n, p in draft.named_parameters()}
    parsed = parse_dflash_draft_config(draft_hf_config=draft_cfg.hf_config)

    # the target: which layers SGLang captures for this draft (dummy weights: only the wiring matters)
    algorithm = SpeculativeAlgorithm.from_string(args.algorithm)
    aux = resolve_spec_aux_hidden_state_config(
        server_args=server_args, model_config=target_cfg, spec_algorithm=algorithm, is_draft_worker=False
    )
    target = get_model(model_config=target_cfg, load_config=LoadConfig(load_format="dummy"), device_config=device)
    configure_aux_hidden_state_capture(
        model=target,
        eagle_use_aux_hidden_state=False,
        eagle_aux_hidden_state_layer_ids=None,
        dflash_use_aux_hidden_state=aux.dflash_use_aux_hidden_state,
        dflash_target_layer_ids=aux.dflash_target_layer_ids,
        is_dspark=aux.is_dspark,
    )
    meta = {
        "class": type(draft).__name__,
        "block_size": int(draft.block_size),
        "num_context_features": int(draft.num_context_features),
        "mask_token_id": parsed.mask_token_id,
        "target_layer_ids": aux.dflash_target_layer_ids,
        "target_layers_to_capture": list(target.model.layers_to_capture),
        "cpu_serving_refusal": refusal,
    }
    save_file(tensors, args.out, metadata={"result": json.dumps(meta)})


if __name__ == "__main__":
    main()
