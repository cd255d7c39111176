"""`tpuflow standins up|down`: the GKE and Kubernetes stand-ins for gcloud, kubectl and the GKE pipeline.

`up` starts them (with the simulated KubeRay operator) in a background process of its own session on
free loopback ports and writes DIR/kubeconfig and DIR/env.sh; `down` stops exactly that process (by the
pid in DIR/state.json), which stops the Ray clusters it started.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tpuflow.errors import UserInputError
from tpuflow.validation import check_folder, check_seconds

STATE_FILE = "state.json"  # tpuflow.dev.standins.stack.STATE_FILE, without importing the stand-ins here
START_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 90.0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _state(work: Path) -> dict | None:
    path = work / STATE_FILE
    if not path.is_file():
        return None
    try:
        return dict(json.loads(path.read_text()))
    except (OSError, ValueError):
        return None


def _workdir(args: argparse.Namespace) -> Path:
    return Path(check_folder("--workdir", args.workdir)).resolve()  # type: ignore[arg-type]


def _up(args: argparse.Namespace) -> int:
    work = _workdir(args)
    check_seconds("--operation-seconds", args.operation_seconds, allow_zero=True, maximum=3600)
    if args.crds is not None and not (Path(args.crds) / "ray.io_rayclusters.yaml").is_file():
        raise UserInputError("--crds", args.crds, "give the directory holding KubeRay's ray.io_rayclusters.yaml")
    state = _state(work)
    if state and _alive(int(state.get("pid", 0))):
        raise UserInputError(
            "--workdir",
            str(work),
            f"stand-ins already run there (pid {state['pid']}): `tpuflow standins down "
            f"--workdir {work}` first, or pick another directory",
        )
    work.mkdir(parents=True, exist_ok=True)
    (work / STATE_FILE).unlink(missing_ok=True)
    command = [sys.executable, "-m", "tpuflow.dev.standins.stack", "--workdir", str(work)]
    command += ["--operation-seconds", str(args.operation_seconds)]
    if args.fake:
        command.append("--fake")
    if args.crds:
        command += ["--crds", str(Path(args.crds).resolve())]
    log = work / "standins.log"
    with log.open("ab") as out:
        proc = subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
        )
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        state = _state(work)
        if state and state.get("pid") == proc.pid:
            break
        if proc.poll() is not None:
            print(f"tpuflow standins up: the stand-ins exited ({proc.returncode}); see {log}", file=sys.stderr)
            return 1
        time.sleep(0.1)
    else:
        _terminate(proc.pid)
        print(f"tpuflow standins up: not ready after {START_TIMEOUT_S:.0f}s; see {log}", file=sys.stderr)
        return 1
    ray = (
        "simulated (--fake: no Ray processes)"
        if state["fake"]
        else f"real local Ray clusters under {work}/ray-clusters"
    )
    print(f"tpuflow stand-ins running (pid {proc.pid}) in {work}")
    print(
        f"  GKE API:         {state['gke_url']}  (project {state['project']}, zone {state['zone']}, cluster {state['cluster']})"
    )
    print(f"  Kubernetes API:  {state['kubernetes_url']}  (kubeconfig {state['kubeconfig']})")
    print(f"  KubeRay:         simulated operator + GKE TPU webhook; Ray: {ray}")
    print(
        f"  CRD schemas:     {state['crds'] or 'none found (set --crds or TPUFLOW_KUBERAY_CRDS): no field validation'}"
    )
    print(f"use them:          source {state['env_file']}")
    print("  gcloud container node-pools create tpu-multi-host-pool --cluster=$CLUSTER_NAME --zone=$ZONE \\")
    print("      --machine-type=ct6e-standard-4t --tpu-topology=4x4 --num-nodes=4")
    print("  kubectl apply -f raycluster.yaml; kubectl get rayclusters,pods")
    print(f"log:               {log}")
    print(f"stop:              tpuflow standins down --workdir {work}")
    return 0


def _terminate(pid: int, timeout: float = STOP_TIMEOUT_S) -> bool:
    """SIGTERM the process group `up` started (its own session), then SIGKILL after `timeout`; True once gone."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
        if not _alive(pid):
            return True
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)
    return False


def _down(args: argparse.Namespace) -> int:
    work = _workdir(args)
    state = _state(work)
    if state is None:
        print(f"no stand-ins running in {work}")
        return 0
    pid = int(state.get("pid", 0))
    if not pid or not _alive(pid):
        (work / STATE_FILE).unlink(missing_ok=True)
        print(f"stand-ins in {work} had already stopped (pid {pid})")
        return 0
    clean = _terminate(pid)
    (work / STATE_FILE).unlink(missing_ok=True)
    print(f"stopped the stand-ins (pid {pid}) in {work}" + ("" if clean else " (killed after a timeout)"))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "standins", help="run the GKE and Kubernetes stand-ins (gcloud and kubectl work against them)"
    )
    verbs = parser.add_subparsers(dest="verb", required=True)
    up = verbs.add_parser("up", help="start them in the background; writes DIR/kubeconfig and DIR/env.sh")
    up.add_argument("--workdir", required=True, help="kubeconfig, env.sh, state and logs go here")
    up.add_argument("--fake", action="store_true", help="no Ray processes: the simulated KubeRay scripts Ray's side")
    up.add_argument(
        "--operation-seconds", type=float, default=2.0, help="how long each node-pool operation takes (default 2)"
    )
    up.add_argument("--crds", default=None, help="KubeRay CRD directory (default $TPUFLOW_KUBERAY_CRDS)")
    up.set_defaults(func=_up)
    down = verbs.add_parser("down", help="stop exactly what `up` started in DIR")
    down.add_argument("--workdir", required=True)
    down.set_defaults(func=_down)
