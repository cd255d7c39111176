"""Seed 004's Ray Core collectives (workloads/seed_collectives/ray_core_collectives.py) submitted as
`ray job submit --working-dir workloads/seed_collectives -- python ray_core_collectives.py ...` would,
through Ray's JobSubmissionClient: one actor per chip of a slice reserved with slice_placement_group,
ranks from TPU_WORKER_ID and the chip Ray assigned, a DTensor tensor-parallel step and an all-reduce
whose sum the driver checks on every rank. Two hosts of one v6e 2x4 on the session's shared cluster
(tests/conftest.py slice_cluster), and the README's single-host 2x2 on a cluster of its own."""

from __future__ import annotations

import re
import socket
import uuid
from pathlib import Path
from typing import Any

import pytest
from support.ray_cluster import run_job, running_cluster

from tpuflow.local.cluster import host_ip

SCRIPT_DIR = Path(__file__).resolve().parents[2] / "workloads" / "seed_collectives"
RANK_LINE = re.compile(
    r"^Rank +(\d+) \(worker_id=(\d+), local_rank=(\d+), ip=([0-9.]+)\): all_reduce_sum=\[([0-9., ]+)\]$", re.M
)

pytestmark = pytest.mark.slow


def free_port() -> int:
    """A port free on every interface: rank 0's TCP store binds it beside other jobs on this machine."""
    with socket.socket() as sock:
        sock.bind(("", 0))
        return int(sock.getsockname()[1])


def submit(cluster: Any, topology: str, *extra: str) -> str:
    args = (
        f"ray_core_collectives.py --topology {topology} --accelerator-type TPU-V6E "
        f"--master-port {free_port()} {' '.join(extra)}"
    )
    return run_job(cluster, args, {"working_dir": str(SCRIPT_DIR)}, timeout=600)


def ranks(logs: str) -> dict[int, tuple[int, int, str, list[float]]]:
    """rank -> (worker_id, local_rank, node ip, all_reduce_sum) as the driver printed them."""
    return {
        int(r): (int(w), int(lr), ip, [float(x) for x in s.split(",")]) for r, w, lr, ip, s in RANK_LINE.findall(logs)
    }


def test_two_hosts_of_a_v6e_2x4_all_reduce_over_the_whole_slice(slice_cluster: Any) -> None:
    # The seed's arithmetic on a two-host 2x4 needs Ray told the VM size (TpuSlice.ray_caveats); the
    # shared cluster holds two such slices, so the reservation must keep to one of them.
    logs = submit(slice_cluster, "2x4", "--chips-per-vm", "4")
    seen = ranks(logs)
    assert sorted(seen) == list(range(8)), logs[-4000:]
    # rank = TPU_WORKER_ID * 4 + the chip Ray assigned, as on GKE's 4-chip ct6e VMs
    assert {r: (w, lr) for r, (w, lr, _, _) in seen.items()} == {r: (r // 4, r % 4) for r in range(8)}
    ips = {w: {ip for ww, _, ip, _ in seen.values() if ww == w} for w in (0, 1)}
    assert all(len(v) == 1 for v in ips.values()), ips
    hosts = (ips[0].pop(), ips[1].pop())
    assert hosts in {(host_ip(s, 0, 2), host_ip(s, 1, 2)) for s in (0, 1)}, f"ranks straddle two slices: {hosts}"
    assert {tuple(s) for *_, s in seen.values()} == {(36.0,) * 4}  # 1 + 2 + ... + 8 on every rank
    assert re.search(
        r"All 8 TorchTPU ranks verified DTensor TP parity \(max_abs_diff=[0-9.]+\) and all_reduce sum = 36\.0", logs
    )


@pytest.mark.long  # a cluster of its own (about 110 s on 2 loaded cores); the 2x4 above runs in make test
def test_the_readme_command_on_a_single_host_2x2(tmp_path: Path) -> None:
    with running_cluster(f"coll-{uuid.uuid4().hex[:6]}", tmp_path / "clusters") as cluster:
        logs = submit(cluster, "2x2")
    seen = ranks(logs)
    assert {r: (w, lr, s) for r, (w, lr, _, s) in seen.items()} == {r: (0, r, [10.0] * 4) for r in range(4)}
    assert len({ip for _, _, ip, _ in seen.values()}) == 1
    assert "All 4 TorchTPU ranks verified DTensor TP parity" in logs and "all_reduce sum = 10.0" in logs
