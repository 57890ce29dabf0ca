"""Where the nodes of one training meet: the c10d rendezvous endpoint and id of a multi-node torchrun.

    node = node_launch(cfg.train, out_dir, token)      # None on one node
    torchrun_command(job, nproc, node=node)            # eagle3/train/launch.py

The endpoint is `train.rdzv_endpoint` when it names a port. Otherwise node 0 picks a free port on its host
(`train.rdzv_endpoint` as the host, else its hostname) and publishes `host:port` in the training directory under
the launch's `token` (the train-fanout flow run's id), which every node reads on the shared filesystem; the token
keeps a later launch from reading an earlier one's port. The rendezvous id is the training directory's, the same
on every node.
"""

from __future__ import annotations

import hashlib
import random
import socket
import time
from pathlib import Path

from eagle3.config import TrainConfig
from eagle3.store.fsio import atomic_write_json, read_json
from eagle3.store.paths import TrainPaths
from eagle3.train.launch import NodeLaunch

#: Below Linux's default ephemeral range (32768-60999) and SGLang's 30000+ (server.port and the ports it adds).
RDZV_PORTS = range(29100, 29900)
_pick = random.SystemRandom()
PUBLISH_WAIT_S = 600.0  # how long nodes 1.. wait for node 0 to publish its port (node 0 may start last)


class RendezvousError(RuntimeError):
    """No endpoint for this node: the message names the setting or the file that was waited for."""


def rdzv_id(out_dir: Path) -> str:
    """The same on every node that sees the training directory at the same path."""
    return "eagle3-" + hashlib.sha256(str(Path(out_dir).resolve()).encode()).hexdigest()[:12]


def ephemeral_low(path: Path = Path("/proc/sys/net/ipv4/ip_local_port_range")) -> int:
    """The first port of the kernel's ephemeral range (outgoing connections' source ports); Linux's default."""
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port(host: str = "", low: int | None = None) -> int:
    """A TCP port free now on `host` ("" all interfaces: the store listens there for the other nodes).

    From RDZV_PORTS, below the ephemeral range: a port the kernel picked (bind to 0) comes from that range, where any
    outgoing connection of the node can take it in the seconds before torchrun binds it. The kernel's pick only
    when the ephemeral range starts below RDZV_PORTS's end or none of them is free."""
    if (ephemeral_low() if low is None else low) >= RDZV_PORTS.stop:
        for port in _pick.sample(RDZV_PORTS, 64):
            with socket.socket() as s:
                try:
                    s.bind((host, port))
                except OSError:
                    continue
                return port
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def split_endpoint(endpoint: str) -> tuple[str, int | None]:
    """`host:port` -> (host, port); `host` -> (host, None)."""
    host, sep, port = endpoint.rpartition(":")
    if not sep:
        return endpoint, None
    if not port.isdigit():
        raise RendezvousError(f"train.rdzv_endpoint {endpoint!r}: the port is not a number; write host:port or host")
    return host, int(port)


def node_launch(
    cfg: TrainConfig, out_dir: Path, token: str | None, *, wait_s: float = PUBLISH_WAIT_S
) -> NodeLaunch | None:
    """This node's rendezvous (None when cfg.nodes == 1); node 0 publishes a port it chose, the others wait for it."""
    if cfg.nodes == 1:
        return None
    host, port = split_endpoint(cfg.rdzv_endpoint) if cfg.rdzv_endpoint else (socket.gethostname(), None)
    launch = NodeLaunch(cfg.nodes, cfg.node_rank, "", rdzv_id(out_dir))
    if port is not None:
        return NodeLaunch(launch.nodes, launch.node_rank, f"{host}:{port}", launch.rdzv_id)
    if token is None:
        raise RendezvousError(
            f"train.nodes={cfg.nodes} without a port in train.rdzv_endpoint ({cfg.rdzv_endpoint!r}): set it to "
            "node 0's host:port on every node, or start the training with the train-fanout flow, which lets node 0 "
            "choose the port"
        )
    path = TrainPaths(out_dir).rendezvous(token)
    if cfg.node_rank == 0:
        endpoint = f"{host}:{free_port()}"
        atomic_write_json(path, {"endpoint": endpoint, "token": token, "time": time.time()})
        return NodeLaunch(launch.nodes, 0, endpoint, launch.rdzv_id)
    deadline = time.monotonic() + wait_s
    while not path.is_file():
        if time.monotonic() > deadline:
            raise RendezvousError(
                f"{path}: node 0 did not publish its rendezvous port within {wait_s:.0f}s; is node 0's flow run "
                "running, and does this node see the training directory at the same path (shared filesystem)?"
            )
        time.sleep(0.5)
    endpoint = str(read_json(path)["endpoint"])
    return NodeLaunch(launch.nodes, cfg.node_rank, endpoint, launch.rdzv_id)
