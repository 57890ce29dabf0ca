"""Run by SGLang's interpreter (.venv-sglang/bin/python): load an exported draft through SGLang 0.5.23's own
loader on CPU, the way its EAGLE worker does, and dump what SGLang made of it for the test to compare.

    python sglang_load_draft.py --draft DIR --target DIR --out FILE.safetensors --port P

Dumped tensors: every parameter of SGLang's LlamaForCausalLMEagle3 ("param.<name>"), its hot_token_id, and
the draft's rotary embedding applied to a seeded q/k ("rope.*"). Metadata (JSON in the safetensors header):
the class SGLang chose, the layer ids it read from the draft's config.json, the target's resolved
layers_to_capture (HF hidden_states indices), and what SGLang says when asked for an EAGLE3 draft attention
backend on this machine (why EAGLE3 cannot be served on a CPU without AMX, docs/sglang.md).
"""

from __future__ import annotations

import argparse
import json
import os
from types import SimpleNamespace

import torch
from safetensors.torch import save_file


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--draft", required=True)
    p.add_argument("--target", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--port", type=int, required=True, help="gloo rendezvous port")
    p.add_argument("--inputs", help="safetensors with input_ids [T] and aux [T, K*H]: run the draft's step 0 on them")
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
    from sglang.srt.speculative.draft_utils import DraftBackendFactory
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    server_args = ServerArgs(
        model_path=args.target,
        device="cpu",
        dtype="bfloat16",
        skip_tokenizer_init=True,
        speculative_algorithm="EAGLE3",
        speculative_draft_model_path=args.draft,
        speculative_num_steps=3,
        speculative_eagle_topk=1,
        speculative_num_draft_tokens=4,
    )
    reset_context()
    publish(server_args, role="test", ranks=SpawnRanks(world_rank=0))
    # the draft, as the draft worker loads it (is_draft_model=True, the real weights), and the target's config
    draft, draft_cfg, target_cfg, device = load_draft_and_target(server_args, args.draft, args.target)
    tensors = {f"param.{n}": p.detach().clone() for n, p in draft.named_parameters()}
    if draft.hot_token_id is not None:
        tensors["hot_token_id"] = draft.hot_token_id.clone()

    # the draft's RoPE on a seeded q/k (positions 0..63)
    attn = draft.model.layers[0].self_attn
    g = torch.Generator().manual_seed(0)
    positions = torch.arange(64)
    q = torch.randn(64, attn.q_size, generator=g)
    k = torch.randn(64, attn.kv_size, generator=g)
    q_rot, k_rot = attn.rotary_emb(positions, q.clone(), k.clone())
    tensors.update(
        {"rope.q": q, "rope.k": k, "rope.q_rot": q_rot.reshape(q.shape), "rope.k_rot": k_rot.reshape(k.shape)}
    )

    if args.inputs:
        tensors.update(draft_step0(draft, args.target, args.inputs))

    # the target: which layers SGLang captures for this draft (dummy weights: only the wiring matters)
    aux = resolve_spec_aux_hidden_state_config(
        server_args=server_args,
        model_config=target_cfg,
        spec_algorithm=SpeculativeAlgorithm.EAGLE3,
        is_draft_worker=False,
    )
    target = get_model(model_config=target_cfg, load_config=LoadConfig(load_format="dummy"), device_config=device)
    configure_aux_hidden_state_capture(
        model=target,
        eagle_use_aux_hidden_state=aux.eagle_use_aux_hidden_state,
        eagle_aux_hidden_state_layer_ids=aux.eagle_aux_hidden_state_layer_ids,
        dflash_use_aux_hidden_state=False,
        dflash_target_layer_ids=None,
        is_dspark=False,
    )

    # what SGLang answers when the EAGLE worker asks for its draft attention backends here
    runner = SimpleNamespace(draft_attention_backend=None, model_config=draft_cfg)
    backend_errors = {}
    factory = DraftBackendFactory(runner, topk=1, speculative_num_steps=3)
    makers = {"decode": factory.create_decode_backend, "draft_extend": factory.create_draft_extend_backend}
    for name, make in makers.items():
        try:
            make()
            backend_errors[name] = None
        except Exception as e:
            backend_errors[name] = f"{type(e).__name__}: {e}"

    meta = {
        "class": type(draft).__name__,
        "draft_layer_ids": aux.eagle_aux_hidden_state_layer_ids,
        "target_layers_to_capture": list(target.model.layers_to_capture),
        "rope_theta": float(getattr(attn.rotary_emb, "base", float("nan"))),
        "backend_errors": backend_errors,
    }
    save_file({k: v.contiguous() for k, v in tensors.items()}, args.out, metadata={"result": json.dumps(meta)})


class CausalSDPA:
    """Stands in for SGLang's attention backend (its EAGLE3-capable ones need CUDA or AMX): causal attention
    over one sequence, GQA, the layer's own scaling. Everything around it is SGLang's model code."""

    def forward(self, q, k, v, layer, forward_batch, save_kv_cache=True, **kwargs):
        t = q.shape[0]
        qh = q.view(t, layer.tp_q_head_num, layer.qk_head_dim).transpose(0, 1)
        kh = k.view(t, layer.tp_k_head_num, layer.qk_head_dim).transpose(0, 1)
        vh = v.view(t, layer.tp_v_head_num, layer.v_head_dim).transpose(0, 1)
        out = torch.nn.functional.scaled_dot_product_attention(
            qh, kh, vh, is_causal=True, scale=layer.scaling, enable_gqa=True
        )
        return out.transpose(0, 1).reshape(t, -1)


def draft_step0(draft, target_dir: str, inputs_path: str) -> dict[str, torch.Tensor]:
    """SGLang's draft forward in extend mode (the draft-extend pass after a prefill) on given ids and aux
    states, with the target's embedding shared in as the EAGLE worker does (set_embed)."""
    from pathlib import Path

    from safetensors import safe_open
    from safetensors.torch import load_file
    from sglang.srt.model_executor.forward_batch_info import ForwardMode
    from sglang.srt.model_executor.forward_context import ForwardContext, forward_context

    inputs = load_file(inputs_path)
    for f in sorted(Path(target_dir).glob("*.safetensors")):
        with safe_open(str(f), "pt") as st:
            if "model.embed_tokens.weight" in st.keys():  # noqa: SIM118 - safe_open has no __contains__
                embed = st.get_tensor("model.embed_tokens.weight")
    draft.set_embed(torch.nn.Parameter(embed.to(torch.bfloat16), requires_grad=False))
    ids = inputs["input_ids"]
    batch = SimpleNamespace(
        forward_mode=ForwardMode.EXTEND,
        spec_info=SimpleNamespace(hidden_states=inputs["aux"].to(torch.bfloat16)),
        mm_input_embeds=None,
        contains_mm_inputs=lambda: False,
        global_num_token_non_padded_cpu=None,
        mha_return_lse=False,
    )
    with torch.no_grad(), forward_context(ForwardContext(attn_backend=CausalSDPA())):
        normed, (prenorm,) = draft.model(ids, torch.arange(len(ids)), batch)
        logits = normed @ draft.lm_head.weight.T  # what the logits processor computes over the draft vocab
    return {"step0.logits": logits.float(), "step0.hidden": prenorm.float()}


if __name__ == "__main__":
    main()
