"""The `train` section."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from eagle3.config.base import OnOff, StrictModel

#: The draft vocabulary convert builds when train.draft_vocab_size is not set (EAGLE-3's published drafts' size).
DEFAULT_DRAFT_VOCAB = 32000

#: The draft methods (eagle3/draft/methods.py has one row per name; a unit test keeps the two equal).
DraftMethodName = Literal["eagle3", "eagle3.1", "dflash", "dspark"]


class TrainConfig(StrictModel):
    """Draft training."""

    method: DraftMethodName = Field(
        "eagle3",
        description="The draft: eagle3, eagle3.1, dflash or dspark (docs/methods.md), each in its own directory.",
    )
    methods: list[DraftMethodName] = Field(
        default_factory=list,
        description="Several draft methods trained from the same store, one after another, each into its own "
        "directory, exported and evaluated on the same sets; the `methods` artifact puts them side by side and "
        "draft/current moves to the winner's draft (by modelled speed-up) when it passes evaluate.promote's gate. "
        "Empty: `method` alone.",
    )
    aux_layers: list[int] | None = Field(
        None,
        description="Which of the store's aux layers (HF hidden_states indices, run.json) the draft reads. None: the "
        "method's own (EAGLE-3: a 3-layer store's three, else [2, N//2, N-3]). A store that lacks them is refused "
        "before training, naming the layers and the extraction that adds them.",
    )
    nproc: int = Field(1, gt=0, le=1024, description="torchrun processes per node.")
    # several nodes (eagle3/train/launch.py torchrun_command, the train-fanout flow; docs/multinode.md) ----------
    nodes: int = Field(
        1, gt=0, le=1024,
        description="Nodes that train together: torchrun on each with `--nnodes nodes` and a c10d rendezvous; "
        "nodes * nproc processes share the global batch. Every node reads the store and writes checkpoints on the "
        "same shared filesystem path. 1: one node (`torchrun --standalone`).",
    )  # fmt: skip
    node_rank: int = Field(
        0, ge=0,
        description="This node's rank (0..nodes-1). Node 0 hosts the rendezvous store; the train-fanout flow sets "
        "it per child.",
    )  # fmt: skip
    rdzv_endpoint: str | None = Field(
        None,
        description="With nodes > 1: the c10d rendezvous, `host:port` (node 0's address, reachable from every "
        "node), or `host` alone (node 0 picks a free port and publishes it in the training directory). None: node "
        "0's hostname and a free port.",
    )
    work_queues: list[str] = Field(
        default_factory=list,
        description="With nodes > 1, from a flow (the pipeline's train stage, the train-fanout deployment): node i's "
        "flow run goes to work queue i of the `train-node` deployment's pool (start each node's worker with "
        "`--work-queue <its queue>`; it holds train.nproc slots of the limit `gpu-<its queue>`). Empty: every node's "
        "run goes to the deployment's own queue, wherever a worker takes it.",
    )
    peer_timeout_s: float = Field(
        600.0, gt=0,
        description="How long a process waits in a collective (gradient all-reduce, barrier) for a peer before it "
        "fails (process-group timeout; NCCL async error handling on): a lost node ends the others within this. "
        "A dead peer whose sockets close (a killed process) ends them at once.",
    )  # fmt: skip
    device: Literal["auto", "cpu", "cuda"] = Field(
        "auto", description="Where the draft trains: `cuda` puts each process on its local rank's GPU. `auto` = cuda "
        "when available.",
    )  # fmt: skip
    epochs: float = Field(1.0, gt=0, description="Passes over the store.")
    max_steps: int | None = Field(None, gt=0, description="Stop after this many optimizer steps.")
    batch_tokens: int = Field(4096, gt=0, description="Tokens per micro-batch per process.")
    lr: float = Field(1e-4, gt=0, description="Peak AdamW learning rate.")
    warmup_steps: int = Field(20, ge=0, description="Linear warm-up steps.")
    grad_clip: float = Field(0.5, gt=0, description="Max global grad norm.")
    ttt_steps: int = Field(7, gt=0, le=16, description="Training-time-test unroll length.")
    # block drafters (dflash; eagle3/draft/dflash/) ---------------------------------------------------------------
    block_size: int = Field(
        16, ge=2, le=64,
        description="Block drafters: tokens per draft block, the anchor (the last verified token) and block_size - 1 "
        "masked positions drafted in one forward (SGLang's dflash_config.block_size, --speculative-num-draft-tokens).",
    )  # fmt: skip
    mask_token_id: int | None = Field(
        None, ge=0,
        description="Block drafters: the target token id whose (frozen) embedding fills the masked positions "
        "(dflash_config.mask_token_id). None: the target's last vocabulary id. Pick one whose embedding row is not "
        "all zeros: every masked position would then start from the same zero vector.",
    )  # fmt: skip
    markov_rank: int = Field(
        256, ge=1, le=4096,
        description="DSpark: the rank of its Markov head (markov_w1 [V, r], markov_w2 [V, r]: 2 x V x r weights).",
    )  # fmt: skip
    markov_head: Literal["vanilla", "gated", "rnn"] = Field(
        "vanilla",
        description="DSpark: its Markov head, as SGLang's markov_head_type. `vanilla`: the previous token's low-rank "
        "code. `gated`: the code gated by the drafting row. `rnn`: a gated recurrent state along the block.",
    )  # fmt: skip
    ttt_decay: float = Field(0.8, gt=0, le=1.0, description="Loss weight of step i is decay**i.")
    draft_vocab_size: int | None = Field(
        None, gt=0,
        description="Draft vocabulary. Empty: the store's map (32,000 where convert builds it).",
    )  # fmt: skip
    checkpoint_every: int = Field(200, gt=0, description="Steps between atomic checkpoints.")
    log_every: int = Field(10, gt=0, description="Steps between metric reports.")
    seed: int = Field(0, description="Data order and init seed.")
    # added with the trainer (eagle3/train/trainer.py) ---------------------------------------------------
    precision: Literal["auto", "bf16", "fp32"] = Field(
        "auto",
        description="`bf16`: bf16 autocast over fp32 master weights. `fp32`: no autocast. "
        "`auto`: bf16 on CUDA, fp32 on CPU (where bf16 matmuls are slow).",
    )
    min_lr_ratio: float = Field(0.0, ge=0.0, le=1.0, description="Cosine decay ends at lr * min_lr_ratio.")
    weight_decay: float = Field(0.0, ge=0.0, le=1.0, description="AdamW decoupled weight decay.")
    target_chunk_tokens: int = Field(
        2048, gt=0, le=1_048_576,
        description="Tokens per chunk when computing the target distribution over the full target vocabulary "
        "(bounds the [chunk, target vocab] logits held at once).",
    )  # fmt: skip
    attention: Literal["auto", "flex", "dense"] = Field(
        "auto", description="`flex`: compiled FlexAttention (CUDA). `dense`: explicit masked scores (CPU, tests). "
        "`auto`: flex on CUDA, dense elsewhere.",
    )  # fmt: skip
    compile: OnOff = Field(
        "auto",
        description="torch.compile the draft's per-token blocks and the fused loss. `auto`: on CUDA (an 8B-shaped "
        "draft steps 1.18x faster after a few minutes of compilation, docs/performance.md), off elsewhere. "
        "true/false read as on/off.",
    )

    def compiled(self, device_type: str) -> bool:
        """Whether training on `device_type` ("cuda", "cpu") compiles: the one place `compile: auto` resolves."""
        return self.compile == "on" or (self.compile == "auto" and device_type == "cuda")

    def flex(self, device_type: str) -> bool:
        """Whether attention on `device_type` goes through FlexAttention: the one place `attention: auto` resolves."""
        return self.attention == "flex" or (self.attention == "auto" and device_type == "cuda")

    loader_threads: int = Field(4, gt=0, le=64, description="Threads that read and pack batches.")
    prefetch_batches: int = Field(4, gt=0, le=64, description="Batches read ahead of the step.")
    keep_checkpoints: int = Field(2, gt=0, le=1000, description="Newest checkpoints kept on disk.")
    init: Literal["fresh", "previous"] = Field(
        "fresh",
        description="How a new training of a grown store starts. `fresh`: a new draft. `previous`: the store's "
        "promoted draft (`<run_dir>/draft/current`), its lm_head rows matched by target token id; either way the "
        "training runs its own schedule (warm-up, cosine) from step 0. No promoted draft yet: fresh.",
    )
    min_new_tokens: int = Field(
        0,
        ge=0,
        description="Train again on a grown store only when at least this many new tokens were extracted since the "
        "last finished training (0: on any growth). Fewer: train, export, evaluate and promotion are skipped and "
        "the run says so.",
    )
    parallel: Literal["ddp", "fsdp"] = Field(
        "ddp",
        description="With nproc > 1: `ddp`: DistributedDataParallel, every process holds the whole draft, its "
        "gradients and AdamW state. `fsdp`: FSDP2 (torch.distributed.fsdp.fully_shard) shards parameters, "
        "gradients and AdamW state across the processes (the frozen embedding stays whole on each); for drafts "
        "whose optimizer state does not fit one GPU. The same math and the same checkpoints: a run may switch "
        "on resume.",
    )
    # best-checkpoint selection (eagle3/draft/heldout.py, eagle3/draft/checkpoint.py) -------------------------
    heldout_fraction: float = Field(
        0.0, ge=0.0, lt=1.0,
        description="Fraction of the store's samples kept out of training and measured at every checkpoint "
        "(per-TTT-step accuracy, teacher-forced acceptance length). A sample is held out by a hash of its sample id, "
        "so the split never changes on resume, across processes, or when the store grows. 0: off.",
    )  # fmt: skip
    heldout_max_tokens: int = Field(
        65536, gt=0, description="At most this many held-out tokens are measured per checkpoint (the first held-out "
        "samples in index order).",
    )  # fmt: skip
    select_steps: int = Field(
        3, gt=0, le=16, description="Chain length k of the held-out acceptance length (capped at ttt_steps)."
    )
    data_fraction: float = Field(
        1.0, gt=0.0, le=1.0,
        description="Train on this fraction of the (not held-out) samples, chosen by the same sample-id hash: a "
        "smaller fraction's samples are a subset of a larger one's (data-size curves on one store). 1: all.",
    )  # fmt: skip
    select: Literal["last", "best"] = Field(
        "last",
        description="Which checkpoint is the trained draft (export, evaluate, promotion). `last`: the latest. "
        "`best`: the one with the highest held-out acceptance length (checkpoints/best.json, never pruned); needs "
        "heldout_fraction > 0.",
    )

    def convert_vocab_size(self) -> int:
        """The draft vocabulary convert builds: draft_vocab_size, else DEFAULT_DRAFT_VOCAB."""
        return self.draft_vocab_size or DEFAULT_DRAFT_VOCAB

    def trained_methods(self) -> list[str]:
        """The methods a run trains: `methods`, else `method` alone."""
        return list(self.methods) or [self.method]

    @model_validator(mode="after")
    def _methods_once(self) -> TrainConfig:
        if len(set(self.methods)) != len(self.methods):
            raise ValueError(f"train.methods {self.methods} names a method twice; give each method once")
        return self

    @model_validator(mode="after")
    def _node_rank_in_range(self) -> TrainConfig:
        if self.node_rank >= self.nodes:
            raise ValueError(f"train.node_rank {self.node_rank} is not below train.nodes {self.nodes}")
        if self.work_queues and len(self.work_queues) != self.nodes:
            raise ValueError(
                f"train.work_queues names {len(self.work_queues)} queues for train.nodes {self.nodes}: one per node"
            )
        return self

    @model_validator(mode="after")
    def _best_needs_heldout(self) -> TrainConfig:
        if self.select == "best" and self.heldout_fraction == 0.0:
            raise ValueError("train.select: best needs held-out samples: set train.heldout_fraction (e.g. 0.02)")
        return self
