"""A pod whose node died and came back (the fault matrix's "node agent killed"): as a kubelet after a reboot, the
node agent fails a restartPolicy Never pod whose containers had started, starts the containers of an Always pod
again (one more restart each, the pod's first start time kept), and starts a pod that never ran as new."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

from tpuflow_rehearsal.nodes.pod_runner import PodRun

STARTED = "2026-12-07T05:40:09Z"


def _pod(policy: str) -> dict[str, Any]:
    return {
        "metadata": {"uid": "7a1b2c3d-0000-4000-8000-000000000001", "name": "rc-head-x", "namespace": "default"},
        "spec": {"nodeName": "node-0", "restartPolicy": policy, "containers": [{"name": "ray-head", "command": ["x"]}]},
    }


def _reported(state: dict[str, Any], restarts: int = 0) -> dict[str, Any]:
    return {
        "phase": "Running",
        "startTime": STARTED,
        "containerStatuses": [{"name": "ray-head", "restartCount": restarts, "state": state}],
    }


def _run(policy: str, tmp_path: Path) -> PodRun:
    return PodRun(_pod(policy), SimpleNamespace(workdir=tmp_path, network=SimpleNamespace(index=0)))  # type: ignore[arg-type]


def test_a_never_pod_whose_containers_ran_fails_and_starts_nothing(tmp_path: Path) -> None:
    run = _run("Never", tmp_path)
    run.after_node_restart(_reported({"running": {"startedAt": STARTED}}))
    run.start()
    status = run.status()
    assert status["phase"] == "Failed" and "the node restarted" in status["message"], status
    assert run._thread is None  # no sandbox, no process


def test_an_always_pod_starts_again_counting_one_more_restart_and_keeping_its_start_time(tmp_path: Path) -> None:
    run = _run("Always", tmp_path)
    run.after_node_restart(_reported({"running": {"startedAt": STARTED}}, restarts=2))
    (container,) = run.status()["containerStatuses"]
    assert container["restartCount"] == 3 and container["lastState"]["terminated"]["reason"] == "Unknown"
    assert run.status()["startTime"] == STARTED and not run.failed_reason


def test_a_pod_that_never_started_is_started_as_new(tmp_path: Path) -> None:
    for policy in ("Never", "Always"):
        run = _run(policy, tmp_path)
        run.after_node_restart(_reported({"waiting": {"reason": "ContainerCreating"}}))
        (container,) = run.status()["containerStatuses"]
        assert container["restartCount"] == 0 and "lastState" not in container and not run.failed_reason
        assert run.start_time is None
