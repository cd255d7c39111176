"""The addition endpoint served FROM simulated TPU slices: the session's cluster of two v6e 2x4 slices
(two ct6e-standard-4t hosts each, the smallest multi-host shape), deployed through RayServeDeployOperator.

Each completion is checked against the numpy forward pass of the same checkpoint in this process, so
an untrained (seeded) checkpoint is enough: what matters is where the replica runs and that the mesh
computes the same answer.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from support.airflow_context import new_run_id, task_context
from support.ray_cluster import alive_actors, slice_index, slice_of_node

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
WORKLOADS = REPO / "workloads"
DRIVERS = Path(__file__).parent / "drivers"
PROMPTS = ["17+25=", "3+4=", "99+99="]


@pytest.fixture(scope="module")
def cluster(slice_cluster: Any) -> Iterator[Any]:
    """The session's two v6e 2x4 slices (tests/conftest.py), handed back with no Serve app holding them."""
    yield slice_cluster
    _clear(slice_cluster)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A seeded (untrained) checkpoint and what the numpy forward pass completes for PROMPTS."""
    if str(WORKLOADS) not in sys.path:
        sys.path.insert(0, str(WORKLOADS))
    from addition import checkpoint as ckpt
    from addition.data import TaskSpec
    from addition.inference import Predictor
    from addition.model_jax import ModelConfig, init_params

    directory = tmp_path_factory.mktemp("ckpt") / "seeded"
    ckpt.save(directory, ckpt.Meta("jax", 0, 0, ModelConfig(), TaskSpec()), init_params(ModelConfig(), seed=3))
    expected = [c.text for c in Predictor.from_checkpoint(directory, backend="numpy").complete(PROMPTS)]
    return {"checkpoint": str(directory), "expected": expected}


def _slice(**overrides: Any) -> Any:
    from tpuflow.pipeline.params import local_serve_slice
    from tpuflow.tpu import TpuSlice

    train = TpuSlice.from_spec("TPU-V6E", "2x4", "ct6e-standard-4t", num_slices=2)
    return local_serve_slice(train, overrides.get("topology", "2x4"))


def _config(cluster: Any, checkpoint: dict[str, Any], tpu: Any, name: str, **args: Any) -> dict[str, Any]:
    from tpuflow.workloads.addition.pipeline import ADDITION

    from tpuflow.pipeline.steps import serve_config_for

    config = serve_config_for(
        cluster.connection_info(), {"checkpoint": checkpoint["checkpoint"]}, f"local://{WORKLOADS}", "jax",
        tpu, workload=ADDITION,
    )  # fmt: skip
    app = config["applications"][0]
    app["name"], app["route_prefix"] = name, f"/{name}"
    app["args"].update(args)
    app["args"] = {k: v for k, v in app["args"].items() if v is not None}
    return config


def _deploy(cluster: Any, config: dict[str, Any], tpu: Any, timeout: float = 420.0) -> dict[str, Any]:
    from tpuflow.serve.operators import RayServeDeployOperator

    op = RayServeDeployOperator(
        task_id="deploy",
        cluster=cluster.connection_info(),
        serve_config=config,
        tpu_slice=tpu,
        deploy_timeout=timeout,
        poll_interval=1.0,
        deferrable=False,
        on_kill_action="keep",
    )
    return op.execute(task_context(dag_id="serve_tests", run_id=new_run_id(), task_id="deploy"))


def _complete(cluster: Any, name: str, timeout: float = 60.0) -> list[str]:
    url = f"{cluster.serve_url}/{name}/v1/completions"
    body = {"model": "addition", "prompt": PROMPTS, "max_tokens": 4, "temperature": 0}
    deadline, last = time.time() + timeout, ""
    while time.time() < deadline:
        try:
            resp = requests.post(url, json=body, timeout=30)
            if resp.ok:
                return [c["text"] for c in sorted(resp.json()["choices"], key=lambda c: c["index"])]
            last = f"{resp.status_code} {resp.text[:300]}"
        except requests.RequestException as err:
            last = str(err)
        time.sleep(1)
    raise AssertionError(f"{url} did not answer within {timeout:.0f}s: {last}")


def _clear(cluster: Any, timeout: float = 180.0) -> None:
    """Delete every Serve application and wait until their replicas (and the slices they hold) are gone."""
    from tpuflow.serve.hooks import RayServeHook

    RayServeHook(cluster=cluster.connection_info()).delete_applications()
    deadline = time.time() + timeout
    while alive_actors(cluster, "AdditionCompletions") or alive_actors(cluster, "SliceHost"):
        assert time.time() < deadline, "the Serve replicas outlived their applications' deletion"
        time.sleep(1)


def _workers_by_replica(cluster: Any) -> dict[str, list[str]]:
    """Each replica's slice placement group -> the slices of its SliceHost workers' nodes."""
    slices = slice_of_node(cluster)
    groups: dict[str, list[str]] = {}
    for actor in alive_actors(cluster, "SliceHost"):
        groups.setdefault(str(actor.get("placement_group_id")), []).append(slices.get(actor["node_id"], "?"))
    return groups


def test_single_host_replica_holds_its_hosts_tpu(cluster: Any, checkpoint: dict[str, Any]) -> None:
    tpu = _slice(topology="")
    assert (tpu.topology, tpu.chips_per_host, tpu.multi_host) == ("2x2", 4, False)
    config = _config(cluster, checkpoint, tpu, "single")
    assert config["applications"][0]["runtime_env"]["env_vars"]["JAX_PLATFORMS"] == "cpu"
    _deploy(cluster, config, tpu)
    assert _complete(cluster, "single") == checkpoint["expected"]
    (replica,) = alive_actors(cluster, "AdditionCompletions")
    held = replica.get("required_resources") or {}
    assert held.get("TPU") == 4 and held.get("accelerator_type:TPU-V6E") == pytest.approx(0.001), held


def test_two_multi_host_replicas_each_span_one_whole_slice(cluster: Any, checkpoint: dict[str, Any]) -> None:
    tpu = _slice()
    assert tpu.multi_host and tpu.num_hosts == 2 and tpu.num_slices == 2
    config = _config(cluster, checkpoint, tpu, "mesh", num_replicas=2)
    assert config["applications"][0]["args"]["accelerator_config"] == {"kind": "tpu", "topology": "2x4"}
    started = time.time()
    _deploy(cluster, config, tpu)
    print(f"two multi-host replicas RUNNING in {time.time() - started:.0f}s")
    for _ in range(4):  # both replicas answer, with the single-process forward pass's completions
        assert _complete(cluster, "mesh") == checkpoint["expected"]
    groups = _workers_by_replica(cluster)
    assert len(groups) == 2, groups
    for hosts in groups.values():
        assert len(hosts) == 2 and len(set(hosts)) == 1, f"a replica's workers mix slices: {groups}"
    assert len({hosts[0] for hosts in groups.values()}) == 2, f"two replicas share a slice: {groups}"
    for replica in alive_actors(cluster, "AdditionCompletions"):
        assert not (replica.get("required_resources") or {}).get("TPU"), "the replica itself holds no TPU"


def test_without_the_topology_the_replica_straddles_and_the_deploy_fails_naming_it(
    cluster: Any, checkpoint: dict[str, Any]
) -> None:
    from airflow.sdk.exceptions import AirflowException

    from tpuflow.rayjob.hooks import RayJobHook

    _clear(cluster)  # the earlier tests' replicas hold both slices
    # Another workload holds one host of each slice; the per-chip bundles then take one host of each.
    names = sorted({s for s in slice_of_node(cluster).values() if s})
    hook = RayJobHook(cluster=cluster.connection_info())
    sid = hook.submit_job(
        entrypoint=f"python hold_hosts.py 4 {names[0]}/1 {names[1]}/0",
        submission_id=f"hold-{cluster.started_at:.0f}",
        runtime_env={"working_dir": str(DRIVERS)},
    )
    try:
        deadline = time.time() + 180
        while "HELD" not in (hook.get_job_logs(sid) or "") and time.time() < deadline:
            time.sleep(1)
        assert "HELD" in hook.get_job_logs(sid), hook.get_job_logs(sid)[-2000:]
        # The test-only path: the multi-host deployment with no topology, and no tpu_slice to check it.
        config = _config(cluster, checkpoint, None, "straddle", accelerator_type="TPU-V6E",
                         accelerator_config={"kind": "tpu"}, chips_per_host=4, num_devices=8)  # fmt: skip
        timeout = 30.0  # the straddling replica is placed within seconds; the deploy then waits it out
        started = time.time()
        with pytest.raises(AirflowException) as err:
            _deploy(cluster, config, None, timeout=timeout)
        elapsed = time.time() - started
        text = str(err.value)
        print(f"no-topology deploy failed after {elapsed:.0f}s:\n{text}")
        assert "timeout" in text and "deployment AdditionCompletions of application straddle" in text
        assert "8 per-chip TPU bundles and no accelerator_config.topology" in text
        assert elapsed < timeout + 60
        groups = _workers_by_replica(cluster)
        assert any(len(set(hosts)) == 2 for hosts in groups.values()), f"expected a straddling replica: {groups}"
    finally:
        hook.stop_job(sid)


def test_a_lost_host_makes_serve_replace_the_replica_on_an_intact_slice(
    cluster: Any, checkpoint: dict[str, Any], request: pytest.FixtureRequest
) -> None:
    tpu = _slice()
    _deploy(cluster, _config(cluster, checkpoint, tpu, "heal"), tpu)
    assert _complete(cluster, "heal") == checkpoint["expected"]
    (before,) = _workers_by_replica(cluster).values()
    details = requests.get(
        f"{cluster.dashboard_url}/api/serve/applications/", headers=cluster.auth_headers(), timeout=30
    )
    deployed_at = details.json()["applications"]["heal"]["last_deployed_time_s"]
    lost = slice_index(cluster, before[0])
    cluster.kill_host(lost, 1)
    request.addfinalizer(lambda: cluster.replace_host(lost, 1))  # the session's cluster stays whole
    started, after = time.time(), before
    while after == before:  # Serve's health check fails the replica; its successor reserves the other slice
        assert time.time() < started + 300, f"the replica was not replaced: {_workers_by_replica(cluster)}"
        time.sleep(1)
        replicas = list(_workers_by_replica(cluster).values())
        after = replicas[0] if len(replicas) == 1 and len(replicas[0]) == 2 else before
    assert len(set(after)) == 1 and after[0] != before[0], (before, after)
    assert _complete(cluster, "heal", timeout=300) == checkpoint["expected"]
    print(f"endpoint answered again from {after[0]} {time.time() - started:.0f}s after losing host {lost}/1")
    details = requests.get(
        f"{cluster.dashboard_url}/api/serve/applications/", headers=cluster.auth_headers(), timeout=30
    )
    assert details.json()["applications"]["heal"]["last_deployed_time_s"] == deployed_at, "no redeploy"
    json.dumps(details.json())  # the status stays readable
