"""`tpuflow standins up|env|down`: the GKE and Kubernetes stand-ins for gcloud, kubectl and the GKE pipeline.

`up` starts them (with the simulated KubeRay operator) in a background process of its own session on
free loopback ports, and a GCS emulator (fake-gcs-server, bucket gs://tpuflow-standin, with the GCE metadata
stand-in beside it) unless --no-gcs;
it writes DIR/kubeconfig and DIR/env.sh and prints the `export` lines that point an Airflow at them
(`env` prints those lines again); `down` stops exactly those processes (by the pids recorded in DIR),
which stops the Ray clusters the stand-ins started.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tpuflow import workloads_dir
from tpuflow.errors import UserInputError
from tpuflow.validation import check_folder, check_seconds

STATE_FILE = "state.json"  # tpuflow_rehearsal.standins.stack.STATE_FILE, without importing the stand-ins here
START_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 90.0
GCS_DIR = "gcs-emulator"  # the emulator's state and data, under the work dir
GCS_BUCKET = "tpuflow-standin"
EMULATOR_ENV = "STORAGE_EMULATOR_HOST"  # tpuflow_rehearsal.gcs_emulator.EMULATOR_ENV
CRDS_ENV = "TPUFLOW_KUBERAY_CRDS"  # tpuflow_rehearsal.standins.stack.CRDS_ENV
METADATA_ENV = "TPUFLOW_GCE_METADATA_HOST"  # tpuflow.storage.METADATA_ENV (not loaded at the command's start)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _state(work: Path) -> dict[str, Any] | None:
    path = work / STATE_FILE
    if not path.is_file():
        return None
    try:
        return dict(json.loads(path.read_text()))
    except (OSError, ValueError):
        return None


def _workdir(args: argparse.Namespace) -> Path:
    return Path(check_folder("--workdir", args.workdir)).resolve()  # type: ignore[arg-type]


def airflow_env(state: Mapping[str, Any], work: Path, emulator: Mapping[str, str] | None) -> dict[str, str]:
    """What points an Airflow (the shipped GKE DAG, a `tpuflow_backend=gke` DAG) at running stand-ins: their
    AIRFLOW_CONN_* (state.json's), the AIRFLOW_VAR_* tpuflow.pipeline.gke.variable_settings() reads, and
    when a GCS emulator runs beside them a gs:// output root and ``emulator`` (GcsEmulator.env(): the
    emulator's and its metadata stand-in's addresses)."""

    try:
        connections = dict(state["airflow_connections"])
        gcp, kubernetes = str(state["gcp_conn_id"]), str(state["kubernetes_conn_id"])
    except (KeyError, TypeError, ValueError):
        raise UserInputError(
            "--workdir",
            str(work),
            "these stand-ins predate `tpuflow standins env`: restart them (`tpuflow standins down` then `up`)",
        ) from None
    variables = {
        "tpuflow_backend": "gke",
        "tpuflow_gcp_conn_id": gcp,  # the project comes from this connection's extra
        "tpuflow_kubernetes_conn_id": kubernetes,
        "tpuflow_gke_location": str(state["zone"]),
        "tpuflow_gke_cluster": str(state["cluster"]),
        # The stand-ins' Ray clusters run on this machine, not in the image: Serve finds workloads/ here.
        "tpuflow_serve_workloads_uri": f"local://{workloads_dir()}",
        "tpuflow_gke_output_root": f"gs://{GCS_BUCKET}/outputs" if emulator else str(work / "outputs"),
    }
    env = {**connections, **{f"AIRFLOW_VAR_{name.upper()}": value for name, value in variables.items()}}
    return {**env, **(emulator or {})}


def export_lines(env: Mapping[str, str]) -> list[str]:
    # Quoted: a work dir (the kubeconfig's path) may hold a space, a quote or $(...); the JSON holds quotes.
    return [f"export {key}={shlex.quote(value)}" for key, value in env.items()]


def _emulator(work: Path) -> Any:
    """The GCS emulator `up` started for the stand-ins in `work`, or None."""
    from tpuflow_rehearsal.gcs_emulator import GcsEmulator

    return GcsEmulator.load(work / GCS_DIR)


def _start_emulator(work: Path) -> dict[str, str]:
    """Start the stand-ins' GCS emulator and its metadata stand-in (what a crashed `up` left here is stopped
    first); returns what points clients at them (GcsEmulator.env())."""
    from tpuflow_rehearsal.gcs_emulator import GcsEmulator

    stale = _emulator(work)
    if stale is not None:
        stale.stop()
    return GcsEmulator.start(buckets=[GCS_BUCKET], state_dir=work / GCS_DIR).env()


def _stop_emulator(work: Path) -> str:
    """Stop the stand-ins' GCS emulator, if one is recorded in `work`; returns what to report ('' if none)."""
    emulator = _emulator(work)
    if emulator is None:
        return ""
    metadata = f" and its GCE metadata stand-in (pid {emulator.metadata_pid})" if emulator.metadata_is_alive() else ""
    ran = emulator.stop()
    return f"stopped the GCS emulator (pid {emulator.pid}){metadata}" if ran else ""


def _running_emulator_env(work: Path) -> dict[str, str] | None:
    emulator = _emulator(work)
    if emulator is None:
        return None
    if not emulator.is_alive():
        raise UserInputError(
            "--workdir",
            str(work),
            f"the stand-ins' GCS emulator (pid {emulator.pid}) has stopped: `tpuflow standins down "
            f"--workdir {work}`, then `up` again",
        )
    return dict(emulator.env())


def _check_crds(flag: str | None) -> None:
    """--crds, else $TPUFLOW_KUBERAY_CRDS, must hold KubeRay's CRDs; with neither, the imitation uses tpuflow's own."""
    from tpuflow_rehearsal.standins.kubernetes_catalog import holds_crds

    field, value = ("--crds", flag) if flag is not None else (CRDS_ENV, os.environ.get(CRDS_ENV) or None)
    if value is not None and not holds_crds(value):
        raise UserInputError(field, value, "give the directory holding KubeRay's ray.io_rayclusters.yaml")


def _crds_line(crds: str) -> str:
    from tpuflow_rehearsal.standins import kuberay_crds

    if Path(crds) == kuberay_crds.DIRECTORY:
        return f"KubeRay {kuberay_crds.KUBERAY_VERSION}'s, shipped with tpuflow ({crds})"
    return f"{crds} (--crds / {CRDS_ENV})"


def _check_real_control_plane() -> None:
    """One line where the real control plane cannot run here (no root for the pod network, no binaries)."""
    from tpuflow_rehearsal.rehearsal import unavailable

    why = unavailable()
    if why:
        raise UserInputError("--control-plane", "real", f"{why}; or run the imitation: --control-plane imitation")


def _up(args: argparse.Namespace) -> int:
    work = _workdir(args)
    check_seconds("--operation-seconds", args.operation_seconds, allow_zero=True, maximum=3600)
    if args.control_plane is None:  # the real one, unless the flags given are the imitation's own
        args.control_plane = "imitation" if (args.fake or args.crds) else "real"
    real = args.control_plane == "real"
    if real and (args.fake or args.crds):
        flag = "--fake" if args.fake else "--crds"
        raise UserInputError(
            flag,
            True if args.fake else args.crds,
            "the real control plane runs the real KubeRay with its own CRDs: drop it",
        )
    if real:
        _check_real_control_plane()
    if not real:
        _check_crds(args.crds)
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
    emulator = None
    if args.gcs:
        from tpuflow_rehearsal.gcs_emulator import GcsEmulatorError

        try:
            emulator = _start_emulator(work)
        except GcsEmulatorError as err:
            first = str(err).splitlines()[0]
            print(f"tpuflow standins up: the GCS emulator did not start: {first} (or use --no-gcs)", file=sys.stderr)
            return 1
    code = 1
    try:
        code = _start_standins(args, work, emulator)
    finally:
        if code and emulator:  # the stand-ins did not start (or Ctrl-C): nothing of `up` stays behind
            _stop_emulator(work)
    return code


def _start_standins(args: argparse.Namespace, work: Path, emulator: Mapping[str, str] | None) -> int:
    real = args.control_plane == "real"
    module = "tpuflow_rehearsal.rehearsal" if real else "tpuflow_rehearsal.standins.stack"
    command = [sys.executable, "-m", module, "--workdir", str(work)]
    command += ["--operation-seconds", str(args.operation_seconds)]
    if args.fake:
        command.append("--fake")
    if args.crds:
        command += ["--crds", str(Path(args.crds).resolve())]
    log = work / "standins.log"
    # The stand-ins' local Ray clusters (and the rehearsal's pods) inherit the emulator, as GKE's pods reach
    # Cloud Storage.
    env = {**os.environ, **(emulator or {})}
    with log.open("ab") as out:
        proc = subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True, env=env
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
        if not real
        else f"each pod's Ray processes, run by the node agent under {work}/nodes"
    )
    print(f"tpuflow stand-ins running (pid {proc.pid}) in {work}")
    print(
        f"  GKE API:         {state['gke_url']}  (project {state['project']}, zone {state['zone']}, cluster {state['cluster']})"
    )
    print(f"  Kubernetes API:  {state['kubernetes_url']}  (kubeconfig {state['kubeconfig']})")
    if real:
        print(
            "  Kubernetes:      real etcd, kube-apiserver, kube-controller-manager, kube-scheduler (make controlplane)"
        )
        print(f"  KubeRay:         the real operator + GKE TPU webhook (played); Ray: {ray}")
    else:
        print(f"  KubeRay:         simulated operator + GKE TPU webhook; Ray: {ray}")
        print(f"  CRD schemas:     {_crds_line(state['crds'])}")
    gcs = (
        f"{emulator[EMULATOR_ENV]}  (bucket gs://{GCS_BUCKET}; GCE metadata stand-in {emulator.get(METADATA_ENV)})"
        if emulator
        else f"none (--no-gcs): outputs in {work}/outputs"
    )
    print(f"  GCS emulator:    {gcs}")
    print(f"use them:          source {state['env_file']}")
    print("  gcloud container node-pools create tpu-multi-host-pool --cluster=$CLUSTER_NAME --zone=$ZONE \\")
    print("      --machine-type=ct6e-standard-4t --tpu-topology=4x4 --num-nodes=4")
    print("  kubectl apply -f raycluster.yaml; kubectl get rayclusters,pods")
    print(f"log:               {log}")
    print(f"stop:              tpuflow standins down --workdir {work}")
    print(f'Airflow and your DAGs on them: eval "$(tpuflow standins env --workdir {shlex.quote(str(work))})" exports:')
    print("\n".join(export_lines(airflow_env(state, work, emulator))))
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


def _env(args: argparse.Namespace) -> int:
    work = _workdir(args)
    state = _state(work)
    if state is None or not _alive(int(state.get("pid", 0))):
        raise UserInputError(
            "--workdir", str(work), f"no stand-ins run there: start them with `tpuflow standins up --workdir {work}`"
        )
    print("\n".join(export_lines(airflow_env(state, work, _running_emulator_env(work)))))
    return 0


def _down(args: argparse.Namespace) -> int:
    work = _workdir(args)
    state = _state(work)
    gcs = _stop_emulator(work)
    also = f"; {gcs}" if gcs else ""
    if state is None:
        print(f"no stand-ins running in {work}{also}")
        return 0
    pid = int(state.get("pid", 0))
    if not pid or not _alive(pid):
        (work / STATE_FILE).unlink(missing_ok=True)
        print(f"stand-ins in {work} had already stopped (pid {pid}){also}")
        return 0
    clean = _terminate(pid)
    (work / STATE_FILE).unlink(missing_ok=True)
    print(f"stopped the stand-ins (pid {pid}) in {work}" + ("" if clean else " (killed after a timeout)") + also)
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
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
    up.add_argument(
        "--crds",
        default=None,
        help="KubeRay CRD directory (default $TPUFLOW_KUBERAY_CRDS, else the ones tpuflow ships)",
    )
    up.add_argument(
        "--control-plane",
        default=None,
        choices=("imitation", "real"),
        help="real (default): etcd, kube-apiserver and the KubeRay operator built from Go modules (make "
        "controlplane), GKE's nodes played by the node agent (needs root); imitation (the default with --fake or "
        "--crds, which are its own): the Python Kubernetes API and simulated KubeRay",
    )
    up.add_argument(
        "--no-gcs",
        dest="gcs",
        action="store_false",
        help=f"no GCS emulator (default: one with gs://{GCS_BUCKET}, the output root `env` exports)",
    )
    up.set_defaults(func=_up)
    env = verbs.add_parser(
        "env",
        help='print the export lines that point Airflow at the stand-ins in DIR: eval "$(tpuflow standins env ...)"',
    )
    env.add_argument("--workdir", required=True)
    env.set_defaults(func=_env)
    down = verbs.add_parser("down", help="stop exactly what `up` started in DIR")
    down.add_argument("--workdir", required=True)
    down.set_defaults(func=_down)
