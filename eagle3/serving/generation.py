"""Generation requests to the SGLang server(s) of a run: token ids in, token ids and a finish reason out.

    client = GenerationClient(servers, scfg, stop_ids=..., run_id=...)
    client.generate(input_ids, sample_id=..., turn=...[, temperature=..., seed=...])
                                                        -> Generated(output_ids, finish_reason)
                                                           raises GenerationFailed(reason) when it gives up

Thread-safe: synthesize calls `generate` from `synthesize.concurrency` threads at once; each call goes to the
server with the fewest requests in flight, so the load spreads over every server. Every attempt has its own
request id, `syn-<run id>[.<attempt>]-<sample id>-t<turn>`: never the extraction prefix `e3-` (the hook
captures only that, eagle3/store/dump_protocol.py), never a duplicate in-flight rid after a timed-out attempt.
A timeout aborts its rid; a timeout, an HTTP error or a 5xx is retried (`synthesize.request_retries`, backoff),
after a restart of the server when it died (at most `server.max_restarts`, eagle3/serving/server.py); a 4xx (the server
refuses this request, e.g. longer than its context) fails the request at once.
"""

from __future__ import annotations

import contextlib
import threading
import time
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import httpx

from eagle3.config import SynthesizeConfig
from eagle3.store import dump_protocol as proto
from eagle3.store.fsio import safe_name

RID_PREFIX = "syn-"
assert not RID_PREFIX.startswith(proto.RID_PREFIX)  # the hook must never capture a generation request


class Server(Protocol):
    """What the client needs of a server (eagle3.serving.server.SGLangServer)."""

    url: str

    def start(self) -> None: ...  # a no-op for a server that runs

    def is_alive(self) -> bool: ...

    def restart(self, reason: str) -> None: ...


@dataclass(frozen=True)
class Generated:
    output_ids: list[int]  # as generated, the stop token included when one matched
    finish_reason: str  # "stop" (a stop token or string) | "length" (max_new_tokens) | "abort" | ...
    prompt_tokens: int = 0  # the prompt, as the server counted it
    cached_tokens: int = 0  # ... of which its prefix cache served (server.prefix_cache), never prefilled again


class GenerationFailed(RuntimeError):
    """A request the client gave up on; the message is the per-row reason (rid, what happened, the key)."""


class _Transient(Exception):
    pass


class _Refused(Exception):
    pass


def make_generation_rid(run_id: str, sample_id: str, turn: int, attempt: int = 0) -> str:
    run = f"{run_id}.{attempt}" if attempt else run_id
    return safe_name(f"{RID_PREFIX}{run}-{sample_id}-t{turn}")


def home_server(sample_id: str, servers: int) -> int:
    """The server a conversation's turns go to with affinity: a stable hash of its sample id (the same after a
    resume or in another process), so conversations spread over the servers with no table to keep."""
    return zlib.crc32(sample_id.encode()) % servers


class GenerationClient:
    def __init__(
        self,
        servers: Sequence[Server],
        scfg: SynthesizeConfig,
        *,
        stop_ids: list[int],
        run_id: str,
        retry_delay_s: float = 1.0,
        affinity: bool = False,
    ):
        """affinity: send every turn of a conversation to one server (its home_server), where the turns before it
        are in the prefix cache (server.prefix_cache); a resend goes to the least busy server. False: every request
        goes to the least busy server."""
        if not servers:
            raise ValueError("GenerationClient needs at least one server")
        self.servers = list(servers)
        self.scfg = scfg
        self.stop_ids = stop_ids
        self.run_id = run_id
        self.retry_delay_s = retry_delay_s
        self.affinity = affinity and len(servers) > 1
        self.resent = 0  # attempts sent again
        self.prompt_tokens = 0  # prompt tokens of the answered requests
        self.cached_tokens = 0  # ... that the servers' prefix cache served (server.prefix_cache)
        self._in_flight = [0] * len(self.servers)
        self._generation = [0] * len(self.servers)  # bumped by each restart: concurrent failures restart once
        self._lock = threading.Lock()
        self._restart_locks = [threading.Lock() for _ in self.servers]
        conns = scfg.concurrency + 8
        self._http = httpx.Client(limits=httpx.Limits(max_connections=conns, max_keepalive_connections=conns))

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> GenerationClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def sampling_params(self, temperature: float | None = None, seed: int | None = None) -> dict[str, Any]:
        """The request's sampling: synthesize's settings, or this request's temperature; `seed` is sent as
        SGLang's sampling_seed (honoured by servers launched with --enable-deterministic-inference)."""
        s = self.scfg
        temp = s.temperature if temperature is None else temperature
        params: dict[str, Any] = {"max_new_tokens": s.max_new_tokens, "temperature": temp,
                                  "stop_token_ids": self.stop_ids}  # fmt: skip
        if temp > 0:
            params["top_p"] = s.top_p
            if seed is not None:
                params["sampling_seed"] = seed
        return params

    def generate(
        self, input_ids: list[int], *, sample_id: str, turn: int, temperature: float | None = None,
        seed: int | None = None,
    ) -> Generated:  # fmt: skip
        retries = self.scfg.request_retries
        last = "not attempted"
        for attempt in range(retries + 1):
            rid = make_generation_rid(self.run_id, sample_id, turn, attempt)
            if attempt:
                with self._lock:
                    self.resent += 1
                time.sleep(min(30.0, self.retry_delay_s * 2.0 ** (attempt - 1)))
            index = self._checkout(home_server(sample_id, len(self.servers)) if self.affinity and not attempt else None)
            generation = self._generation[index]
            try:
                out = self._attempt(self.servers[index], rid, input_ids, self.sampling_params(temperature, seed))
                with self._lock:
                    self.prompt_tokens += out.prompt_tokens
                    self.cached_tokens += out.cached_tokens
                return out
            except _Refused as e:
                raise GenerationFailed(f"rid {rid}: {e}") from None
            except _Transient as e:
                last = f"rid {rid} on {self.servers[index].url}: {e}"
                self._recover(index, generation, str(e))
            finally:
                with self._lock:
                    self._in_flight[index] -= 1
        raise GenerationFailed(f"gave up after {retries + 1} attempts (synthesize.request_retries); last: {last}")

    # one attempt ---------------------------------------------------------------------------------------
    def _checkout(self, home: int | None = None) -> int:
        with self._lock:
            index = home if home is not None else min(range(len(self.servers)), key=lambda i: self._in_flight[i])
            self._in_flight[index] += 1
            return index

    def _attempt(self, server: Server, rid: str, input_ids: list[int], sampling: dict[str, Any]) -> Generated:
        body = {"input_ids": input_ids, "rid": rid, "sampling_params": sampling}
        timeout = self.scfg.request_timeout_s
        try:
            r = self._http.post(f"{server.url}/generate", json=body, timeout=timeout)
        except httpx.TimeoutException:
            with contextlib.suppress(httpx.HTTPError):
                self._http.post(f"{server.url}/abort_request", json={"rid": rid}, timeout=10.0)
            raise _Transient(f"no answer within {timeout:.0f}s (synthesize.request_timeout_s)") from None
        except httpx.HTTPError as e:
            raise _Transient(f"/generate failed: {type(e).__name__}: {e}") from None
        if r.status_code >= 500 or r.status_code in (408, 429):
            raise _Transient(f"/generate answered {r.status_code}: {r.text[:300]}")
        if r.status_code != 200:
            raise _Refused(f"/generate answered {r.status_code}: {r.text[:300]}")
        try:
            out = r.json()
            ids = [int(t) for t in out["output_ids"]]
            meta = out["meta_info"]
            finish = meta.get("finish_reason") or {}
            prompt, cached = int(meta.get("prompt_tokens") or 0), int(meta.get("cached_tokens") or 0)
        except (ValueError, KeyError, TypeError) as e:
            raise _Transient(f"/generate answered an unreadable body ({type(e).__name__}: {r.text[:200]})") from None
        reason = str(finish.get("type", "unknown")) if isinstance(finish, dict) else str(finish)
        if reason == "abort":
            raise _Transient(f"the server aborted the request: {finish.get('message', '')}")
        return Generated(ids, reason, prompt, cached)

    def _recover(self, index: int, generation: int, reason: str) -> None:
        """Restart a launched server that died (once for all the requests that saw it die)."""
        server = self.servers[index]
        with self._restart_locks[index]:
            if generation != self._generation[index] or server.is_alive():
                return
            try:
                server.restart(reason)
            except Exception as e:  # ServerError past server.max_restarts, an attached server: the row fails
                raise GenerationFailed(f"{server.url} is down and was not restarted: {e}") from None
            self._generation[index] += 1
