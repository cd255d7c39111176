"""What a simulated slice looks like from the network and from inside its hosts.

Each host has its own loopback address (Ray Train ranks nodes by address, as TPU VMs on GKE); the head
binds everything to 127.0.0.1; the only ports on another interface are the hosts' token-checked gRPC
servers, the ones Ray keeps to loopback only for 127.0.0.1.
"""

from __future__ import annotations

import ipaddress
import json
from pathlib import Path

import pytest
from support.ray_cluster import run_job

from tpuflow.local.cluster import LocalRayCluster, _pids_referencing
from tpuflow.rayjob.hooks import parse_result
from tpuflow.tpu import TpuSlice

DRIVERS = Path(__file__).parent / "drivers"
pytestmark = pytest.mark.slow
SLICE = TpuSlice.from_spec("TPU-V6E", "2x4", "ct6e-standard-4t")  # one slice of the session's slice_cluster
# the `ray start` flags whose ports Ray binds on every interface for a node address other than 127.0.0.1
HOST_GRPC_FLAGS = ("--node-manager-port", "--object-manager-port", "--dashboard-agent-grpc-port")


def _listening(pids: set[int]) -> set[tuple[str, int]]:
    """(address, port) of every TCP socket in LISTEN state that one of ``pids`` holds (from /proc)."""
    inodes: set[str] = set()
    for pid in pids:
        try:
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                target = fd.readlink().as_posix() if fd.is_symlink() else ""
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
        except OSError:
            continue
    found: set[tuple[str, int]] = set()
    for table, width in (("/proc/net/tcp", 4), ("/proc/net/tcp6", 16)):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state != "0A" or inode not in inodes:
                continue
            hex_ip, hex_port = local.split(":")
            raw = bytes.fromhex(hex_ip)
            # /proc stores each 32-bit word in host (little-endian) order
            raw = b"".join(raw[i : i + 4][::-1] for i in range(0, width, 4))
            found.add((str(ipaddress.ip_address(raw)), int(hex_port, 16)))
    return found


def _flag_ports(pid: int) -> set[int]:
    args = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
    return {int(a.split("=", 1)[1]) for a in args if a.split("=", 1)[0] in HOST_GRPC_FLAGS}


def _is_loopback(address: str) -> bool:
    ip = ipaddress.ip_address(address)
    return ip.is_loopback or (ip.version == 6 and ip.ipv4_mapped is not None and ip.ipv4_mapped.is_loopback)


def test_only_the_hosts_token_checked_grpc_ports_listen_beyond_loopback(slice_cluster: LocalRayCluster):
    everything = _listening(set(_pids_referencing(slice_cluster.temp_dir)))
    assert everything, "no listening socket found for the cluster's processes"
    exposed = {(addr, port) for addr, port in everything if not _is_loopback(addr)}
    allowed = set().union(*(_flag_ports(n.pid) for n in slice_cluster.nodes if n.role == "tpu-host"))
    assert {port for _, port in exposed} <= allowed, sorted(exposed)
    # the head (GCS, dashboard, Jobs / Serve APIs, Ray Client server, dashboard metrics) listens on loopback only
    head = slice_cluster.nodes[0]
    head_pids = set(_pids_referencing(head.temp_dir))
    assert not {a for a, _ in _listening(head_pids) if not _is_loopback(a)}
    assert slice_cluster.gcs_address.startswith("127.0.0.1:")


def test_each_host_has_its_own_address_and_the_webhook_variables(slice_cluster: LocalRayCluster):
    kwargs = json.dumps(SLICE.slice_placement_group_kwargs())
    logs = run_job(slice_cluster, f"host_identity_probe.py '{kwargs}'", {"working_dir": str(DRIVERS)}, timeout=300)
    bundles = parse_result(logs)["bundles"]
    # one actor per chip: 8 bundles of {TPU: 1, CPU: 1} place on two 4-chip hosts with the default host CPUs
    assert len(bundles) == SLICE.chips
    by_ip: dict[str, int] = {}
    for b in bundles:
        by_ip[b["node_ip"]] = by_ip.get(b["node_ip"], 0) + 1
        assert b["hostnames"][b["worker"]] == b["node_ip"]  # TPU_WORKER_HOSTNAMES[TPU_WORKER_ID] is this host
        assert b["resolved"] == b["hostnames"]
        assert b["torch_topology"] == "2,4,1"
        assert len(b["slicebuilder"]) == SLICE.chips and b["slicebuilder"][0] == f"{b['hostnames'][0]}:8471"
    assert sorted(by_ip.values()) == [4, 4]
    assert all(ipaddress.ip_address(ip).is_loopback and ip != "127.0.0.1" for ip in by_ip)
