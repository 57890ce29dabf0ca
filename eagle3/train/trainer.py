"""The draft trainer, shared by every draft method: build from a TrainJob, then a short loop around a one-screen step.
The method (train.method, eagle3/draft/method.py) builds the draft and computes its loss; the loop, the data, the
optimizer, checkpoints, the held-out slice, DDP/FSDP2 and resume are the same for all.

    job  = TrainJob(train=cfg.train, run_dir=..., model_dir=..., out_dir=...)   # written to a file by the task
    with Trainer.build(job, rank=r, world=w, local_rank=l) as t:               # torchrun: eagle3/train/worker.py
        result = t.run(progress=callback)

Outputs under out_dir: metrics.jsonl (one JSON object per logged step), tb/ (TensorBoard events),
checkpoints/ (eagle3/draft/checkpoint.py). A run whose out_dir holds a checkpoint resumes from it: same
weights, AdamW moments, schedule, RNG and data position, so the next step's loss equals an uninterrupted run's.

train.heldout_fraction > 0 keeps a slice of the store out of training (eagle3/draft/heldout.py); every checkpoint
measures it with the same TTT forward and loss as the step (no gradient) and records it in state.json and
metrics.jsonl; train.select = best makes the best of them the trained draft (checkpoints/best.json).

Several processes (torchrun): train.parallel `ddp` wraps the draft in DistributedDataParallel; `fsdp` shards its
trainable weights, gradients and AdamW state with FSDP2 (`shard_draft`). Both average the gradient over the
ranks, so the losses agree; checkpoints hold whole tensors either way.
"""

from __future__ import annotations

import contextlib
import json
import math
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel

from eagle3.config import TrainConfig
from eagle3.device import torch_device
from eagle3.draft.checkpoint import (
    gather_tensors,
    latest_checkpoint,
    load_checkpoint,
    save_checkpoint,
    select_best,
    step_dir,
)
from eagle3.draft.data import BatchStream, DataPosition, PackedBatch, load_index, load_vocab_map, read_row
from eagle3.draft.distill import DraftLoss, labelled_rows, target_distribution
from eagle3.draft.heldout import SPLIT_RULE, HeldoutTally, heldout_rows, split_heldout
from eagle3.draft.layers import AttendFn, FlexAttend, dense_attend
from eagle3.draft.load import load_target_tensors, target_head_keys
from eagle3.draft.method import DraftModule, MethodError
from eagle3.draft.methods import method_named
from eagle3.draft.shape import DraftConfig
from eagle3.draft.warm_start import WarmStart, warm_start
from eagle3.progress import Progress, ProgressFn, no_progress
from eagle3.store.fsio import read_json
from eagle3.store.paths import RunPaths, TrainPaths
from eagle3.store.run_store import RunInfo, RunStore
from eagle3.train.job import TrainJob


class TrainError(RuntimeError):
    """The store, target model or config cannot be trained on; the message names the file or key."""


class NonFiniteLossError(TrainError):
    """The loss or gradient norm became NaN/inf; the message names the step."""


def lr_factor(step: int, warmup: int, total: int, min_ratio: float) -> float:
    """Multiplier of the peak lr before optimizer step `step` (0-based)."""
    if step < warmup:  # 1) linear warm-up from 1/warmup to 1
        return (step + 1) / warmup
    if step >= total:  # 2) past the end: the floor
        return min_ratio
    progress = (step - warmup) / max(1, total - warmup)  # 3) cosine from 1 down to min_ratio
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


#: Train settings a resumed run may change: how long it runs, how it reports, how it reads; anything else
#: (lr, batch, TTT, vocab, seed, ...) would silently mix two trainings in one draft.
RESUMABLE_CHANGES = frozenset(
    {"nproc", "nodes", "node_rank", "rdzv_endpoint", "peer_timeout_s", "work_queues",
     "epochs", "max_steps", "checkpoint_every", "log_every", "keep_checkpoints", "loader_threads",
     "prefetch_batches", "compile", "attention", "target_chunk_tokens", "parallel", "init", "min_new_tokens"}
)  # fmt: skip


def check_resumable(checkpoint: Path, state: dict[str, Any], cfg: TrainConfig) -> None:
    """Refuse to resume a checkpoint (its state.json: `state`) written under different training settings (names
    both values), or, with a held-out slice, under another split rule. A key the checkpoint does not record
    (written before the key existed) ran with the key's default."""
    saved = state.get("config", {})
    now, default = cfg.model_dump(mode="json"), TrainConfig.model_validate({}).model_dump(mode="json")
    was = {k: saved.get(k, default[k]) for k in now}
    changed = {k: (was[k], now[k]) for k in now if k not in RESUMABLE_CHANGES and was[k] != now[k]}
    if changed:
        diff = ", ".join(f"{k} {a!r} -> {b!r}" for k, (a, b) in sorted(changed.items()))
        raise TrainError(
            f"{checkpoint}: written with other train settings ({diff}); resuming would mix two trainings. "
            f"Restore those settings, or move {checkpoint.parent.parent} away to train from scratch"
        )
    if cfg.heldout_fraction > 0 and state.get("heldout_split") != SPLIT_RULE:
        raise TrainError(
            f"{checkpoint}: its held-out slice was chosen sample by sample, before the split kept every answer to "
            f"a prompt on one side ({SPLIT_RULE}); resuming would train on held-out prompts. Move "
            f"{checkpoint.parent.parent} away to train from scratch"
        )


def shard_draft(model: torch.nn.Module, device: torch.device, world: int) -> None:
    """FSDP2 in place: the draft's trainable parameters become DTensors sharded over the `world` ranks (dim 0), and
    so do their gradients and AdamW moments. One FSDP unit, the whole draft: the decoder layer, norm and lm_head
    run once per TTT step, so a unit per submodule would only add all-gathers (or reduce-scatter a gradient
    before its last use). The frozen embedding is left out (ignored_params): it stays whole on every rank, as
    loaded from the target, never gathered or reduced. Parameters stay fp32 (no mp_policy): bf16 autocast does the
    casting, as under DDP. The root keeps its gathered weights from forward through backward, then reshards."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard

    group = dist.group.WORLD
    assert group is not None, "shard_draft needs torch.distributed initialized"
    mesh = DeviceMesh.from_group(group, device.type)  # the default group: no second one to tear down
    frozen = {p for p in model.parameters() if not p.requires_grad}  # the embedding
    fully_shard(model, mesh=mesh, ignored_params=frozen)


@dataclass
class StepOut:
    loss: float
    grad_norm: float
    lr: float
    step_loss: torch.Tensor  # [S]
    step_hits: torch.Tensor  # [S]
    step_labels: torch.Tensor  # [S]
    tokens: int


@dataclass
class TrainResult:
    step: int
    total_steps: int
    out_dir: str
    checkpoint: str | None
    last_metrics: dict[str, Any] = field(default_factory=dict)


class Reporter:
    """Rank 0's side effects in one place: metrics.jsonl, TensorBoard, the progress callback."""

    def __init__(self, out_dir: Path, total: int, start_step: int, progress: ProgressFn):
        from torch.utils.tensorboard import SummaryWriter

        self.path = TrainPaths(out_dir).metrics
        self.tb = SummaryWriter(str(TrainPaths(out_dir).tensorboard_dir))
        self.total, self.start_step, self.progress = total, start_step, progress
        self.t0 = time.monotonic()
        self.tokens = 0

    def log(self, record: dict[str, Any]) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps(record) + "\n")
        step = record["step"]
        for k in ("loss", "lr", "grad_norm", "tokens_per_s", "data_wait_frac"):
            self.tb.add_scalar(f"train/{k}", record[k], step)
        for i, (loss, acc) in enumerate(zip(record["step_loss"], record["step_acc"], strict=True)):
            self.tb.add_scalar(f"ttt_loss/step{i}", loss, step)
            self.tb.add_scalar(f"ttt_acc/step{i}", acc, step)
        self.tb.flush()
        self.progress(
            Progress(
                "train",
                done=step,
                total=self.total,
                tokens=self.tokens,
                elapsed_s=time.monotonic() - self.t0,
                skipped=self.start_step,
            )
        )

    def log_heldout(self, heldout: dict[str, Any]) -> None:
        """One metrics.jsonl line {"step", "heldout": {...}, "time"} (no training keys: readers of the training
        records skip it), and TensorBoard's heldout/* scalars."""
        step = heldout["step"]
        record = {k: v for k, v in heldout.items() if k != "step"}
        with open(self.path, "a") as f:
            f.write(json.dumps({"step": step, "heldout": record, "time": time.time()}) + "\n")
        self.tb.add_scalar("heldout/acceptance_length", record["acceptance_length"], step)
        self.tb.add_scalar("heldout/loss", record["loss"], step)
        for i, acc in enumerate(record["acc"]):
            self.tb.add_scalar(f"heldout_acc/step{i}", acc, step)
        self.tb.flush()

    def close(self) -> None:
        self.tb.close()


class Trainer:
    def __init__(self, job: TrainJob, *, rank: int, world: int, device: torch.device) -> None:
        self.job, self.cfg, self.rank, self.world, self.device = job, job.train, rank, world, device
        self.bf16 = job.train.precision == "bf16" or (job.train.precision == "auto" and device.type == "cuda")
        self.compiled = job.train.compiled(device.type)
        self.out_dir, self.ckpt_dir = Path(job.out_dir), TrainPaths(job.out_dir).checkpoints_dir
        run_dir = Path(job.run_dir)
        info = RunStore(run_dir).require_run_info("train reads the store the extract stage wrote")
        target_cfg = read_json(Path(job.model_dir) / "config.json")
        d2t, t2d = load_vocab_map(run_dir)
        self.method = method_named(self.cfg.method)
        try:
            self.method.check(self.cfg, target_cfg)
            self.aux_layers = self.method.layers(info.aux_layers, info.num_layers, self.cfg.aux_layers)
        except MethodError as e:
            raise TrainError(f"{run_dir}/run.json: {e}") from None
        picked = [info.aux_layers.index(x) for x in self.aux_layers]  # positions in the store's [T, K, H]
        dcfg = DraftConfig.from_target(target_cfg, num_aux=len(self.aux_layers), draft_vocab_size=len(d2t))
        self._check(info, dcfg, t2d)

        self._build_model(target_cfg, dcfg, d2t, t2d)
        self.params = [p for _, p in self.module.named_parameters() if p.requires_grad]
        fused = device.type == "cuda"
        self.optimizer = torch.optim.AdamW(
            self.params, lr=self.cfg.lr, betas=(0.9, 0.95), weight_decay=self.cfg.weight_decay, fused=fused
        )

        c, index = self.cfg, RunPaths(run_dir).index_path
        train, heldout = split_heldout(load_index(run_dir), c.heldout_fraction, index, c.data_fraction)
        self.heldout = heldout_rows(heldout, self.cfg.batch_tokens, self.cfg.heldout_max_tokens) if heldout else []
        self.stream = BatchStream(
            train,
            batch_tokens=self.cfg.batch_tokens,
            seed=self.cfg.seed,
            rank=rank,
            world=world,
            device=device,
            threads=self.cfg.loader_threads,
            prefetch=self.cfg.prefetch_batches,
            layers=picked,
        )
        self.picked = picked
        per_epoch = self.stream.steps_per_epoch(0)
        self.total_steps = self.cfg.max_steps or max(1, math.ceil(self.cfg.epochs * per_epoch))
        c = self.cfg
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda s: lr_factor(s, c.warmup_steps, self.total_steps, c.min_lr_ratio)
        )
        self._resume()
        self.start_step = self.step
        self.flex = FlexAttend() if c.flex(device.type) else None
        self.net: torch.nn.Module = self.module  # what the step calls: the draft (FSDP2: sharded in place) or DDP's
        if world > 1 and not self.fsdp:
            self.net = DistributedDataParallel(
                self.module,
                device_ids=[device.index] if fused else None,
                broadcast_buffers=False,
                gradient_as_bucket_view=True,
            )

    def _build_model(self, target_cfg: dict[str, Any], dcfg: DraftConfig, d2t: torch.Tensor, t2d: torch.Tensor) -> None:
        """The draft (warm-started, compiled, sharded as configured) and the frozen target lm_head beside it."""
        job, device = self.job, self.device
        dtype = torch.bfloat16 if self.bf16 else torch.float32
        target = load_target_tensors(Path(job.model_dir), target_head_keys(target_cfg))
        torch.manual_seed(self.cfg.seed)  # the same initial draft on every rank
        self.module = self.method.build(
            dcfg, target["embedding"].to(dtype), lm_head=target["lm_head"].to(dtype), train=self.cfg
        ).to(device)
        self.model: DraftModule = self.module  # type: ignore[assignment]  # the method's draft is a DraftModule
        self.model.set_vocab_map(d2t.to(device), t2d.to(device))
        self.warm: WarmStart | None = None
        if job.init_from is not None and latest_checkpoint(self.ckpt_dir) is None:  # a resume has its own weights
            self.warm = warm_start(self.model, Path(job.init_from))
        self.lm_head = target["lm_head"].to(device, dtype)  # [V, H], frozen, outside the draft
        if self.compiled:
            self.model.compile_blocks()
        self.fsdp = self.world > 1 and self.cfg.parallel == "fsdp"
        if self.fsdp:  # before the optimizer and the checkpoint: both see the sharded parameters
            shard_draft(self.module, device, self.world)

    def _resume(self) -> None:
        """Step, data position, weights and optimizer state from the latest complete checkpoint, if any."""
        self.step, self.pos = 0, DataPosition(0, 0)
        self.checkpoint: Path | None = latest_checkpoint(self.ckpt_dir)
        if self.checkpoint is not None:
            state = load_checkpoint(self.checkpoint, self.module, self.optimizer, self.scheduler)
            check_resumable(self.checkpoint, state, self.cfg)
            self.step, self.pos = state["step"], DataPosition(**state["data_position"])
            if self.cfg.select == "best" and self.rank == 0:  # a kill between latest.json and best.json
                select_best(self.ckpt_dir)

    def _check(self, info: RunInfo, dcfg: DraftConfig, t2d: torch.Tensor) -> None:
        where = f"{self.job.run_dir}/run.json vs {self.job.model_dir}/config.json"
        if info.hidden_size != dcfg.hidden_size or info.vocab_size != dcfg.vocab_size:
            raise TrainError(
                f"{where}: hidden {info.hidden_size} vs {dcfg.hidden_size}, vocab {info.vocab_size} vs "
                f"{dcfg.vocab_size}: the store was extracted from another model"
            )
        if len(t2d) != dcfg.vocab_size:
            raise TrainError(
                f"{self.job.run_dir}/vocab_map.safetensors: t2d has {len(t2d)} entries, the target "
                f"vocabulary {dcfg.vocab_size}; re-run convert"
            )
        asked = self.cfg.draft_vocab_size  # None: the map's own size
        want = dcfg.draft_vocab_size if asked is None else min(asked, dcfg.vocab_size)
        if dcfg.draft_vocab_size != want:
            raise TrainError(
                f"{self.job.run_dir}/vocab_map.safetensors has {dcfg.draft_vocab_size} draft ids, "
                f"train.draft_vocab_size asks {want}; re-run convert"
            )

    @classmethod
    def build(cls, job: TrainJob, *, rank: int = 0, world: int = 1, local_rank: int = 0) -> Trainer:
        device = torch_device(job.device, index=local_rank)
        if world > 1 and not dist.is_initialized():
            raise TrainError(f"world size {world} but no process group: start through eagle3/train/worker.py")
        return cls(job, rank=rank, world=world, device=device)

    def __enter__(self) -> Trainer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def attend_for(self, doc: torch.Tensor) -> AttendFn:
        return self.flex(doc) if self.flex is not None else dense_attend(doc)

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        return torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.bf16)

    # the step ---------------------------------------------------------------------------------------------------
    def forward_loss(self, net: torch.nn.Module, batch: PackedBatch) -> DraftLoss:
        """Target distribution, then the method's forward through `net` and its loss: the step's and the held-out
        measurement's."""
        c, m = self.cfg, self.model
        rows = labelled_rows(batch.loss_mask, batch.remaining)
        target = target_distribution(batch.last_hidden, self.lm_head, m.d2t, m.t2d, c.target_chunk_tokens, rows)
        if not self.bf16:
            batch = replace(batch, aux_hidden=batch.aux_hidden.float())  # [N, K, H]
        return self.method.loss(net, self.module, batch, target, c, self.attend_for(batch.doc), self.autocast,
                                self.compiled)  # fmt: skip

    def train_step(self, batch: PackedBatch) -> StepOut:
        """One optimizer step on one packed batch: target, TTT forward, loss, backward, clip, AdamW, schedule."""
        c = self.cfg
        out = self.forward_loss(self.net, batch)
        self.optimizer.zero_grad(set_to_none=True)
        out.total.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(self.params, c.grad_clip)  # FSDP2: the global norm, a DTensor
        if isinstance(grad_norm, DTensor):
            grad_norm = grad_norm.full_tensor()
        loss, gn = torch.stack([out.total.detach().float(), grad_norm.float()]).tolist()
        if not (math.isfinite(loss) and math.isfinite(gn)):
            raise NonFiniteLossError(
                f"step {self.step + 1}: loss {loss}, grad norm {gn} (rank {self.rank}); the run stops here. Resume "
                f"restarts from {self.checkpoint or 'scratch'}; lower train.lr or check the store for bad values"
            )
        lr = self.optimizer.param_groups[0]["lr"]
        self.optimizer.step()
        self.scheduler.step()
        return StepOut(
            loss=loss,
            grad_norm=gn,
            lr=lr,
            step_loss=out.step_loss,
            step_hits=out.step_hits,
            step_labels=out.step_labels,
            tokens=batch.num_tokens,
        )

    # the loop ---------------------------------------------------------------------------------------------------
    def run(self, progress: ProgressFn = no_progress, stop_at_step: int | None = None) -> TrainResult:
        """Train to total_steps (or stop after `stop_at_step`, as a kill would, without a final checkpoint)."""
        reporter = Reporter(self.out_dir, self.total_steps, self.step, progress) if self.rank == 0 else None
        window: list[StepOut] = []
        t_window, wait_window = time.perf_counter(), self.stream.wait_s
        last: dict[str, Any] = {}
        try:
            for pos, batch in self.stream.iterate(self.pos):
                if self.step >= self.total_steps or (stop_at_step is not None and self.step >= stop_at_step):
                    break
                window.append(self.train_step(batch))
                self.step, self.pos = self.step + 1, pos
                if self.step % self.cfg.log_every == 0 or self.step == self.total_steps:
                    dt, waited = time.perf_counter() - t_window, self.stream.wait_s - wait_window
                    last = self._aggregate(window, dt, waited)
                    window, t_window, wait_window = [], time.perf_counter(), self.stream.wait_s
                    if reporter is not None:
                        reporter.tokens += last["tokens"]
                        reporter.log(last)
                        if self.compiled and self.step - self.start_step <= self.cfg.log_every:
                            # where a cold start's first minutes went, per compiled function (train.log)
                            print(
                                f"compilation, dynamo's tally:\n{torch._dynamo.utils.compile_times(repr='str')}",
                                flush=True,
                            )
                if self.step % self.cfg.checkpoint_every == 0 or self.step == self.total_steps:
                    self._save(reporter)
        finally:
            if reporter is not None:
                reporter.close()
        return TrainResult(
            self.step, self.total_steps, str(self.out_dir), str(self.checkpoint) if self.checkpoint else None, last
        )

    def _aggregate(self, window: list[StepOut], dt: float, waited: float) -> dict[str, Any]:
        """Metrics of the steps since the last report, summed over ranks (a collective: every rank calls it)."""
        s = len(window)
        vec = torch.cat(
            [
                torch.tensor([sum(w.loss for w in window), sum(w.tokens for w in window)], device=self.device),
                torch.stack([w.step_loss for w in window]).sum(0),
                torch.stack([w.step_hits for w in window]).sum(0),
                torch.stack([w.step_labels for w in window]).sum(0),
            ]
        ).double()
        if self.world > 1:
            dist.all_reduce(vec)
        k = self.method.positions(self.cfg)
        v = vec.tolist()
        n = s * self.world
        hits, labels = v[2 + k : 2 + 2 * k], v[2 + 2 * k :]
        return {
            "step": self.step,
            "total_steps": self.total_steps,
            "start_step": self.start_step,
            "epoch": self.pos.epoch,
            "loss": v[0] / n,
            "step_loss": [x / n for x in v[2 : 2 + k]],
            "step_acc": [h / max(1.0, lab) for h, lab in zip(hits, labels, strict=True)],
            "lr": window[-1].lr,
            "grad_norm": window[-1].grad_norm,
            "tokens": int(v[1]),
            "tokens_per_s": v[1] / dt,
            "step_time_s": dt / s,
            "data_wait_frac": waited / dt,
            "time": time.time(),
        }

    @torch.no_grad()
    def measure_heldout(self) -> dict[str, Any] | None:
        """The held-out record of the current weights (None without held-out samples): every rank measures all the
        held-out rows (bounded by train.heldout_max_tokens) through the undistributed draft, so the ranks agree
        without communication; under FSDP2 each forward all-gathers the weights, a collective all ranks join."""
        if not self.heldout:
            return None
        tally = HeldoutTally(k=min(self.cfg.select_steps, self.method.positions(self.cfg)))
        for row in self.heldout:
            cpu = read_row([s.path for s in row], self.cfg.batch_tokens, layers=self.picked)
            batch = cpu.to(self.device).dequantized()
            tally.add(self.forward_loss(self.module, batch), batch.num_tokens)
        if self.fsdp:
            self.module.reshard()  # type: ignore[operator]  # FSDP2: the root keeps its gathered weights otherwise
        return {"step": self.step, **tally.record()}

    def _save(self, reporter: Reporter | None = None) -> None:
        heldout = self.measure_heldout()
        tensors = None  # FSDP2: the all-gathers are collective, every rank takes part; rank 0 writes
        if self.rank == 0 or self.fsdp:
            tensors = gather_tensors(self.module, self.optimizer, keep=self.rank == 0)
        if self.rank == 0:
            state = {
                "data_position": {"epoch": self.pos.epoch, "rows": self.pos.rows},
                "world": self.world,
                "total_steps": self.total_steps,
                "config": self.cfg.model_dump(mode="json"),
                "method": self.method.name,
                "aux_layers": self.aux_layers,
                "heldout_split": SPLIT_RULE,
            }
            if heldout is not None:
                state["heldout"] = heldout
            self.checkpoint = save_checkpoint(
                self.ckpt_dir,
                self.step,
                self.module,
                self.optimizer,
                self.scheduler,
                state,
                self.cfg.keep_checkpoints,
                tensors,
                self.cfg.select,
            )
            if heldout is not None and reporter is not None:
                reporter.log_heldout(heldout)
        else:
            self.checkpoint = step_dir(self.ckpt_dir, self.step)

    def close(self) -> None:
        self.stream.close()
