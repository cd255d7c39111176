"""A v6e 4x4 node pool plan (tpuflow.gke.nodepool_spec) with test coordinates; tests override what they vary."""

from __future__ import annotations

from typing import Any

from tpuflow.gke.nodepool_spec import NodePoolPlan, plan_node_pools
from tpuflow.naming import TaskIdentity

DEFAULTS: dict[str, Any] = {
    "project_id": "tpu-proj-123",
    "location": "us-east5-b",
    "cluster_name": "c1",
    "accelerator": "v6e",
    "topology": "4x4",
    "identity": TaskIdentity("dag", "run", "task"),
    "expires_at": 1_900_000_000,
}


def node_pool_plan(**overrides: Any) -> NodePoolPlan:
    return plan_node_pools(**{**DEFAULTS, **overrides})
