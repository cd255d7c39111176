"""A pod's processes live and die with the node agent's process, as a node's containers with their VM: each pod
runs in its own pid namespace (its first process is pid 1 there), and when the agent's process is SIGKILLed (a
killed `tpuflow standins up` or `tpuflow demo --backend gke`) every process of every pod dies with it. The pod
network it held is then reclaimed by the next agent: its recorded owner is provably gone."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tpuflow_rehearsal.nodes import network as net

pytestmark = pytest.mark.skipif(net.available() is not None, reason=str(net.available()))

AGENT = """
import sys, time
from tpuflow_rehearsal.nodes.agent import NodeAgent
from tpuflow_rehearsal.nodes.pod_runner import PodRun

agent = NodeAgent(None, sys.argv[1], cluster="projects/p/locations/z/clusters/c", pools=list, log=lambda _l: None)
pod = {
    "metadata": {"uid": "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0", "name": "sleeper", "namespace": "default"},
    "spec": {
        "nodeName": "node-0",
        "restartPolicy": "Always",
        "containers": [{"name": "main", "command": ["bash", "-c", "sleep 600 & sleep 600"]}],
    },
}
run = PodRun(pod, agent.ctx)
run.start()
print(agent.index, run.iface is not None, flush=True)
time.sleep(600)
"""


def _pids(netns: str) -> list[int]:
    out = subprocess.run(["ip", "netns", "pids", netns], capture_output=True, text=True, check=False).stdout
    return [int(p) for p in out.split()]


def _until(check, timeout: float = 60.0):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := check():
            return value
        time.sleep(0.2)
    return check()


def test_a_sigkilled_agent_takes_its_pods_processes_with_it_and_its_network_is_reclaimed(tmp_path: Path) -> None:
    repo = Path(__file__).resolve().parents[3]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(str(repo / root) for root in ("operators", "rehearsal"))}
    agent = subprocess.Popen(
        [sys.executable, "-c", AGENT, str(tmp_path)], stdout=subprocess.PIPE, text=True, env=env, start_new_session=True
    )
    try:
        index = int((agent.stdout.readline() if agent.stdout else "").split()[0])
        netns = net.PodNetwork(index).netns_name("0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0")
        pids = _until(lambda: len(p := _pids(netns)) >= 4 and p)  # unshare, bash (pid 1) and its two sleeps
        assert pids, _pids(netns)
        # inside, the pod's own pid namespace: its first process is pid 1 and sees only the pod's processes
        in_pod = [Path(f"/proc/{pid}/status").read_text().split("NSpid:")[1].split("\n")[0].split() for pid in pids]
        assert ["1"] == [ids[-1] for ids in in_pod if len(ids) > 1 and ids[-1] == "1"], in_pod
    finally:
        os.killpg(agent.pid, signal.SIGKILL)
        agent.wait(30)
    gone = _until(lambda: not [p for p in pids if Path(f"/proc/{p}").exists()])
    assert gone, f"processes of the killed agent's pod still run: {[p for p in pids if Path(f'/proc/{p}').exists()]}"
    reclaimed = net.claim_index()
    try:
        assert reclaimed == index  # its owner is gone: the network (bridge, namespaces) was removed and taken
        assert netns not in net.PodNetwork(index).namespaces()
    finally:
        net.PodNetwork(reclaimed).down()
