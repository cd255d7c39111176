"""One pod run as a kubelet runs it, with local processes for containers: its network namespace (network.py),
init containers in order, then its containers, restarts by restartPolicy with CrashLoopBackOff, readiness,
liveness and startup probes (exec, httpGet, tcpSocket), and the status the kubelet reports.

Each container's process runs in the pod's network namespace and a private mount namespace where /usr/local/bin
holds the "image" (shims for this environment's ``ray`` and ``python``: the agent runs no container images; a
login shell's PATH starts there), /tmp/ray is the pod's own folder (Ray's sessions and sockets: every Ray node of a
cluster uses the head's temp dir, so pods sharing one would collide) and emptyDir, Secret and ConfigMap volumes are
mounted at their paths; HOME is the pod's own folder. The rest of the file system is the machine's: the virtual
environment, the workloads and local output folders are where they are here. Termination: SIGTERM to every process in the pod's network namespace, SIGKILL after
the grace period (a pod's processes are exactly those of its namespace, as a container's cgroup holds them).
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import threading
import time
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from http.client import HTTPResponse
from pathlib import Path
from typing import Any, cast

from tpuflow_rehearsal.nodes.network import PodInterface, PodNetwork
from tpuflow_rehearsal.nodes.node_registry import now
from tpuflow_rehearsal.nodes.pod_env import Lookup, container_env, expand
from tpuflow_rehearsal.supervise import die_with_parent

BACKOFF_S = (10, 20, 40, 80, 160, 300)
SANDBOX_RETRY_S = (1, 2, 4, 8, 15)


@dataclass
class Probe:
    spec: Mapping[str, Any]
    successes: int = 0
    failures: int = 0
    next_at: float = 0.0

    @property
    def period(self) -> float:
        return float(self.spec.get("periodSeconds") or 10)

    @property
    def timeout(self) -> float:
        return float(self.spec.get("timeoutSeconds") or 1)


@dataclass
class ContainerRun:
    spec: Mapping[str, Any]
    init: bool = False
    proc: subprocess.Popen[bytes] | None = None
    restarts: int = 0
    started_at: str | None = None
    started_mono: float = 0.0
    exit_code: int | None = None
    finished_at: str | None = None
    last_terminated: dict[str, Any] | None = None
    waiting: str | None = "ContainerCreating"
    waiting_message: str = ""
    restart_at: float = 0.0
    ready: bool = False
    started: bool = False  # startup probe passed (or none)
    probes: dict[str, Probe] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return str(self.spec.get("name"))

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def status(self, image_id: str) -> dict[str, Any]:
        if self.running():
            state: dict[str, Any] = {"running": {"startedAt": self.started_at}}
        elif self.exit_code is not None and self.waiting is None:
            state = {
                "terminated": {
                    "exitCode": self.exit_code,
                    "reason": "Completed" if self.exit_code == 0 else "Error",
                    "startedAt": self.started_at,
                    "finishedAt": self.finished_at,
                }
            }
        else:
            state = {
                "waiting": {
                    "reason": self.waiting or "ContainerCreating",
                    **({"message": self.waiting_message} if self.waiting_message else {}),
                }
            }
        out: dict[str, Any] = {
            "name": self.name,
            "image": str(self.spec.get("image", "")),
            "imageID": image_id,
            "containerID": f"tpuflow://{self.proc.pid}" if self.proc else "",
            "ready": bool(self.ready and self.running()),
            "restartCount": self.restarts,
            "started": bool(self.running() and self.started),
            "state": state,
        }
        if self.last_terminated:
            out["lastState"] = {"terminated": self.last_terminated}
        return out


@dataclass
class RunContext:
    """What every pod run shares: the agent's network, folders, base environment and API lookups."""

    network: PodNetwork
    workdir: Path
    image_bin: Path
    base_env: Mapping[str, str]
    node_env: Callable[[str], Mapping[str, str]]  # node name -> what its metadata server tells (TPU_*)
    host_address: Callable[[str], str]  # node name -> the node's InternalIP
    lookup: Callable[[str], Lookup]  # namespace -> Secret / ConfigMap lookup
    write_hosts: Callable[[str, str, str], None]  # (pod uid, hostname, ip): the pod's /etc/hosts, now
    log: Callable[[str], None]


class PodRun:
    def __init__(self, pod: Mapping[str, Any], ctx: RunContext) -> None:
        self.pod = json.loads(json.dumps(pod))  # our own copy
        self.ctx = ctx
        meta = self.pod["metadata"]
        self.uid, self.name, self.namespace = meta["uid"], meta["name"], meta.get("namespace", "default")
        self.node = self.pod["spec"]["nodeName"]
        self.hostname = str(self.pod["spec"].get("hostname") or self.name)[:63]
        self.dir = ctx.workdir / "pods" / f"{self.namespace}_{self.name}_{self.uid[:8]}"
        # short: Ray's Unix sockets live under it (108 bytes at most for a socket path)
        self.tmp = Path("/tmp") / f"tpf{ctx.network.index}-{self.uid[:8]}"
        spec = self.pod["spec"]
        self.init = [ContainerRun(c, init=True) for c in spec.get("initContainers") or []]
        self.containers = [ContainerRun(c) for c in spec.get("containers") or []]
        for run in self.containers:
            for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
                if run.spec.get(kind):
                    run.probes[kind] = Probe(run.spec[kind])
            run.started = "startupProbe" not in run.probes
        self.iface: PodInterface | None = None
        self.start_time: str | None = None
        self.initialized = not self.init
        self.failed_reason = ""
        self.waiting_reason = ""  # why the pod's sandbox is not there yet (the kubelet's event)
        self.terminating = False
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # --- lifecycle -----------------------------------------------------------------------------------------
    def start(self) -> None:
        self.start_time = self.start_time or now()
        if self.failed_reason:  # after_node_restart: nothing may start again
            return
        self._thread = threading.Thread(target=self._run, name=f"pod-{self.name}", daemon=True)
        self._thread.start()

    def _sandbox(self) -> None:
        self.iface = self.ctx.network.add_pod(self.uid)
        self.pod.setdefault("status", {}).update(podIP=self.iface.ip, hostIP=self.ctx.host_address(self.node))
        self.dir.mkdir(parents=True, exist_ok=True)
        self.tmp.mkdir(parents=True, exist_ok=True)
        self.tmp.chmod(0o1777)
        self._write_volumes()
        self.ctx.write_hosts(self.uid, self.hostname, self.iface.ip)

    def _run(self) -> None:
        for delay in SANDBOX_RETRY_S:  # a kubelet retries a sandbox it could not make, and says so
            try:
                self._sandbox()
                break
            except Exception as err:  # noqa: BLE001 - reported as the pod's sandbox failure, as a kubelet does
                self.iface = None
                self.waiting_reason = f"FailedCreatePodSandBox: {err}"
                self.ctx.log(f"pod {self.namespace}/{self.name}: {self.waiting_reason}; retrying in {delay} s")
                if self._stop.wait(delay):
                    return
        else:
            self.failed_reason = self.waiting_reason
            return
        self.waiting_reason = ""
        policy = str(self.pod["spec"].get("restartPolicy") or "Always")
        for run in self.init:
            while not self._stop.is_set():
                self._launch(run)
                code = run.proc.wait() if run.proc else 1
                self._exited(run, code)
                if code == 0:
                    break
                if policy == "Never":
                    self.failed_reason = f"init container {run.name} failed ({code})"
                    return
                self._back_off(run)
                self._stop.wait(max(run.restart_at - time.monotonic(), 0))
                run.restarts += 1
            if self._stop.is_set():
                return
        self.initialized = True
        for run in self.containers:
            self._launch(run)
        while not self._stop.wait(0.5):
            for run in self.containers:
                self._watch(run, policy)

    def _back_off(self, run: ContainerRun) -> None:
        """CrashLoopBackOff: the next start of ``run`` waits 0, 10, 20, ... 300 s by its restarts so far."""
        delay = BACKOFF_S[min(run.restarts, len(BACKOFF_S) - 1)] if run.restarts else 0
        run.waiting, run.restart_at = "CrashLoopBackOff", time.monotonic() + delay
        run.waiting_message = f"back-off {delay}s restarting failed container={run.name} pod={self.name}"

    def _watch(self, run: ContainerRun, policy: str) -> None:
        if run.proc is not None and run.proc.poll() is not None and run.waiting is None and run.exit_code is None:
            self._exited(run, run.proc.returncode)
        if not run.running():
            if run.exit_code is None:
                return
            again = policy == "Always" or (policy == "OnFailure" and run.exit_code != 0)
            if not again or self.terminating:
                return
            if run.waiting != "CrashLoopBackOff":
                self._back_off(run)
            if time.monotonic() >= run.restart_at:
                run.restarts += 1
                self._launch(run)
            return
        self._probe(run)

    def _exited(self, run: ContainerRun, code: int) -> None:
        run.exit_code, run.finished_at, run.ready = code, now(), False
        run.last_terminated = {
            "exitCode": code,
            "reason": "Completed" if code == 0 else "Error",
            "startedAt": run.started_at,
            "finishedAt": run.finished_at,
        }
        run.waiting = None
        self.ctx.log(f"pod {self.namespace}/{self.name}: container {run.name} exited {code}")

    # --- processes -----------------------------------------------------------------------------------------
    def _env(self, run: ContainerRun) -> dict[str, str]:
        base = {
            **self.ctx.base_env,
            "HOME": str(self.dir / "home"),
            "HOSTNAME": self.hostname,
        }
        if any(((run.spec.get("resources") or {}).get(p) or {}).get("google.com/tpu") for p in ("limits", "requests")):
            base.update(self.ctx.node_env(self.node))
        return container_env(self.pod, run.spec, self.ctx.lookup(self.namespace), base)

    def _argv(self, run: ContainerRun, env: Mapping[str, str]) -> list[str]:
        command = [expand(str(a), env) for a in run.spec.get("command") or []]
        args = [expand(str(a), env) for a in run.spec.get("args") or []]
        argv = command + args
        if not argv:
            raise ValueError(f"container {run.name} names no command (the node agent runs no image entrypoints)")
        return argv

    def _launch(self, run: ContainerRun) -> None:
        assert self.iface is not None
        try:
            env = self._env(run)
            argv = self._argv(run, env)
        except Exception as err:  # noqa: BLE001 - the kubelet's CreateContainerConfigError
            run.waiting, run.waiting_message = "CreateContainerConfigError", str(err)
            run.exit_code = None
            self.ctx.log(f"pod {self.namespace}/{self.name}: {err}")
            return
        (self.dir / "home").mkdir(exist_ok=True)
        script = self.dir / f"{run.name}.entry.sh"
        script.write_text(self._prelude(run))
        log = open(self.dir / f"{run.name}.log", "ab")  # noqa: SIM115 - handed to the child
        try:
            # forked by the pod's own thread, which lives as long as the pod's processes (the parent-death signal
            # follows the forking thread); tpuflow_rehearsal.supervise.spawn's one thread made pods start twice as slowly
            run.proc = subprocess.Popen(
                [
                    "ip",
                    "netns",
                    "exec",
                    self.iface.netns,
                    # its own mount, host name and process ids, as a container has; --kill-child with the parent-death
                    # signal below: when the agent's process dies, every process of the pod dies with it, as a
                    # node's containers die with their VM (nothing of a SIGKILLed rehearsal keeps running)
                    "unshare",
                    "--mount",
                    "--uts",
                    "--pid",
                    "--fork",
                    "--kill-child",
                    "--mount-proc",
                    "--propagation",
                    "private",
                    "--",
                    "bash",
                    str(script),
                    *argv,
                ],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
                preexec_fn=die_with_parent(os.getpid()),
            )
        finally:
            log.close()
        run.started_at, run.started_mono = now(), time.monotonic()
        run.exit_code, run.waiting, run.waiting_message, run.ready = None, None, "", False
        for probe in run.probes.values():
            probe.successes = probe.failures = 0
            probe.next_at = time.monotonic() + float(probe.spec.get("initialDelaySeconds") or 0)
        run.started = "startupProbe" not in run.probes

    def _prelude(self, run: ContainerRun) -> str:
        lines = [
            "set -e",
            # the pod's own hostname (its UTS namespace), which its /etc/hosts maps to its address: libraries that
            # resolve their host's name (gloo, JAX's coordination service) find the pod, as on GKE
            f"hostname {shlex.quote(self.hostname)}",
            f"mount --bind {shlex.quote(str(self.ctx.image_bin))} /usr/local/bin",
            # /tmp/ray is each pod's own, as each VM has its own /tmp: Ray nodes that join a cluster take the
            # head's temp dir (/tmp/ray), and their sockets must not meet another pod's there
            "mkdir -p /tmp/ray",
            f"mount --bind {shlex.quote(str(self.tmp))} /tmp/ray",
        ]
        volumes = {v.get("name"): v for v in self.pod["spec"].get("volumes") or []}
        for mount in run.spec.get("volumeMounts") or []:
            source = self.dir / "volumes" / str(mount.get("name"))
            target = str(mount.get("mountPath", ""))
            volume = volumes.get(mount.get("name")) or {}
            if not source.exists() or not target or "projected" in volume:
                continue  # a service-account token: nothing here talks to the API from a pod
            lines.append(
                f"if [ -e {shlex.quote(target)} ] || case {shlex.quote(target)} in /tmp/*|/dev/shm/*) true;; *) false;; esac; "
                f"then mkdir -p {shlex.quote(target)}; mount --bind {shlex.quote(str(source))} {shlex.quote(target)}; fi"
            )
        workdir = run.spec.get("workingDir")
        lines.append(f'cd {shlex.quote(str(workdir))} 2>/dev/null || cd "$HOME"')
        lines.append('exec "$@"')
        return "\n".join(lines) + "\n"

    def _write_volumes(self) -> None:
        lookup = self.ctx.lookup(self.namespace)
        for volume in self.pod["spec"].get("volumes") or []:
            folder = self.dir / "volumes" / str(volume.get("name"))
            if "emptyDir" in volume:
                folder.mkdir(parents=True, exist_ok=True)
                folder.chmod(0o1777)
            for kind, key in (("secrets", "secret"), ("configmaps", "configMap")):
                source = volume.get(key)
                if not source:
                    continue
                name = str(source.get("secretName") or source.get("name") or "")
                data = lookup(kind, name, "")
                if data is None:
                    continue
                folder.mkdir(parents=True, exist_ok=True)
                for item, value in json.loads(data).items():
                    (folder / item).write_text(value)

    # --- probes --------------------------------------------------------------------------------------------
    def _probe(self, run: ContainerRun) -> None:
        for kind, probe in run.probes.items():
            if kind != "startupProbe" and not run.started:
                continue
            if kind == "startupProbe" and run.started:
                continue
            if time.monotonic() < probe.next_at:
                continue
            probe.next_at = time.monotonic() + probe.period
            ok = self._check(run, probe)
            if ok:
                probe.successes, probe.failures = probe.successes + 1, 0
            else:
                probe.failures, probe.successes = probe.failures + 1, 0
            needed = int(probe.spec.get("successThreshold") or 1)
            allowed = int(probe.spec.get("failureThreshold") or 3)
            if kind == "startupProbe":
                if ok:
                    run.started = True
                elif probe.failures >= allowed:
                    self._kill_container(run, "startup probe failed")
            elif kind == "readinessProbe":
                if ok and probe.successes >= needed:
                    run.ready = True
                elif not ok and probe.failures >= allowed:
                    run.ready = False
            elif kind == "livenessProbe" and probe.failures >= allowed:
                self._kill_container(run, "liveness probe failed")
        if "readinessProbe" not in run.probes and run.started:
            run.ready = True

    def _check(self, run: ContainerRun, probe: Probe) -> bool:
        assert self.iface is not None and run.proc is not None
        spec = probe.spec
        try:
            if "exec" in spec:
                argv = [str(a) for a in (spec["exec"].get("command") or [])]
                done = subprocess.run(
                    ["nsenter", "--target", str(run.proc.pid), "--net", "--mount", "--uts", "--", *argv],
                    capture_output=True,
                    timeout=probe.timeout + 1,
                    env=self._env(run),
                    check=False,
                )
                return done.returncode == 0
            if "httpGet" in spec:
                get = spec["httpGet"]
                port = self._port(run, get.get("port"))
                url = f"{str(get.get('scheme') or 'HTTP').lower()}://{self.iface.ip}:{port}{get.get('path') or '/'}"
                with cast(HTTPResponse, urllib.request.urlopen(url, timeout=probe.timeout)) as response:
                    return 200 <= response.status < 400
            if "tcpSocket" in spec:
                with socket.create_connection(
                    (self.iface.ip, self._port(run, spec["tcpSocket"].get("port"))), probe.timeout
                ):
                    return True
        except (OSError, subprocess.TimeoutExpired, ValueError):
            return False
        return False

    def _port(self, run: ContainerRun, port: Any) -> int:
        if isinstance(port, int) or str(port).isdigit():
            return int(port)
        for item in run.spec.get("ports") or []:
            if item.get("name") == port:
                return int(item["containerPort"])
        raise ValueError(f"no port named {port}")

    def _kill_container(self, run: ContainerRun, why: str) -> None:
        self.ctx.log(f"pod {self.namespace}/{self.name}: container {run.name}: {why}; restarting it")
        if run.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(run.proc.pid, signal.SIGKILL)

    def after_node_restart(self, reported: Mapping[str, Any]) -> None:
        """This pod's node (the agent and every process) died and came back; ``reported`` is the status last
        written before. As a kubelet after a reboot: a pod whose containers had started fails under restartPolicy
        Never (they cannot start again); under Always and OnFailure they start again, each one more restart."""
        ran = {
            str(c.get("name")): int(c.get("restartCount") or 0)
            for c in reported.get("containerStatuses") or []
            if {"running", "terminated"} & set(c.get("state") or {})
        }
        if not ran:
            return
        self.start_time = reported.get("startTime") or None  # a kubelet keeps the pod's first start time
        if str(self.pod["spec"].get("restartPolicy") or "Always") == "Never":
            self.failed_reason = "the node restarted; the pod's containers are gone and its restartPolicy is Never"
            return
        for run in self.containers:
            if run.name in ran:
                run.restarts = ran[run.name] + 1
                run.last_terminated = {"exitCode": 255, "reason": "Unknown", "finishedAt": now()}

    # --- termination ---------------------------------------------------------------------------------------
    def terminate(self, grace: float, *, pre_stop: bool = True) -> None:
        """Stop every process of the pod (SIGTERM, SIGKILL after ``grace``) and remove its network namespace;
        ``pre_stop=False``: no preStop hook (the node died under the pod)."""
        self.terminating = True
        self._stop.set()
        deadline = time.monotonic() + grace
        if pre_stop:
            self._pre_stop(deadline)
        self._signal_all(signal.SIGTERM)
        while time.monotonic() < deadline and self._pids():
            time.sleep(0.2)
        self._signal_all(signal.SIGKILL)
        for run in [*self.init, *self.containers]:
            if run.proc is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    run.proc.wait(timeout=5)
        if self._thread is not None:
            self._thread.join(timeout=5)
        self.ctx.network.remove_pod(self.uid)
        shutil.rmtree(self.tmp, ignore_errors=True)

    def _pre_stop(self, deadline: float) -> None:
        """Each running container's preStop exec hook, within the grace period (a kubelet runs them first)."""
        hooks = []
        for run in self.containers:
            command = ((run.spec.get("lifecycle") or {}).get("preStop") or {}).get("exec", {}).get("command")
            if command and run.running() and run.proc is not None:
                target = _namespace_init(run.proc.pid)
                argv = [
                    "nsenter",
                    "--target",
                    str(target),
                    "--net",
                    "--mount",
                    "--uts",
                    "--pid",
                    "--",
                    *map(str, command),
                ]
                hooks.append(
                    subprocess.Popen(argv, env=self._env(run), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                )
        for hook in hooks:
            try:
                hook.wait(timeout=max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                hook.kill()
                hook.wait()

    def _pids(self) -> list[int]:
        if self.iface is None:
            return [r.proc.pid for r in [*self.init, *self.containers] if r.proc and r.proc.poll() is None]
        done = subprocess.run(["ip", "netns", "pids", self.iface.netns], capture_output=True, text=True, check=False)
        return [int(p) for p in done.stdout.split() if p.isdigit()]

    def _signal_all(self, sig: int) -> None:
        for run in [*self.init, *self.containers]:
            if run.proc is not None and run.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(run.proc.pid, sig)
        for pid in self._pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)

    # --- status --------------------------------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        """The pod's status as its kubelet reports it (phase, conditions, addresses, container statuses)."""
        image_id = "tpuflow://node-agent"  # no image is pulled: the machine's environment runs
        init = [r.status(image_id) for r in self.init]
        containers = [r.status(image_id) for r in self.containers]
        policy = str(self.pod["spec"].get("restartPolicy") or "Always")
        running = [r for r in self.containers if r.running()]
        ended = [r for r in self.containers if r.exit_code is not None and not r.running()]
        if self.failed_reason and policy == "Never":
            phase = "Failed"
        elif not self.initialized or self.iface is None:
            phase = "Pending"
        elif running or policy == "Always":
            phase = "Running" if running or any(r.restarts for r in self.containers) else "Pending"
        elif len(ended) == len(self.containers) and all(r.exit_code == 0 for r in ended):
            phase = "Succeeded"
        elif len(ended) == len(self.containers) and (policy == "Never" or all(r.exit_code == 0 for r in ended)):
            phase = "Failed"
        else:
            phase = "Running"
        ready = bool(self.containers) and all(r.ready and r.running() for r in self.containers)
        stamp = self.start_time or now()

        def condition(kind: str, ok: bool, reason: str = "") -> dict[str, Any]:
            out: dict[str, Any] = {"type": kind, "status": "True" if ok else "False", "lastTransitionTime": stamp}
            if reason and not ok:
                out["reason"] = reason
            return out

        status: dict[str, Any] = {
            "phase": phase,
            "conditions": [
                condition("PodReadyToStartContainers", self.iface is not None),
                condition("Initialized", self.initialized, "ContainersNotInitialized"),
                condition("Ready", ready, "ContainersNotReady"),
                condition("ContainersReady", ready, "ContainersNotReady"),
                condition("PodScheduled", True),
            ],
            "startTime": self.start_time,
            "containerStatuses": containers,
        }
        if init:
            status["initContainerStatuses"] = init
        if self.iface is not None:
            host = self.ctx.host_address(self.node)
            status.update(podIP=self.iface.ip, podIPs=[{"ip": self.iface.ip}], hostIP=host, hostIPs=[{"ip": host}])
        if self.failed_reason or self.waiting_reason:
            status["message"] = self.failed_reason or self.waiting_reason
        return status


def _namespace_init(unshare_pid: int) -> int:
    """The pod's first process (pid 1 of its pid namespace): ``unshare --fork``'s child. A hook entering the pod
    joins that process's namespaces, its pid namespace too, so its process ids mean the pod's processes."""
    try:
        children = Path(f"/proc/{unshare_pid}/task/{unshare_pid}/children").read_text().split()
    except OSError:
        return unshare_pid
    return int(children[0]) if children else unshare_pid
