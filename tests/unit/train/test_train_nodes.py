"""Several training nodes: the loader's sharding by global rank, torchrun's command line, the rendezvous."""

from __future__ import annotations

import itertools
import socket
import threading
from pathlib import Path

import pytest
import torch

from eagle3.config import TrainConfig
from eagle3.draft.data import BatchStream, DataPosition, Sample
from eagle3.store.paths import TrainPaths
from eagle3.train.launch import NodeLaunch, torchrun_command
from eagle3.train.rendezvous import RDZV_PORTS, RendezvousError, ephemeral_low, free_port, node_launch, rdzv_id


@pytest.mark.parametrize(("nodes", "nproc"), [(1, 2), (2, 1), (2, 2), (3, 2)])
def test_every_sample_is_seen_once_per_epoch_across_nodes_and_processes(nodes: int, nproc: int) -> None:
    g = torch.Generator().manual_seed(nodes * 10 + nproc)
    samples = [Sample(Path(f"s{i}"), int(n)) for i, n in enumerate(torch.randint(5, 90, (301,), generator=g))]
    world = nodes * nproc
    streams = [  # global rank = node_rank * nproc + local_rank, as torchrun numbers them
        BatchStream(samples, batch_tokens=256, seed=7, rank=node * nproc + local, world=world,
                    device=torch.device("cpu"), threads=1, prefetch=1)
        for node in range(nodes) for local in range(nproc)
    ]  # fmt: skip
    try:
        steps = streams[0].steps_per_epoch(0)
        seen: list[int] = []
        for s in streams:
            rows = s._rows(DataPosition(0, 0))
            for _ in range(steps):
                pos, row = next(rows)
                assert pos.epoch == 0
                seen.extend(row)
            assert next(rows)[0].epoch == 1  # the epoch ends at the same step on every rank
        plan = streams[0].plan(0)
        assert len(seen) == len(set(seen)), "a sample twice in one epoch"
        left_out = [i for row in plan[steps * world :] for i in row]  # the last len(plan) % world rows
        assert sorted(seen + left_out) == list(range(len(samples)))
        assert len(plan) - steps * world < world
    finally:
        for s in streams:
            s.close()


def test_one_node_is_standalone_and_several_meet_at_node_0s_c10d_store() -> None:
    one = torchrun_command(Path("job.json"), 8, python="py")
    assert "--standalone" in one and "--nnodes" not in one
    assert one[-5:] == ["--nproc_per_node", "8", "-m", "eagle3.train.worker", "job.json"]
    for rank in (0, 1):
        cmd = torchrun_command(Path("job.json"), 8, node=NodeLaunch(2, rank, "10.0.0.5:29400", "id1"), python="py")
        arg = dict(itertools.pairwise(cmd))
        assert "--standalone" not in cmd
        assert (arg["--nnodes"], arg["--node_rank"], arg["--rdzv_backend"]) == ("2", str(rank), "c10d")
        assert (arg["--rdzv_endpoint"], arg["--rdzv_id"], arg["--max_restarts"]) == ("10.0.0.5:29400", "id1", "0")
        assert f"is_host={int(rank == 0)}" in arg["--rdzv_conf"]  # node 0 alone hosts the store


def test_node_0_publishes_its_port_and_the_other_node_reads_it(tmp_path: Path) -> None:
    cfg = TrainConfig.model_validate({"nodes": 2, "rdzv_endpoint": "127.0.0.1"})
    assert node_launch(TrainConfig(), tmp_path, None) is None
    got: list[NodeLaunch | None] = []
    reader = threading.Thread(
        target=lambda: got.append(node_launch(cfg.model_copy(update={"node_rank": 1}), tmp_path, "run-a", wait_s=30))
    )
    reader.start()  # node 1 starts first and waits for node 0's file
    first = node_launch(cfg, tmp_path, "run-a")
    reader.join()
    assert first is not None and first.endpoint.startswith("127.0.0.1:") and first.node_rank == 0
    assert got == [NodeLaunch(2, 1, first.endpoint, rdzv_id(tmp_path))]
    assert TrainPaths(tmp_path).rendezvous("run-a").is_file()
    fixed = cfg.model_copy(update={"rdzv_endpoint": "node0:29400"})
    assert node_launch(fixed, tmp_path, None) == NodeLaunch(2, 0, "node0:29400", rdzv_id(tmp_path))


def test_node_0s_port_comes_from_below_the_ephemeral_range_where_outgoing_connections_cannot_take_it(
    tmp_path: Path,
) -> None:
    ranges = tmp_path / "ip_local_port_range"
    ranges.write_text("40000\t60999\n")
    assert ephemeral_low(ranges) == 40000  # read from the file, not the default
    assert ephemeral_low(tmp_path / "absent") == 32768  # Linux's default when it cannot be read
    port = free_port("127.0.0.1")
    assert port in RDZV_PORTS if ephemeral_low() >= RDZV_PORTS.stop else port > 0
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))  # free: torchrun can bind it
    assert free_port("127.0.0.1", low=1024) not in RDZV_PORTS  # a range that starts lower: the kernel's pick


def test_a_node_without_a_port_or_a_launch_token_is_told_what_to_set(tmp_path: Path) -> None:
    cfg = TrainConfig.model_validate({"nodes": 2, "node_rank": 1})
    with pytest.raises(RendezvousError, match=r"train\.rdzv_endpoint .* train-fanout"):
        node_launch(cfg, tmp_path, None)
    with pytest.raises(RendezvousError, match=r"rendezvous/late\.json: node 0 did not publish"):
        node_launch(cfg, tmp_path, "late", wait_s=0.5)
    with pytest.raises(ValueError, match=r"node_rank 2 is not below train\.nodes 2"):
        TrainConfig.model_validate({"nodes": 2, "node_rank": 2})


def test_the_workers_compile_cache_is_kept_with_the_training_unless_the_caller_set_one(tmp_path: Path) -> None:
    from eagle3.store.paths import TrainPaths
    from eagle3.train.launch import train_env

    cache = TrainPaths(tmp_path / "train").inductor_cache(1)
    assert cache == tmp_path / "train" / "inductor-cache" / "node1"
    assert train_env(1, {}, cache)["TORCHINDUCTOR_CACHE_DIR"] == str(cache)
    assert train_env(1, {"TORCHINDUCTOR_CACHE_DIR": "/mine"}, cache)["TORCHINDUCTOR_CACHE_DIR"] == "/mine"
    assert "TORCHINDUCTOR_CACHE_DIR" not in train_env(1, {})
