"""The pod network the node agent plays (GKE's VPC-native pod range): one Linux network namespace per pod on a
bridge, each pod with its own address, as a CNI plugin gives it.

- ``PodNetwork(index)`` owns the bridge ``tpfbr<index>`` with the gateway ``10.<base+index>.0.1/16``; a pod's
  namespace ``tpf<index>-<uid8>`` gets a veth end named ``eth0`` with the next free address and a default route
  through the gateway. Nothing leaves the machine: the host does not forward (ip_forward stays 0), so the
  default route only reaches the host's own addresses (the gateway, Service addresses, host services).
- Every pod resolves the cluster's names through its own ``/etc/hosts`` (``ip netns exec`` mounts
  ``/etc/netns/<ns>/hosts`` over it): Services and, under a headless Service, each pod's
  ``<hostname>.<subdomain>`` (the names cluster DNS serves). The agent rewrites them as Services and pods change.
- ``forward_host_port(port)``: a host service on 127.0.0.1:port (the GCS emulator, the GCE metadata stand-in
  beside it) reachable from pods at gateway:port, as Private Google Access makes Google's APIs reachable, and at
  127.0.0.1:port inside every pod: the address the Airflow side knows it by, which a Ray job's runtime_env
  env_vars carry into the pod over the pod's own environment.

Needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN): network namespaces, veth pairs and mount namespaces.
"""

from __future__ import annotations

import contextlib
import ctypes
import ipaddress
import json
import os
import shutil
import socket
import subprocess
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from tpuflow_rehearsal.nodes.tcp_forward import TcpForwarder, listen

NETNS_ETC = Path("/etc/netns")
BASE_OCTET = 200  # pod ranges 10.200.0.0/16, 10.201.0.0/16, ... one per agent
SERVICE_BASE_OCTET = (
    150  # Service ranges 10.150.0.0/16, ... one per agent (kube-apiserver's --service-cluster-ip-range)
)
CLUSTER_DOMAIN = "cluster.local"
NETNS_RUN = Path("/var/run/netns")  # where `ip netns add` pins each namespace
OWNERS = Path("/run/tpuflow/pod-networks")  # tpfbr<index>.json: the process that claimed the network
_CLONE_NEWNET = 0x40000000


def _fixed_target(host: str, port: int) -> Callable[[], tuple[str, int]]:
    """A TcpForwarder target that always answers ``(host, port)``."""
    return lambda: (host, port)


class NetworkError(RuntimeError):
    pass


def _ip(*args: str, netns: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
    argv = ["ip", *(["-n", netns] if netns else []), *args]
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if check and done.returncode != 0:
        raise NetworkError(f"{' '.join(argv)}: {done.stderr.strip()}")
    return done


def available() -> str | None:
    """None when this process can make pod networks; else one line saying why not."""
    if os.geteuid() != 0:
        return "the node agent makes a network namespace per pod: run it as root (CAP_NET_ADMIN, CAP_SYS_ADMIN)"
    for tool in ("ip", "unshare", "nsenter"):
        if shutil.which(tool) is None:
            return f"the node agent needs `{tool}` (Debian: iproute2 / util-linux)"
    return None


def listen_in_namespace(netns: str, address: tuple[str, int]) -> socket.socket:
    """A listening TCP socket on ``address`` inside network namespace ``netns``. A socket belongs to the namespace
    it was made in, and setns() moves only the calling thread: a thread of its own joins the namespace, makes the
    socket and ends, so no other thread of this process ever leaves the host's namespace."""
    made: dict[str, socket.socket] = {}
    failed: list[OSError] = []

    def make() -> None:
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            with open(NETNS_RUN / netns) as handle:
                if libc.setns(handle.fileno(), _CLONE_NEWNET) != 0:
                    errno = ctypes.get_errno()
                    raise OSError(errno, f"setns {netns}: {os.strerror(errno)}")
            made["socket"] = listen(address)
        except OSError as err:
            failed.append(err)

    thread = threading.Thread(target=make, name=f"listen-in-{netns}")
    thread.start()
    thread.join()
    if failed:
        raise failed[0]
    return made["socket"]


def _owner_file(index: int) -> Path:
    return OWNERS / f"tpfbr{index}.json"


def _started(pid: int) -> str | None:
    """The process's start time (its /proc stat field 22), None once it is gone: with the pid, it names one process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def _owner_record() -> dict[str, object]:
    return {"pid": os.getpid(), "started": _started(os.getpid())}


def _owner_gone(record: object) -> bool:
    """Whether the recorded owner is provably gone: its pid exited, or now names a later process."""
    if not isinstance(record, dict) or not isinstance(record.get("pid"), int):
        return False
    return _started(record["pid"]) != record.get("started")


def claim_index(limit: int = 40) -> int:
    """A free network index: the first whose bridge this process could create, or whose recorded owner is provably
    dead (a SIGKILLed agent's process: its pods died with it; its namespaces and bridge are removed and the index
    taken). The claim records this process as the owner; ``PodNetwork.down`` forgets it."""
    for index in range(limit):
        if _ip("link", "add", f"tpfbr{index}", "type", "bridge", check=False).returncode != 0:
            try:
                owner = json.loads(_owner_file(index).read_text())
            except (OSError, ValueError):
                continue  # another agent's, just created or from before owners were recorded: left alone
            if not _owner_gone(owner):
                continue
            PodNetwork(index).down()
            if _ip("link", "add", f"tpfbr{index}", "type", "bridge", check=False).returncode != 0:
                continue
        OWNERS.mkdir(parents=True, exist_ok=True)
        _owner_file(index).write_text(json.dumps(_owner_record()))
        return index
    raise NetworkError(f"no free pod network among {limit} (bridges tpfbr0..tpfbr{limit - 1} all exist)")


def service_cidr(index: int) -> str:
    return f"10.{SERVICE_BASE_OCTET + index}.0.0/16"


@dataclass
class PodInterface:
    netns: str
    ip: str
    host_veth: str


class PodNetwork:
    """The bridge, the pods' namespaces and addresses, their hosts files (module docstring)."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.bridge = f"tpfbr{index}"
        self.cidr = ipaddress.ip_network(f"10.{BASE_OCTET + index}.0.0/16")
        self.gateway = str(self.cidr.network_address + 1)
        self._lock = threading.Lock()
        self._used: dict[str, str] = {}  # pod key -> ip
        self._next = 2
        self._forwarders: dict[int, TcpForwarder] = {}  # host port -> its forwarder on the gateway
        self._targets: dict[int, str] = {}  # host port -> the host address it forwards to
        self._loopback: dict[str, list[TcpForwarder]] = {}  # pod namespace -> its 127.0.0.1 forwarders

    # --- the bridge ---------------------------------------------------------------------------------
    def up(self) -> PodNetwork:
        """Bring the bridge up (``claim_index`` created it; a restarted agent finds it there)."""
        if _ip("link", "show", self.bridge, check=False).returncode != 0:
            _ip("link", "add", self.bridge, "type", "bridge")
        _ip("addr", "replace", f"{self.gateway}/{self.cidr.prefixlen}", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        return self

    def release(self) -> None:
        """Stop this object's forwarders and leave the bridge (a restarted agent's ``up()`` finds it)."""
        for forwarder in [*self._forwarders.values(), *(f for fs in self._loopback.values() for f in fs)]:
            forwarder.stop()
        self._forwarders.clear()
        self._loopback.clear()

    def down(self) -> None:
        self.release()
        for netns in self.namespaces():
            self.remove_namespace(netns)
        for folder in NETNS_ETC.glob(f"tpf{self.index}-*"):  # a hosts file rewritten while its pod went
            shutil.rmtree(folder, ignore_errors=True)
        _ip("link", "del", self.bridge, check=False)
        _owner_file(self.index).unlink(missing_ok=True)

    def namespaces(self) -> list[str]:
        done = _ip("netns", "list", check=False)
        names = [line.split()[0] for line in done.stdout.splitlines() if line.strip()]
        return [n for n in names if n.startswith(f"tpf{self.index}-")]

    # --- pods ----------------------------------------------------------------------------------------
    def netns_name(self, uid: str) -> str:
        return f"tpf{self.index}-{uid.replace('-', '')[:10]}"

    def _allocate(self, key: str) -> str:
        with self._lock:
            if key in self._used:
                return self._used[key]
            taken = set(self._used.values())
            while True:
                candidate = self.cidr.network_address + self._next
                self._next += 1
                if candidate not in self.cidr or candidate == self.cidr.broadcast_address:
                    self._next = 2
                    continue
                if str(candidate) not in taken:
                    self._used[key] = str(candidate)
                    return str(candidate)

    def add_pod(self, uid: str) -> PodInterface:
        """The pod's namespace, veth and address (idempotent for one uid)."""
        netns = self.netns_name(uid)
        ip = self._allocate(uid)
        host_veth = f"tpv{self.index}{uid.replace('-', '')[:8]}"[:15]
        if _ip("netns", "add", netns, check=False).returncode != 0:
            _ip("-n", netns, "link", "show", "eth0")  # it exists from before: must be whole
            self._forward_loopback(netns)
            return PodInterface(netns, ip, host_veth)
        # a sandbox of this pod from before the node died may still be going (its namespace is freed once its
        # last process is reaped): its host end is stale, as is its peer
        _ip("link", "del", host_veth, check=False)
        _ip("link", "add", host_veth, "type", "veth", "peer", "name", f"{host_veth}p")
        _ip("link", "set", f"{host_veth}p", "netns", netns)
        _ip("link", "set", host_veth, "master", self.bridge, "up")
        _ip("link", "set", "lo", "up", netns=netns)
        _ip("link", "set", f"{host_veth}p", "name", "eth0", netns=netns)
        _ip("addr", "add", f"{ip}/{self.cidr.prefixlen}", "dev", "eth0", netns=netns)
        _ip("link", "set", "eth0", "up", netns=netns)
        _ip("route", "add", "default", "via", self.gateway, netns=netns)
        self._forward_loopback(netns)
        return PodInterface(netns, ip, host_veth)

    def remove_namespace(self, netns: str) -> None:
        for forwarder in self._loopback.pop(netns, []):
            forwarder.stop()
        _ip("netns", "del", netns, check=False)  # its veth end goes with it, and the host's end with that
        shutil.rmtree(NETNS_ETC / netns, ignore_errors=True)

    def remove_pod(self, uid: str) -> None:
        self.remove_namespace(self.netns_name(uid))
        with self._lock:
            self._used.pop(uid, None)

    def write_hosts(self, uid: str, hostname: str, ip: str, names: Mapping[str, Iterable[str]]) -> None:
        """/etc/hosts and /etc/resolv.conf as this pod sees them: itself and ``names`` (address -> names)."""
        folder = NETNS_ETC / self.netns_name(uid)
        folder.mkdir(parents=True, exist_ok=True)
        lines = ["127.0.0.1\tlocalhost", "::1\tlocalhost ip6-localhost ip6-loopback", f"{ip}\t{hostname}"]
        lines += [f"{addr}\t{' '.join(sorted(set(hosts)))}" for addr, hosts in sorted(names.items()) if hosts]
        text = "\n".join(lines) + "\n"
        hosts = folder / "hosts"
        if not hosts.exists() or hosts.read_text() != text:
            # in place, never by rename: a running pod's /etc/hosts is a bind mount of this very inode
            with open(hosts, "a+") as out:
                out.seek(0)
                out.truncate()
                out.write(text)
        if not (folder / "resolv.conf").exists():
            # no nameserver: names outside the cluster do not resolve, as in a cluster with no egress
            (folder / "resolv.conf").write_text(
                f"search default.svc.{CLUSTER_DOMAIN} svc.{CLUSTER_DOMAIN} {CLUSTER_DOMAIN}\n"
            )

    # --- host services -------------------------------------------------------------------------------
    def forward_host_port(self, port: int, target_host: str = "127.0.0.1") -> str:
        """Make host service ``target_host:port`` reachable from pods at ``gateway:port``; that address."""
        if port not in self._forwarders:
            self._forwarders[port] = TcpForwarder((self.gateway, port), lambda: (target_host, port)).start()
            self._targets[port] = target_host
        return f"{self.gateway}:{port}"

    def _forward_loopback(self, netns: str) -> None:
        """The host services at 127.0.0.1:port inside pod namespace ``netns`` too (once per namespace)."""
        if netns in self._loopback:
            return
        forwarders = self._loopback[netns] = []
        for port, host in list(self._targets.items()):
            try:
                listening = listen_in_namespace(netns, ("127.0.0.1", port))
            except OSError:
                continue  # taken in the pod: the gateway's address still reaches the service
            forwarder = TcpForwarder(("127.0.0.1", port), _fixed_target(host, port))
            forwarders.append(forwarder.start(listening))

    def stop_forward(self, port: int) -> None:
        with contextlib.suppress(KeyError):
            self._forwarders.pop(port).stop()
        self._targets.pop(port, None)
        for forwarders in self._loopback.values():
            for forwarder in [f for f in forwarders if f.listen[1] == port]:
                forwarder.stop()
                forwarders.remove(forwarder)
