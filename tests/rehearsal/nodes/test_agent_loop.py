"""The node agent's round loop through an API outage (the API server or etcd restarting): it keeps retrying,
as a kubelet does, and says so once when the outage starts and once when it ends, not once per round."""

from __future__ import annotations

import threading

from tpuflow_rehearsal.nodes.agent import NodeAgent
from tpuflow_rehearsal.nodes.kube_rest import KubeError


def test_an_outage_is_logged_once_and_its_end_once() -> None:
    agent = object.__new__(NodeAgent)  # the loop alone: no pod network
    lines: list[str] = []
    outcomes = iter([None, "down", "down", "down", "down", None, None, "down", None])
    stop = threading.Event()

    def sync_once() -> None:
        outcome = next(outcomes, "end")
        if outcome == "end":
            stop.set()
        elif outcome == "down":
            raise KubeError(503, "connection refused")

    agent._stop, agent.interval, agent.log, agent.sync_once = stop, 0.0, lines.append, sync_once  # type: ignore[method-assign]
    agent._loop()
    assert lines == [
        "sync: 503: connection refused; retrying every 0 s",
        "sync: the API answers again",
        "sync: 503: connection refused; retrying every 0 s",
        "sync: the API answers again",
    ]
