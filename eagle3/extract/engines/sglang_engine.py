"""The `sglang` engine: a real SGLang server with the server_patch hook, driven per sample over HTTP.

For each sample (at most `extract.window` in flight; 1 = the case study's synchronous loop):

  1. write `<dump_dir>/<rid>.req.json` (sample id, layers, loss mask, store dtype: /generate cannot carry them),
  2. POST /generate {input_ids, rid, cache_salt: rid, sampling_params: {max_new_tokens: 0}} (prefill only; the
     salt keeps the request out of every other request's prefix-cache namespace, server.prefix_cache),
  3. check meta_info: prompt_tokens == len(input_ids), cached_tokens == 0 (a cached prefix is never
     computed, so never captured),
  4. wait for `<rid>.safetensors` (or the hook's `<rid>.error.json`), check its header, token ids and
     loss mask, and yield Dumped(sample, path); eagle3/extract/shard.py verifies it fully and moves it into
     the store. Problems become Failed(sample, reason) after `extract.request_retries` retries with backoff.

Dumps are keyed by rid = "e3-<run id>-<sample id>", so a window > 1 cannot mix samples up. A dead
server is restarted (at most server.max_restarts times, eagle3/serving/server.py) and the sample retried.

Every attempt at a sample has its own rid (a resend is "e3-<run id>.<attempt>-<sample id>",
dump_protocol.make_rid). A timed-out request is aborted, but the server may still finish it (a hung
scheduler resumes, the abort arrives after the forward): its late dump or error file then lands under the
abandoned rid, so it is never adopted in place of the resend's dump, never adopted twice, and SGLang never
refuses the resend as a duplicate in-flight rid. The files of abandoned rids are deleted when the attempt is
given up, again when `extract` returns, and finally in `close` after the server stopped (nothing can arrive
later from a launched server; an attached one could still write one after that).
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import logging
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import httpx
import torch
from safetensors import safe_open

from eagle3.config import PipelineConfig
from eagle3.extract.engines.base import Dumped, EngineInfo, Failed, Outcome
from eagle3.serving.layers import extraction_layers
from eagle3.serving.server import LineFn, ServerError, SGLangServer
from eagle3.store import dump_protocol as proto
from eagle3.store.fsio import remove_stale_temps
from eagle3.store.paths import RunPaths, dump_root
from eagle3.store.run_store import DTYPES, PreparedSample
from eagle3.store.sample_format import FP8, FP8_NAME, SampleFormatError, check_header
from eagle3.target.files import read_model_facts

log = logging.getLogger("eagle3.sglang")
LIVENESS_EVERY_S = 1.0  # while waiting for a dump, how often to check that a launched server still runs


class _Retry(Exception):
    """A transient problem (HTTP error, timeout, dead server): send the sample again."""


def build_sglang_engine(
    cfg: PipelineConfig,
    model_dir: Path,
    base_env: Mapping[str, str],
    on_line: LineFn | None = None,
    *,
    dump_dir: Path | None = None,
    log_dir: Path | None = None,
) -> SGLangEngine:
    """The engine for `server.engine: sglang`, owning the server it launches (or attaches to): dumps under
    `dump_dir` (default `store.paths.dump_root`: extract.dump_dir, else <run_dir>/dump, the store's filesystem, so
    moving a dump in is a rename), the server log under `log_dir` (default <run_dir>/server/). `base_env`: the
    environment a launched server starts from (the caller's: a task or the CLI reads os.environ, never this module)."""
    run_dir = Path(cfg.run_dir)
    if on_line is None:  # the server log, line by line, to a logger a Prefect task can forward
        on_line = logging.getLogger("eagle3.sglang").info
    return SGLangEngine(
        cfg,
        model_dir,
        proto.run_id_of(run_dir),
        dump_dir or dump_root(run_dir, cfg.extract.dump_dir),
        base_env=base_env,
        on_line=on_line,
        log_dir=log_dir,
    )


class SGLangEngine:
    def __init__(
        self,
        cfg: PipelineConfig,
        model_dir: Path,
        run_id: str,
        dump_dir: Path,
        *,
        base_env: Mapping[str, str] | None = None,
        on_line: LineFn | None = None,
        server: SGLangServer | None = None,
        log_dir: Path | None = None,
        dump_timeout_s: float = 120.0,
    ):
        facts = read_model_facts(Path(model_dir))
        self.layers = extraction_layers(Path(model_dir), cfg.extract)
        self.cfg = cfg
        self.run_id = run_id
        self.dump_dir = Path(dump_dir)
        self.hidden_size = facts.hidden_size
        self.store_dtype = cfg.extract.store_dtype
        self.dtype = FP8 if self.store_dtype == FP8_NAME else DTYPES[cfg.server.dtype]  # of the dumped states
        self.dump_timeout_s = dump_timeout_s
        self.info = EngineInfo(
            name="sglang",
            version=proto.SUPPORTED_SGLANG[0],  # the hook refuses any other; checked again against /server_info
            aux_layers=list(self.layers.aux_layers),
            engine_layer_ids=self.layers.layer_ids,
            engine_layer_convention=self.layers.convention,
        )
        self._owns_server = server is None  # a server passed in (tests, bench) is the caller's to stop
        if server is None and base_env is None:
            raise ValueError(
                "SGLangEngine launches its own server here: pass base_env, the environment to launch it with (the "
                "task or CLI passes its os.environ), or pass the server to use"
            )
        self.server = server or SGLangServer(
            cfg.server,
            Path(model_dir),
            dump_dir=self.dump_dir,
            layers=self.layers,
            log_dir=log_dir or RunPaths(cfg.run_dir).server_log_dir,
            base_env=base_env or {},
            on_line=on_line,
        )
        self._started = False
        self._restart_lock = threading.Lock()
        self._generation = 0  # bumped by every restart, so concurrent failures restart once
        self._http: httpx.Client | None = None
        self.resent = 0  # attempts sent again after a timeout, an HTTP error or a dead server
        self._abandoned: set[str] = set()  # rids given up on: late files may still arrive under them
        self._lock = threading.Lock()  # resent, _abandoned (window > 1 runs _one in threads)

    # Engine protocol ------------------------------------------------------------------------
    def extract(self, samples: Sequence[PreparedSample]) -> Iterator[Outcome]:
        if not samples:
            return
        self._ensure_started()
        for s in samples:  # leftovers of a killed earlier process, any attempt
            for attempt in range(self.cfg.extract.request_retries + 1):
                self._clean(self.rid(s, attempt))
        try:
            yield from self._extract(samples)
        finally:
            self._sweep()

    def _extract(self, samples: Sequence[PreparedSample]) -> Iterator[Outcome]:
        window = max(1, self.cfg.extract.window)
        if window == 1:
            for s in samples:
                yield self._one(s)
            return
        with cf.ThreadPoolExecutor(window, thread_name_prefix="eagle3-sglang") as pool:
            pending = iter(samples)
            running = {pool.submit(self._one, s) for s in _take(pending, window)}
            while running:
                done, running = cf.wait(running, return_when=cf.FIRST_COMPLETED)
                for fut in done:
                    yield fut.result()
                running |= {pool.submit(self._one, s) for s in _take(pending, len(done))}

    def close(self) -> None:
        if self._http is not None:
            self._http.close()
            self._http = None
        if self._owns_server:
            self.server.stop()
        self._started = False
        self._sweep()  # after stop: a launched server cannot write a late file any more
        if self._owns_server:
            with self._lock:
                self._abandoned.clear()
        remove_stale_temps(self.dump_dir)

    # one sample -----------------------------------------------------------------------------
    def rid(self, sample: PreparedSample, attempt: int = 0) -> str:
        return proto.make_rid(self.run_id, sample.sample_id, attempt)

    def _one(self, sample: PreparedSample) -> Outcome:
        retries = self.cfg.extract.request_retries
        last = "not attempted"
        for attempt in range(retries + 1):
            rid = self.rid(sample, attempt)
            if attempt:
                delay = min(30.0, 2.0 ** (attempt - 1))
                with self._lock:
                    self.resent += 1
                log.warning(
                    "sample %s: %s; sending it again in %.0f s as rid %s (attempt %d of %d, extract.request_retries)",
                    sample.sample_id, last, delay, rid, attempt + 1, retries + 1,
                )  # fmt: skip
                time.sleep(delay)
            generation = self._generation
            try:
                outcome = self._attempt(sample, rid)
            except _Retry as e:
                last = str(e)
                self._abandon(rid)
                try:
                    self._recover(generation, last)
                except ServerError as fatal:
                    return Failed(sample, f"rid {rid}: {last}; server not recoverable: {fatal}")
                continue
            if not isinstance(outcome, Dumped):
                self._abandon(rid)  # the server may still write a dump for it
            return outcome
        return Failed(
            sample,
            f"rid {self.rid(sample, retries)}: gave up after {retries + 1} attempts (extract.request_retries); "
            f"last: {last}",
        )

    def _attempt(self, sample: PreparedSample, rid: str) -> Outcome:
        n = len(sample.input_ids)
        proto.write_request(
            self.dump_dir,
            proto.RequestInfo(rid, sample.sample_id, n, self.info.aux_layers, list(sample.loss_mask), self.store_dtype),
        )
        # cache_salt: a prefix-cache namespace of this attempt alone, so a server with the cache on computes every
        # row of it (server.prefix_cache); a server without one ignores it
        body = {"input_ids": list(sample.input_ids), "rid": rid, "cache_salt": rid,
                "sampling_params": {"max_new_tokens": 0}}  # fmt: skip
        try:
            r = self._client().post(
                f"{self.server.url}/generate", json=body, timeout=self.cfg.extract.request_timeout_s
            )
        except httpx.TimeoutException:
            self._abort(rid)
            raise _Retry(
                f"no answer within {self.cfg.extract.request_timeout_s:.0f}s (extract.request_timeout_s)"
            ) from None
        except httpx.HTTPError as e:
            raise _Retry(f"/generate failed: {type(e).__name__}: {e}") from None
        if r.status_code >= 500:
            raise _Retry(f"/generate answered {r.status_code}: {r.text[:300]}")
        if r.status_code != 200:
            self._clean(rid)
            return Failed(sample, f"rid {rid}: /generate answered {r.status_code}: {r.text[:300]}")
        meta = r.json().get("meta_info", {})
        if meta.get("prompt_tokens") != n:
            self._clean(rid)
            return Failed(sample, f"rid {rid}: server saw {meta.get('prompt_tokens')} prompt tokens, sent {n}")
        if meta.get("cached_tokens", 0) != 0:
            reason = self._wait_error(rid, 10.0) or "no error file from the hook"
            self._clean(rid)
            return Failed(
                sample,
                f"rid {rid}: {meta['cached_tokens']} of {n} tokens came from SGLang's prefix cache and were never "
                f"computed; launch with --disable-radix-cache (hook: {reason})",
            )
        return self._collect(sample, rid)

    def _collect(self, sample: PreparedSample, rid: str) -> Outcome:
        path = proto.dump_path(self.dump_dir, rid)
        deadline = time.monotonic() + self.dump_timeout_s
        next_liveness = time.monotonic() + LIVENESS_EVERY_S
        delay = 0.005
        while not path.exists():
            reason = proto.read_error(self.dump_dir, rid)
            if reason is not None:
                self._clean(rid)
                return Failed(sample, f"rid {rid}: the hook could not dump it: {reason}")
            now = time.monotonic()
            if now > next_liveness and not self.server.attached:  # (an attached server's check is a request)
                next_liveness = now + LIVENESS_EVERY_S
                if not self.server.is_alive() and not path.exists():
                    raise _Retry("the server died before the dump was written")
            if now > deadline:
                if not self.server.is_alive():
                    raise _Retry("the server died before the dump was written")
                self._clean(rid)
                return Failed(
                    sample,
                    f"rid {rid}: answered, but no dump in {self.dump_dir} within {self.dump_timeout_s:.0f}s "
                    f"(is the hook writing there? see {self.server.log_path})",
                )
            time.sleep(delay)
            delay = min(0.2, delay * 2)
        proto.request_path(self.dump_dir, rid).unlink(missing_ok=True)
        try:
            self._check_dump(path, sample)
        except SampleFormatError as e:
            self._clean(rid)
            return Failed(sample, f"rid {rid}: dump rejected: {e}")
        return Dumped(sample, path)

    def _check_dump(self, path: Path, sample: PreparedSample) -> None:
        n = len(sample.input_ids)
        check_header(
            path, num_tokens=n, num_aux=len(self.info.aux_layers), hidden_size=self.hidden_size, dtype=self.dtype
        )
        with safe_open(str(path), framework="pt") as f:
            ids = f.get_tensor("input_ids")
            mask = f.get_tensor("loss_mask")
            layers = (f.metadata() or {}).get("aux_layers")
        if not torch.equal(ids, torch.tensor(sample.input_ids, dtype=torch.int64)):
            raise SampleFormatError(f"{path}: token ids differ from the prepared sample {sample.sample_id}")
        if not torch.equal(mask, torch.tensor(sample.loss_mask, dtype=torch.uint8)):
            raise SampleFormatError(f"{path}: loss mask differs from the prepared sample {sample.sample_id}")
        if layers != ",".join(map(str, self.info.aux_layers)):
            raise SampleFormatError(f"{path}: aux_layers {layers!r}, the run captures {self.info.aux_layers}")

    # server ---------------------------------------------------------------------------------
    def _ensure_started(self) -> None:
        if not self._started:
            self.dump_dir.mkdir(parents=True, exist_ok=True)
            self.server.start()
            self._started = True

    def _recover(self, generation: int, reason: str) -> None:
        with self._restart_lock:
            if generation != self._generation or self.server.is_alive():
                return  # another thread restarted it, or it is fine and the error was per request
            self.server.restart(reason)
            self._generation += 1

    def _client(self) -> httpx.Client:
        if self._http is None:
            self._http = httpx.Client(limits=httpx.Limits(max_connections=max(4, self.cfg.extract.window * 2)))
        return self._http

    def _abort(self, rid: str) -> None:
        """Best effort: a timed-out request would otherwise block its rid (duplicate in-flight rids are refused)."""
        with contextlib.suppress(httpx.HTTPError):
            self._client().post(f"{self.server.url}/abort_request", json={"rid": rid}, timeout=10.0)

    def _wait_error(self, rid: str, timeout_s: float) -> str | None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            reason = proto.read_error(self.dump_dir, rid)
            if reason is not None:
                return reason
            time.sleep(0.05)
        return None

    def _clean(self, rid: str) -> None:
        for p in (proto.dump_path, proto.error_path, proto.request_path):
            p(self.dump_dir, rid).unlink(missing_ok=True)

    def _abandon(self, rid: str) -> None:
        """Give up on one attempt: delete its files now, and remember the rid so that a late dump or error
        file the server writes for it afterwards is deleted too (`_sweep`). Its rid is never sent again."""
        self._clean(rid)
        with self._lock:
            self._abandoned.add(rid)

    def _sweep(self) -> None:
        """Delete whatever arrived late for abandoned rids."""
        with self._lock:
            rids = list(self._abandoned)
        for rid in rids:
            self._clean(rid)


def _take(it: Iterator[PreparedSample], n: int) -> list[PreparedSample]:
    out = []
    for _ in range(n):
        try:
            out.append(next(it))
        except StopIteration:
            break
    return out
