"""The extraction end's sections: `server` (and its `server.servers` slots), `extract`, `disk`."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from eagle3.config.base import StrictModel


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
    prefix_cache: bool = Field(
        False,
        description="sglang engine: keep SGLang's prefix (radix) cache on, so synthesize's later turns of a "
        "conversation reuse the KV of its earlier ones instead of prefilling the whole conversation again (long "
        "multi-turn data: docs/performance.md). Extraction stays exact on such a server: every extraction request "
        "carries its own cache_salt (its rid), a cache namespace no other request shares, so none of its rows come "
        "from the cache (and the hook and the client refuse a sample if any did). False: --disable-radix-cache.",
    )
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


#: How many aux layers a store may hold: EAGLE-3 reads three, the block drafters SGLang serves five to eight.
MIN_AUX_LAYERS, MAX_AUX_LAYERS = 3, 8


class ExtractConfig(StrictModel):
    """Which hidden states to capture and how requests flow."""

    aux_layers: list[int] | None = Field(
        None,
        description="HF hidden_states indices (0 = embeddings, i = input of decoder layer i), 3 to 8 of them, "
        "increasing: the layers the store holds. None: EAGLE-3's default [2, N//2, N-3]. A draft reads those of "
        "them its method needs (train.aux_layers; a block drafter reads 5 or more), so capture the union of the "
        "methods you will train (docs/methods.md). Bytes per token grow with the count (docs/formats.md).",
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

    @model_validator(mode="after")
    def _aux_layers_shape(self) -> ExtractConfig:
        layers = self.aux_layers
        if layers is None:
            return self
        if not MIN_AUX_LAYERS <= len(layers) <= MAX_AUX_LAYERS:
            raise ValueError(
                f"extract.aux_layers {layers}: {len(layers)} layers; a store holds {MIN_AUX_LAYERS} to "
                f"{MAX_AUX_LAYERS} (EAGLE-3 reads 3, a block drafter 5 to 8). Give that many HF hidden_states indices"
            )
        if len(set(layers)) != len(layers) or sorted(layers) != layers:
            raise ValueError(
                f"extract.aux_layers {layers}: give each layer once, in increasing order (e.g. {sorted(set(layers))})"
            )
        return self


class DiskConfig(StrictModel):
    """Free-space guard for the store and the dump directory."""

    # 2%, not 10%: on a large shared filesystem a tenth of its size can exceed all that is free (CI: 21 GB free of
    # 271 GB refused a 1.3 MB run), and the floor below already keeps a small disk usable.
    reserve_fraction: float = Field(0.02, ge=0.0, lt=1.0, description="Keep this share of the filesystem free.")
    reserve_min_gb: float = Field(5.0, ge=0.0, description="...and at least this many GB.")
    budget_gb: float | None = Field(None, gt=0, description="Cap the store at this size (None: no cap).")
