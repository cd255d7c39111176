"""The embedded default backend: a real local Ray cluster with simulated TPU slice hosts.

Each simulated TPU host is its own Ray node (`ray start --block` in its own process group)
carrying the four TPU_* variables GKE's TPU webhook injects, so Ray itself derives the
slice labels (ray.io/tpu-slice-name, ...) and the TPU-<pod>-head resource, and
slice_placement_group / ScalingConfig(use_tpu=True) behave as on a real slice.

Why not `ray.util.cluster_utils.Cluster` or `ray start` alone: cluster_utils is a test helper
that ties the cluster to the calling process, and `ray stop` kills every Ray process on the
machine. A DAG run needs a cluster that outlives the task that started it and a stop that
touches only its own processes, so we track process groups ourselves.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import secrets
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, cast

import requests

from tpuflow import liveness, workloads_dir
from tpuflow.errors import UserInputError
from tpuflow.local.node_env import node_environment
from tpuflow.paths import tpuflow_home
from tpuflow.ray.drain import drain_node_args
from tpuflow.secret_files import write_secret_file
from tpuflow.tpu import TpuSlice

STATE_FILE = "state.json"
TOKEN_FILE = "auth_token"
CLUSTER_ENV = "TPUFLOW_LOCAL_CLUSTER"  # in every cluster process's environment: the cluster's temp dir
logger = logging.getLogger(__name__)
# Memory a simulated host needs (raylet, agents, one JAX/torch worker); refuse to start
# a slice the machine cannot hold instead of letting the OOM killer pick processes.
_HOST_MEMORY_BYTES = 700 * 1024 * 1024
_HEAD_MEMORY_BYTES = 1500 * 1024 * 1024
# The head's address. Ray binds a node's servers to loopback only for exactly 127.0.0.1 (tpuflow.local.ray_node
# keeps Ray's CLI from rewriting it to the machine's network address), so the head's GCS, dashboard, Ray Client
# server and dashboard metrics never listen on another interface.
HEAD_IP = "127.0.0.1"
# A simulated host's actors read this variable: while the file it names exists, that host answers Ray
# but never joins a collective (tpuflow_driver.preflight), as a TPU VM whose data network is down.
UNREACHABLE_FLAG_ENV = "TPUFLOW_SIM_UNREACHABLE_FLAG"


_MAX_LABEL_VALUE = 63  # Ray's label values (ray.io/tpu-slice-name), as Kubernetes': 63 characters at most


def simulated_tpu_path() -> str:
    """The folder of tpuflow's CPU stand-ins for TPU-only packages (torch_tpu), on every simulated node's path."""
    return str(Path(workloads_dir()) / "simulated_tpu")


def default_host_cpus(tpu: TpuSlice | None) -> int:
    """CPUs a simulated host offers Ray unless told: at least one per TPU device of the host."""
    return max(1, tpu.logical_devices_per_host) if tpu is not None else 1


def host_ip(slice_index: int, worker_id: int, hosts_per_slice: int) -> str:
    """The loopback address of one simulated TPU host: each host its own, as each TPU VM on GKE.

    Ray Train ranks nodes by address (node_rank, local_rank), so hosts sharing one would read as one node.
    Ray binds such a node's raylet, object manager and agent gRPC ports on every interface (it keeps to
    loopback only for 127.0.0.1); they require the cluster's token.
    """
    index = slice_index * hosts_per_slice + worker_id + 2
    return f"127.0.{index // 254}.{index % 254 + 1}" if index >= 254 else f"127.0.0.{index}"


def slice_name(cluster_name: str, index: int) -> str:
    """The name of simulated slice ``index``: its hosts' TPU_NAME, so also the unit resource each host carries.

    Ray turns TPU_NAME into the ``ray.io/tpu-slice-name`` label that ``slice_placement_group`` selects on, and
    refuses a selector value over 63 characters: a longer name keeps its start and a digest of the whole.
    """
    name = f"{cluster_name}-slice-{index}"
    if len(name) <= _MAX_LABEL_VALUE:
        return name
    suffix = f"-{hashlib.sha256(cluster_name.encode()).hexdigest()[:8]}-slice-{index}"
    return cluster_name[: _MAX_LABEL_VALUE - len(suffix)].rstrip("-._") + suffix


def default_base_dir() -> Path:
    """Where local cluster state lives unless a base_dir is given: clusters/ under tpuflow_home()."""
    return tpuflow_home() / "clusters"


class LocalClusterError(RuntimeError):
    """The local cluster could not be started, reached or stopped."""


def _check_own_temp_dir(temp_dir: str) -> None:
    """The node temp dir a state names (stop() deletes it): an absolute folder of this user's, or gone, or none."""
    if not temp_dir:
        return
    if not os.path.isabs(temp_dir):
        raise LocalClusterError(f"a cluster state names temp dir {temp_dir!r}, not an absolute path")
    try:
        st = os.lstat(temp_dir)
    except FileNotFoundError:
        return
    if stat.S_ISLNK(st.st_mode) or st.st_uid != os.getuid():
        raise LocalClusterError(f"temp dir {temp_dir} is a link or another user's: not this cluster's")


def check_private_state_dir(state_dir: Path | str) -> None:
    """A cluster's state folder is this user's, mode 0700, and not a link: another local user cannot have
    written the state that says which processes to signal and which folders to delete."""
    try:
        st = os.lstat(state_dir)
    except FileNotFoundError:
        return
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
        raise UserInputError("state_dir", str(state_dir), "a local cluster's state must be a folder of this user's")
    if st.st_mode & 0o077:
        raise UserInputError(
            "state_dir",
            str(state_dir),
            f"mode {stat.S_IMODE(st.st_mode):o} lets other users write the cluster's state; stop it "
            "(tpuflow local down) and start it again (tpuflow makes the folder 0700)",
        )


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _available_memory() -> int:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 1 << 62


@dataclass
class NodeProcess:
    role: str  # "head" or "tpu-host"
    pid: int
    log: str
    slice_name: str = ""
    worker_id: int = -1
    temp_dir: str = ""  # the node's own Ray temp dir (its processes' command lines name it)


@dataclass
class LocalRayCluster:
    """A running (or stopped) local cluster; its state lives in `state_dir/state.json`."""

    name: str
    state_dir: str
    temp_dir: str
    gcs_address: str
    dashboard_url: str
    serve_port: int
    slice: dict[str, Any] | None
    nodes: list[NodeProcess] = field(default_factory=list)
    started_at: float = 0.0
    host_cpus: int = 1
    # unix time past which the orphan reaper stops it whatever its run's state (a node pool's tpuflow-expires)
    expires_at: float | None = None
    # left running on purpose (keep_endpoint; a kept RayService's tpuflow-kept label): the reaper leaves it
    # while its processes live, whatever its run's state; `tpuflow local down` stops it
    kept: bool = False
    # the task instance that started it (tpuflow.naming.TaskIdentity.record()); None: no run did (`tpuflow local
    # up`). The orphan reaper judges the cluster by this record's run, never by its name
    owner: dict[str, Any] | None = None
    # the process supervising that run (tpuflow.liveness record; None: none does): the reaper and `tpuflow demo`
    # stop a cluster whose supervisor is provably dead
    supervisor: dict[str, Any] | None = None
    # False while start() is still bringing nodes up (the state is saved as each node spawns, so what a
    # start killed half-way spawned stays findable): a retry stops such a cluster rather than adopting it
    complete: bool = True
    # when every node had joined (None: not yet, or a state saved before it was recorded)
    ready_at: float | None = None
    # the head's Prometheus exporter (Ray's metrics, Serve's request counters among them); 0: none
    metrics_port: int = 0
    # a preemption under way ({"slice_index", "worker_id"}): recorded before the host is drained, cleared once
    # its replacement joined; one whose command was killed is finished by the next adoption (finish_preemption)
    pending_preemption: dict[str, int] | None = None

    # --- lifecycle ---------------------------------------------------------
    @classmethod
    def start(
        cls,
        tpu: TpuSlice | None,
        name: str,
        base_dir: Path | str | None = None,
        *,
        head_cpus: int = 2,
        host_cpus: int | None = None,
        env: dict[str, str] | None = None,
        timeout: float = 120.0,
        adopt: bool = True,
        auth_token: str | None = None,
        expires_at: float | None = None,
        owner: dict[str, Any] | None = None,
    ) -> LocalRayCluster:
        """Start a head plus one Ray node per simulated TPU host, or adopt a live cluster of that name.

        auth_token: the Ray token to use (default: a fresh random one), e.g. one a KubeRay Secret holds.
        expires_at: recorded in the state (an adopted cluster keeps its own); None: it never expires.
        owner: the starting task instance's record (TaskIdentity.record()), recorded in the state.
        host_cpus: CPUs each simulated host offers Ray (default: one per TPU device of the host, so one
        placement bundle per chip, which Ray gives {TPU: 1, CPU: 1}, places as on GKE's TPU VMs).
        """
        host_cpus = default_host_cpus(tpu) if host_cpus is None else host_cpus
        state_dir = Path(base_dir or default_base_dir()) / name
        if adopt and (state_dir / STATE_FILE).exists():
            existing = cls.load(state_dir)
            wanted = tpu.to_dict() if tpu else None
            if existing.complete and existing.is_alive():
                if existing.slice != wanted:
                    raise UserInputError(
                        "name",
                        name,
                        "a live local cluster of this name has a different slice; "
                        "stop it (tpuflow local down) or choose another name",
                    )
                existing.finish_preemption(timeout)
                return existing
            existing.stop()
        hosts = tpu.total_hosts if tpu else 0
        needed = _HEAD_MEMORY_BYTES + hosts * _HOST_MEMORY_BYTES
        if needed > _available_memory():
            raise UserInputError(
                "topology",
                tpu.topology if tpu else None,
                f"simulating {hosts} TPU hosts needs about {needed >> 20} MiB of free memory, this machine has "
                f"{_available_memory() >> 20} MiB; use a smaller slice (e.g. 2x2 or 2x4) for local runs",
            )
        state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        state_dir.chmod(0o700)  # a folder an earlier version made with the umask's mode
        write_secret_file(state_dir / TOKEN_FILE, auth_token or secrets.token_hex(32))  # 0600 in a 0700 folder
        # Ray's unix socket paths must stay under ~107 bytes: keep the temp dir short.
        temp_dir = tempfile.mkdtemp(prefix="tpf-", dir="/tmp")
        cluster = cls(
            name=name,
            state_dir=str(state_dir),
            temp_dir=temp_dir,
            gcs_address="",
            dashboard_url="",
            serve_port=free_port(),
            slice=tpu.to_dict() if tpu else None,
            started_at=time.time(),
            host_cpus=host_cpus,
            expires_at=expires_at,
            owner=owner,
            supervisor=liveness.supervisor_record(),
            complete=False,
        )
        cluster.save()
        base_env = cluster._base_env(tpu, env)
        logger.info(
            "Simulated hosts: %s CPUs each, own loopback addresses, GKE's TPU webhook variables; Ray processes "
            "import torch_tpu from tpuflow's CPU stand-in in %s",
            host_cpus,
            simulated_tpu_path(),
        )
        for caveat in tpu.ray_caveats() if tpu else ():
            logger.warning("%s", caveat)
        try:
            cluster._start_head(head_cpus, base_env, timeout)
            if tpu is not None:
                for s in range(tpu.num_slices):
                    for w in range(tpu.num_hosts):
                        cluster._start_host(tpu, s, w, base_env, host_cpus, timeout)
            cluster._wait_for_nodes(1 + hosts, timeout)
        except BaseException:
            cluster.stop()
            raise
        cluster.complete = True
        cluster.ready_at = time.time()
        cluster.save()
        return cluster

    def stop(self, timeout: float = 15.0, grace: float = 3.0) -> list[int]:
        """Stop exactly the processes this cluster started; returns the pids that were signalled.

        SIGTERM every node's process group, wait up to ``grace`` seconds on them, then SIGKILL what
        is left: Ray's gcs_server and autoscaler monitor ignore SIGTERM, so waiting longer only waits
        out the deadline. ``timeout`` bounds the wait after SIGKILL.

        Only processes that name this cluster (``_references``) are signalled: a recorded pid that now
        belongs to another process (after a reboot or pid wrap) counts as a node already gone.
        """
        signalled: list[int] = []
        # Workers first, so the head does not spend the grace reporting dead nodes.
        groups = [n.pid for n in sorted(self.nodes, key=lambda n: n.role == "head")]
        _log_foreign(groups, self.temp_dir, self.name)
        for pgid in groups:
            signalled += _signal_owned([pgid], self.temp_dir, signal.SIGTERM)
        if not _wait_owned_gone(groups, self.temp_dir, grace):
            _signal_owned(groups, self.temp_dir, signal.SIGKILL)
            _wait_owned_gone(groups, self.temp_dir, timeout)
        # Ray processes that left our process groups still carry our unique temp dir.
        strays = _pids_referencing(self.temp_dir)
        signalled += [pid for pid in strays if _kill_pid(pid, signal.SIGKILL)]
        _wait_pids_gone(strays, timeout)
        self._keep_ray_logs()
        shutil.rmtree(self.temp_dir, ignore_errors=True)
        state = Path(self.state_dir)
        if state.exists():
            (state / STATE_FILE).unlink(missing_ok=True)
            (state / TOKEN_FILE).unlink(missing_ok=True)
        return signalled

    def _keep_ray_logs(self) -> None:
        """Ray's own logs live in the temp dir we delete; keep them beside the state for post-mortems."""
        logs = Path(self.temp_dir) / "session_latest" / "logs"
        if logs.is_dir():
            shutil.copytree(
                logs,
                Path(self.state_dir) / "ray-logs",
                dirs_exist_ok=True,
                ignore=shutil.ignore_patterns("*.sock", "events", "export_events"),
            )

    def kill_host(self, slice_index: int, worker_id: int) -> int:
        """Simulate a preempted TPU host: kill that Ray node's whole process group."""
        node = self._host(slice_index, worker_id)
        _log_foreign([node.pid], self.temp_dir, self.name)
        _signal_owned([node.pid], self.temp_dir, signal.SIGKILL)
        return node.pid

    def preempt_host(
        self,
        slice_index: int,
        worker_id: int,
        restart_after: float = 5.0,
        timeout: float = 180.0,
        notice_s: float = 0.0,
        on_drained: Callable[[float], None] | None = None,
    ) -> int:
        """Kill a host, then bring a replacement up in its place, as GKE recreates a preempted TPU VM.

        With a notice, the host's Ray node is first drained with reason PREEMPTION and a deadline that far
        ahead (what the TPU worker pods' preStop hook does on GKE), and killed at the deadline.
        """
        self.pending_preemption = {"slice_index": slice_index, "worker_id": worker_id}
        self.save()
        if notice_s > 0:
            deadline = self.drain_host(slice_index, worker_id, notice_s)
            try:
                if on_drained is not None:
                    on_drained(deadline)
                time.sleep(max(deadline - time.time(), 0.0))
            except KeyboardInterrupt:
                # A drained Ray node never takes work again: interrupted, the preemption ends now rather than
                # leave the slice with a host nothing can use.
                self.finish_preemption(timeout)
                raise
        pid = self.kill_host(slice_index, worker_id)
        time.sleep(restart_after)
        self.replace_host(slice_index, worker_id, timeout)
        self.pending_preemption = None
        self.save()
        return pid

    def finish_preemption(self, timeout: float = 180.0) -> bool:
        """End a preemption whose command was killed (SIGKILL) between draining its host and replacing it: a
        drained Ray node never takes work again, so the host is killed and replaced now. False: none pending."""
        pending = self.pending_preemption
        if not pending:
            return False
        slice_index, worker_id = int(pending["slice_index"]), int(pending["worker_id"])
        logger.warning(
            "Finishing the preemption of simulated host %s/%s that its command left unfinished", slice_index, worker_id
        )
        self.kill_host(slice_index, worker_id)
        self.replace_host(slice_index, worker_id, timeout)
        self.pending_preemption = None
        self.save()
        return True

    def drain_host(self, slice_index: int, worker_id: int, notice_s: float) -> float:
        """Drain a host's Ray node for preemption, ``notice_s`` seconds to its deadline; returns the deadline (unix s)."""
        node = self._host(slice_index, worker_id)
        tpu = TpuSlice.from_dict(self.slice or {})
        ip = host_ip(slice_index, worker_id, tpu.num_hosts)
        alive = [n for n in self.nodes_summary() if n.get("node_ip") == ip and n.get("state") == "ALIVE"]
        if not alive:
            raise LocalClusterError(f"simulated host {node.slice_name}/worker-{worker_id} ({ip}) has no live Ray node")
        seconds = max(1, round(notice_s))
        message = f"tpuflow local preempt: {node.slice_name}/worker-{worker_id}"
        args = drain_node_args(seconds, message, node_id=alive[0]["node_id"], address=self.gcs_address)
        done = subprocess.run(
            [str(Path(sys.executable).parent / "ray"), *args],
            env={**os.environ, **self.client_env()},
            capture_output=True,
            text=True,
            timeout=120,
        )
        if done.returncode != 0:
            raise LocalClusterError(f"ray drain-node failed: {_last_line(done.stderr or done.stdout)}")
        # Ray set its deadline when the command ran: killing no earlier than this gives the full notice
        return time.time() + seconds

    def replace_host(self, slice_index: int, worker_id: int, timeout: float = 180.0) -> None:
        """Start a new Ray node in place of a (killed) host.

        The replacement carries the same slice name and worker id, so a slice placement group
        (and Ray Train restarting its workers from the last checkpoint) can be satisfied again.
        """
        if self.slice is None:
            raise LocalClusterError("this cluster simulates no TPU slice")
        old = self._host(slice_index, worker_id)
        _signal_owned([old.pid], self.temp_dir, signal.SIGKILL)
        self.nodes.remove(old)
        self.save()
        tpu = TpuSlice.from_dict(self.slice)
        self._start_host(tpu, slice_index, worker_id, self._base_env(tpu, None), self.host_cpus, timeout)
        self.save()

    def set_unreachable(self, slice_index: int, worker_id: int, unreachable: bool = True) -> str:
        """Make one simulated host unreachable for collectives (or reachable again); returns its name.

        Ray still reaches it (actors start, calls answer), but its actors never join a collective,
        so the slice preflight must find and name it."""
        node = self._host(slice_index, worker_id)
        flag = self._unreachable_flag(node.slice_name, worker_id)
        if unreachable:
            flag.parent.mkdir(parents=True, exist_ok=True)
            flag.touch()
        else:
            flag.unlink(missing_ok=True)
        return f"{node.slice_name}/worker-{worker_id}"

    def _unreachable_flag(self, slice_name: str, worker_id: int) -> Path:
        return Path(self.state_dir) / "unreachable" / f"{slice_name}-w{worker_id}"

    def _host(self, slice_index: int, worker_id: int) -> NodeProcess:
        for node in self.nodes:
            if (
                node.role == "tpu-host"
                and node.worker_id == worker_id
                and node.slice_name == slice_name(self.name, slice_index)
            ):
                return node
        raise UserInputError(
            "host", f"{slice_index}/{worker_id}", "no such simulated host in this cluster; see `tpuflow local status`"
        )

    # --- state -------------------------------------------------------------
    def mark_kept(self) -> None:
        """Record that it is kept on purpose (keep_endpoint): the reaper leaves it, and it no longer expires."""
        self.kept, self.expires_at = True, None
        self.save()

    def save(self) -> None:
        path = Path(self.state_dir) / STATE_FILE
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=2))
        tmp.replace(path)

    @classmethod
    def load(cls, state_dir: Path | str) -> LocalRayCluster:
        """The cluster recorded in ``state_dir``. Its state names the folders stop() deletes: they must be this
        folder and a temp dir of ours (``/tmp/tpf-*``, owned by this user), else LocalClusterError."""
        data = json.loads((Path(state_dir) / STATE_FILE).read_text())
        data["nodes"] = [NodeProcess(**n) for n in data.get("nodes", [])]
        cluster = cls(**data)
        if Path(cluster.state_dir).resolve() != Path(state_dir).resolve():
            raise LocalClusterError(f"the state in {state_dir} names another folder ({cluster.state_dir}): not ours")
        _check_own_temp_dir(cluster.temp_dir)
        return cluster

    def is_alive(self) -> bool:
        head = next((n for n in self.nodes if n.role == "head"), None)
        return head is not None and bool(_owned_alive([head.pid], self.temp_dir))

    def auth_token(self) -> str | None:
        path = Path(self.state_dir) / TOKEN_FILE
        return path.read_text().strip() if path.exists() else None

    def auth_headers(self) -> dict[str, str]:
        token = self.auth_token()
        return {"Authorization": f"Bearer {token}"} if token else {}

    @property
    def serve_url(self) -> str:
        return f"http://127.0.0.1:{self.serve_port}"

    @property
    def metrics_url(self) -> str:
        """The head's Prometheus endpoint (Ray's metrics exporter); "" for a cluster started without one."""
        return f"http://127.0.0.1:{self.metrics_port}/metrics" if self.metrics_port else ""

    def client_env(self) -> dict[str, str]:
        """Environment a local process needs to use this cluster with the Ray CLI or ray.init()."""
        return {
            "RAY_ADDRESS": self.gcs_address,
            "RAY_API_SERVER_ADDRESS": self.dashboard_url,
            "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN_PATH": str(Path(self.state_dir) / TOKEN_FILE),
            # without it Ray's CLI and ray.init() turn the head's 127.0.0.1 into this machine's network address
            "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
        }

    def connection_info(self) -> dict[str, Any]:
        """What downstream tasks need (XCom): addresses, never the token itself."""
        return {
            "backend": "local",
            "name": self.name,
            "dashboard_url": self.dashboard_url,
            "serve_url": self.serve_url,
            "serve_port": self.serve_port,
            "metrics_url": self.metrics_url,
            "gcs_address": self.gcs_address,
            "state_dir": self.state_dir,
            "auth_token_path": str(Path(self.state_dir) / TOKEN_FILE),
            # The interpreter whose environment the nodes run: job entrypoints saying `python` use it.
            "python": str(Path(sys.executable).parent / "python"),
            "slice": self.slice,
        }

    def nodes_summary(self) -> list[dict[str, Any]]:
        resp = requests.get(f"{self.dashboard_url}/api/v0/nodes", headers=self.auth_headers(), timeout=10)
        resp.raise_for_status()
        return cast(list[dict[str, Any]], resp.json()["data"]["result"]["result"])

    # --- internals -------------------------------------------------------------
    def _base_env(self, tpu: TpuSlice | None, extra: dict[str, str] | None) -> dict[str, str]:
        # an allowlist of the launching process's environment: never its Airflow secrets (tpuflow.local.node_env)
        env = node_environment(os.environ)
        env.update(
            {
                "RAY_AUTH_MODE": "token",
                "RAY_AUTH_TOKEN_PATH": str(Path(self.state_dir) / TOKEN_FILE),
                "RAY_USAGE_STATS_ENABLED": "0",
                # Loopback stays loopback (the head binds 127.0.0.1; drivers reach it there): tpuflow.local.ray_node.
                "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
                # No Prometheus exporter on a simulated host: it would listen on every interface and answer
                # without the token. The head's (on 127.0.0.1 only: _start_head) serves Serve's counters.
                "RAY_enable_metrics_collection": "0",
                # A raylet starts as many idle workers as it has CPUs when a job's driver registers; hosts have
                # a CPU per chip but share this machine's cores: start workers when work asks for them.
                "RAY_prestart_worker_first_driver": "0",
                # Every process of the cluster inherits it, Ray's workers too (they leave the nodes' process
                # groups and rename themselves ray::..., so no command line names the temp dir): stop() finds
                # them by it rather than returning while they still exit.
                CLUSTER_ENV: self.temp_dir,
                # Several nodes booting at once on 2 cores can exceed the default 30 s registration wait,
                # and on a loaded machine (load 20 on 2 cores) a head needs about 3 minutes.
                "RAY_raylet_start_wait_time_s": str(int(120 * _load_factor())),
                "RAY_agent_register_timeout_ms": str(int(120000 * _load_factor())),
                "JAX_PLATFORMS": "cpu",
                # Job entrypoints say `python ...`: it must be this environment's interpreter.
                "PATH": os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")]),
                # tpuflow's CPU stand-in for torch_tpu, so TorchTrainer(use_tpu=True) runs through Ray's own
                # TPU path on simulated hosts; only on this cluster's processes, never on a real slice's.
                "PYTHONPATH": os.pathsep.join(p for p in (simulated_tpu_path(), env.get("PYTHONPATH", "")) if p),
            }
        )
        if tpu is not None:
            env.update(tpu.ray_env)
        env.update(extra or {})
        return env

    def _spawn(
        self,
        role: str,
        args: list[str],
        env: dict[str, str],
        node_ip: str,
        slice_name: str = "",
        worker_id: int = -1,
        metrics_port: int = 0,
    ) -> None:
        label = "head" if role == "head" else f"{slice_name}-w{worker_id}"
        log = Path(self.state_dir) / f"{label}.log"
        node_temp = f"{self.temp_dir}/n{sum(1 for _ in Path(self.temp_dir).iterdir())}"
        cmd = [
            sys.executable,
            "-m",
            "tpuflow.local.ray_node",
            "start",
            "--block",
            f"--node-ip-address={node_ip}",
            # Each node gets its own temp dir, as on separate VMs: a shared one makes every node's
            # log monitor forward every node's logs, and nodes race unpacking runtime_env packages.
            # Short names: Ray's unix socket paths under it must stay below ~107 bytes.
            f"--temp-dir={node_temp}",
            "--disable-usage-stats",
            "--object-store-memory=200000000",
            f"--dashboard-agent-listen-port={free_port()}",
            f"--metrics-export-port={metrics_port or free_port()}",
            f"--runtime-env-agent-port={free_port()}",
            f"--dashboard-agent-grpc-port={free_port()}",
            f"--node-manager-port={free_port()}",
            f"--object-manager-port={free_port()}",
            *args,
        ]
        with open(log, "ab") as out:
            proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        self.nodes.append(
            NodeProcess(
                role=role, pid=proc.pid, log=str(log), slice_name=slice_name, worker_id=worker_id, temp_dir=node_temp
            )
        )

    def _start_head(self, cpus: int, env: dict[str, str], timeout: float) -> None:
        def spawn() -> None:
            gcs_port, dash_port = free_port(), free_port()
            self.gcs_address = f"{HEAD_IP}:{gcs_port}"
            self.dashboard_url = f"http://127.0.0.1:{dash_port}"
            args = [
                "--head",
                f"--port={gcs_port}",
                "--dashboard-host=127.0.0.1",
                f"--dashboard-port={dash_port}",
                "--include-dashboard=true",
                f"--num-cpus={cpus}",
                f"--ray-client-server-port={free_port()}",
            ]
            # The Serve proxy runs on the head (proxy_location HeadOnly): its request counters are what an
            # idle endpoint is judged by (tpuflow.serve.idle). Ray binds the exporter to 127.0.0.1 here.
            self.metrics_port = free_port()
            head_env = {**env, "RAY_enable_metrics_collection": "1"}
            self._spawn("head", args, head_env, HEAD_IP, metrics_port=self.metrics_port)

        def ready(deadline: float) -> None:
            self._wait_for_dashboard(deadline)
            self._wait_for_nodes(1, deadline)  # hosts joining before the head registered are refused

        self._start_with_retries(spawn, ready, timeout)

    def _start_host(
        self, tpu: TpuSlice, slice_index: int, worker_id: int, env: dict[str, str], cpus: int, timeout: float
    ) -> None:
        name = slice_name(self.name, slice_index)
        args = [
            f"--address={self.gcs_address}",
            f"--num-cpus={cpus}",
            f"--resources={json.dumps(tpu.ray_worker_resources)}",
        ]
        hostnames = [host_ip(slice_index, w, tpu.num_hosts) for w in range(tpu.num_hosts)]
        host_env = {
            **env,
            **tpu.simulated_host_env(name, worker_id, hostnames),
            UNREACHABLE_FLAG_ENV: str(self._unreachable_flag(name, worker_id)),
        }

        def spawn() -> None:
            self._spawn("tpu-host", args, host_env, hostnames[worker_id], slice_name=name, worker_id=worker_id)

        def ready(deadline: float) -> None:
            # One at a time: nodes sharing a temp dir race for the same socket names.
            self._wait_for_nodes(len(self.nodes), deadline)

        self._start_with_retries(spawn, ready, timeout)

    def _start_with_retries(
        self, spawn: Callable[[], None], ready: Callable[[float], None], timeout: float, attempts: int = 3
    ) -> None:
        """Start one node, retrying a node that failed to boot.

        On a loaded 2-core machine a node's dashboard agent can miss the raylet's fixed start
        deadline; the raylet then aborts (and `ray start` may linger), while a second attempt
        succeeds. Each attempt gets a bounded share of the overall timeout, longer on a loaded
        machine: a node that is slow to boot is not a node that failed (at load 12 on 2 cores a
        host needs more than 90 s), and killing it only starts the same slow boot again.
        """
        per_attempt = max(30.0, min(timeout, 90.0 * _load_factor()))
        for attempt in range(attempts):
            spawn()
            self.save()
            try:
                ready(per_attempt)
                return
            except LocalClusterError:
                _kill_node(self.nodes.pop(), self.temp_dir)
                self.save()
                if attempt == attempts - 1:
                    raise

    def _wait_for_dashboard(self, timeout: float) -> None:
        deadline = time.time() + timeout
        while time.time() < deadline:
            if not self.is_alive():
                raise LocalClusterError(
                    f"Ray head exited during start; see {self.nodes[0].log}:\n{_tail(self.nodes[0].log)}"
                )
            try:
                if requests.get(f"{self.dashboard_url}/api/version", headers=self.auth_headers(), timeout=2).ok:
                    return
            except requests.RequestException:
                pass
            time.sleep(0.5)
        raise LocalClusterError(f"Ray dashboard did not answer within {timeout:.0f}s; see {self.nodes[0].log}")

    def _wait_for_nodes(self, count: int, timeout: float) -> None:
        deadline = time.time() + timeout
        alive = 0
        while time.time() < deadline:
            # a raylet that aborted while its `ray start` lingers: the node will never join, retry it now
            failed = _exited_raylets([n.pid for n in self.nodes])
            live = set(_owned_alive([n.pid for n in self.nodes], self.temp_dir))
            dead = [n for n in self.nodes if n.pid in failed or n.pid not in live]
            if dead:
                raise LocalClusterError(f"Ray node {dead[0].role} exited during start:\n{_tail(dead[0].log)}")
            try:
                alive = sum(1 for n in self.nodes_summary() if n.get("state") == "ALIVE")
            except (requests.RequestException, KeyError, ValueError):
                alive = 0
            if alive >= count:
                return
            time.sleep(0.5)
        raise LocalClusterError(f"only {alive} of {count} Ray nodes joined within {timeout:.0f}s")


def _load_factor() -> float:
    """How many times busier than its cores the machine is (1.0 when idle or unknown)."""
    try:
        return max(1.0, os.getloadavg()[0] / (os.cpu_count() or 1))
    except OSError:
        return 1.0


def _group_alive(pgid: int) -> bool:
    """Whether any live (non-zombie) process is left in the process group (any process's: for a pid read
    back from a state file, ask _owned_alive)."""
    return bool(_groups_alive([pgid]))


def _live(pid: int) -> bool:
    """Whether `pid` is a running (non-zombie) process."""
    try:
        # /proc/<pid>/stat: "pid (comm) state ppid pgrp ..."; comm may contain spaces.
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _pgrp_of(pid: int) -> int | None:
    """The process group of a live (non-zombie) `pid`, else None."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return int(fields[2]) if fields[0] != "Z" else None


def _exited_raylets(groups: list[int]) -> set[int]:
    """The process groups of `groups` whose raylet has exited unreaped (a zombie: its `ray start` lingers)."""
    found = set()
    for pid in _all_pids():
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if fields[0] == "Z" and stat[stat.find("(") + 1 : stat.rfind(")")] == "raylet" and int(fields[2]) in groups:
            found.add(int(fields[2]))
    return found


def _all_pids() -> list[int]:
    return [int(e.name) for e in Path("/proc").iterdir() if e.name.isdigit()]


def _groups_alive(groups: list[int]) -> list[int]:
    """The process groups of `groups` with a live (non-zombie) process.

    ``killpg(pgid, 0)`` answers for a group that is gone and the leader's /proc entry for a group
    whose leader runs, so only a group whose leader is gone while something of it remains (members
    left, or zombies nobody reaped yet) costs a scan of /proc, and then one scan for all of them.
    """
    maybe = []
    for pgid in groups:
        try:
            os.waitpid(pgid, os.WNOHANG)  # reap our own child leader, if it is ours
        except ChildProcessError:
            pass
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            continue
        except PermissionError:
            pass
        maybe.append(pgid)
    unsure = [g for g in maybe if not _live(g)]
    if not unsure:
        return maybe
    live_groups = {_pgrp_of(pid) for pid in _all_pids()}
    return [g for g in maybe if g not in unsure or g in live_groups]


def _wait_pids_gone(pids: list[int], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while any(_live(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)


def _kill_node(node: NodeProcess, marker: str, timeout: float = 10.0) -> None:
    """SIGKILL a node that failed to start: its process group and any process naming its temp dir,
    then wait until they are gone, so a retried start leaves nothing of the failed attempt behind.
    `marker`: the cluster's temp dir; only processes naming it are signalled (_references)."""
    _signal_owned([node.pid], marker, signal.SIGKILL)
    _wait_owned_gone([node.pid], marker, timeout)
    strays = _pids_referencing(node.temp_dir) if node.temp_dir else []
    for pid in strays:
        _kill_pid(pid, signal.SIGKILL)
    _wait_pids_gone(strays, timeout)


def _signal_group(pgid: int, sig: int) -> None:
    """Signal a process group we just started ourselves; a pid read back from a state file goes through
    _signal_owned instead."""
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


def _kill_pid(pid: int, sig: int) -> bool:
    """Signal one pid already proven ours; whether it was there to signal."""
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        return False
    return True


# --- ownership: a pid read from state.json may be anyone's after a reboot or a pid wrap ---------------------
def _references(pid: int, marker: str) -> bool:
    """Whether process `pid` provably belongs to the cluster whose temp dir is `marker`: its environment has
    CLUSTER_ENV=`marker` (every process the cluster starts inherits it), or its command line names `marker`
    or a path under it. A process we cannot read (gone, a zombie, another user's) is not ours."""
    want = marker.rstrip("/").encode()
    if not want.startswith(b"/"):  # "" or a relative marker would match the wrong command lines
        return False
    if any(_has_env(pid, CLUSTER_ENV, value) for value in {marker, want.decode()}):
        return True
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
    except OSError:
        return False
    at = cmdline.find(want)
    while at >= 0:
        after = cmdline[at + len(want) : at + len(want) + 1]
        if after in (b"", b" ", b"/"):  # not /tmp/tpf-x/n1 inside /tmp/tpf-x/n10
            return True
        at = cmdline.find(want, at + 1)
    return False


def _has_env(pid: int, name: str, value: str) -> bool:
    """Whether process `pid` was started with `name`=`value` in its environment (False: unreadable, e.g. gone,
    a zombie, or another user's process)."""
    try:
        return f"{name}={value}".encode() in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return False


def _wait_exec_settled(pid: int, wait: float = 10.0) -> None:
    """Wait (at most `wait`) until `pid`'s command line reads non-empty.

    Popen returns while its child's exec is still under way, and until the new program is loaded its command
    line and environment read empty (measured here: one Popen in three, for milliseconds; longer on a loaded
    machine): an ownership test then would call a node just started foreign. Only kernel threads (children
    of kthreadd, pid 2) and zombies keep an empty command line; they are not waited for."""
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        try:
            if Path(f"/proc/{pid}/cmdline").read_bytes():
                return
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            return
        if pid == 2 or fields[1] == "2" or fields[0] == "Z":
            return
        time.sleep(0.002)


# What proves a process ours: a cluster's temp dir (see _references), or a test of the pid.
Ours = str | Callable[[int], bool]


def _ours(ours: Ours) -> Callable[[int], bool]:
    test = (lambda pid: _references(pid, ours)) if isinstance(ours, str) else ours

    def settled_test(pid: int) -> bool:
        _wait_exec_settled(pid)
        return test(pid)

    return settled_test


def _owned_targets(groups: list[int], ours: Ours) -> tuple[list[int], dict[int, list[int]], list[int]]:
    """What of the recorded process groups `groups` is provably ours now (`ours`: see Ours).

    Returns (groups whose live leader is ours: signal the group; {group: its live members that are ours}
    for groups whose leader is gone; recorded pids that live but are not ours: treat those nodes as gone).
    Linux never hands out a pid while a process group of that id exists, so a live leader that is not ours
    means our group is gone, and a group whose leader is gone keeps its id for the members left.
    """
    is_ours = _ours(ours)
    leaders: list[int] = []
    foreign: list[int] = []
    leaderless: list[int] = []
    for pgid in groups:
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(pgid, os.WNOHANG)  # reap our own child leader, if it is ours and exited
        if not _live(pgid):
            leaderless.append(pgid)
        elif is_ours(pgid):
            leaders.append(pgid)
        else:
            foreign.append(pgid)
    members: dict[int, list[int]] = {}
    if leaderless:
        me = os.getpid()
        for pid in _all_pids():
            group = _pgrp_of(pid)
            if group in leaderless and pid != me and is_ours(pid):
                members.setdefault(group, []).append(pid)
    return leaders, members, foreign


def _owned_alive(groups: list[int], ours: Ours) -> list[int]:
    """The recorded process groups `groups` with a live process that is provably ours."""
    leaders, members, _ = _owned_targets(groups, ours)
    return [g for g in groups if g in leaders or g in members]


def _signal_owned(groups: list[int], ours: Ours, sig: int) -> list[int]:
    """Send `sig` to what of `groups` is provably ours (see _owned_targets): a group whose leader is ours
    as a whole, else its members that are ours one by one; returns the groups and pids signalled."""
    leaders, members, _ = _owned_targets(groups, ours)
    signalled = []
    for pgid in leaders:
        if _pgrp_of(pgid) == pgid:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, sig)
                signalled.append(pgid)
        elif _kill_pid(pgid, sig):  # ours, but no longer leading its group: only itself
            signalled.append(pgid)
    for pids in members.values():
        signalled += [pid for pid in pids if _kill_pid(pid, sig)]
    return signalled


def _wait_owned_gone(groups: list[int], ours: Ours, timeout: float) -> bool:
    """Wait until no process of `groups` that is ours lives; False if some still do at `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        left = _owned_alive(groups, ours)
        if not left or time.monotonic() >= deadline:
            return not left
        time.sleep(0.05)


def _log_foreign(groups: list[int], marker: str, name: str) -> None:
    """Say (at info) which recorded pids now belong to other processes, and that they are left alone."""
    for pid in _owned_targets(groups, marker)[2]:
        logger.info(
            "local cluster %s: pid %d is no longer one of its processes (neither %s on its command line nor "
            "%s=%s in its environment); treating that node as gone, not signalling it",
            name, pid, marker or "(no temp dir recorded)", CLUSTER_ENV, marker,
        )  # fmt: skip


def _pids_referencing(marker: str) -> list[int]:
    """Pids whose command line names the path `marker` (our unique temp dir) or a path under it, or whose
    environment has CLUSTER_ENV=`marker` (a cluster's Ray workers)."""
    me = os.getpid()
    return [pid for pid in _all_pids() if pid != me and _references(pid, marker)]


def _tail(path: str, lines: int = 30) -> str:
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def _last_line(text: str) -> str:
    lines = [line for line in (text or "").splitlines() if line.strip()]
    return lines[-1] if lines else "no output"
