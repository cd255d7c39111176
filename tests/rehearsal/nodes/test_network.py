"""Host services from inside a pod's network namespace (the GKE rehearsal, issue 45): plain storage code in a pod
reaches the GCS emulator and its GCE metadata stand-in at the pod network's gateway (the pod's environment, as
the node agent rewrites it) and at the loopback addresses the Airflow side knows them by (what a Ray job's
runtime_env env_vars carry into the pod, over the pod's own environment)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.gcs_bucket import list_bucket

from tpuflow.storage import EMULATOR_ENV, emulator_env
from tpuflow_rehearsal.gcs_emulator import GcsEmulator, ensure_buckets
from tpuflow_rehearsal.nodes import network as net
from tpuflow_rehearsal.nodes.agent import NodeAgent
from tpuflow_rehearsal.rehearsal import host_ports, pod_env_with_storage

pytestmark = pytest.mark.skipif(net.available() is not None, reason=str(net.available()))
CLIENTS = Path(__file__).resolve().parents[2] / "support" / "plain_gcs_clients.py"
BUCKET = "tpuflow-pods"


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory, gcs_emulator: GcsEmulator) -> Iterator[NodeAgent]:
    """A node agent (no API server: only its pod network and the pods' base environment) whose pods get the
    session emulator as the rehearsal gives it to them."""
    ensure_buckets(gcs_emulator.url, [BUCKET])
    pod_env = pod_env_with_storage(gcs_emulator.env())
    running = NodeAgent(
        None,  # type: ignore[arg-type] - never synced: no Kubernetes API is asked
        tmp_path_factory.mktemp("agent"),
        cluster="projects/p/locations/z/clusters/c",
        pools=list,
        host_ports=host_ports(pod_env),
        extra_env=pod_env,
        log=lambda _line: None,
    )
    try:
        yield running
    finally:
        running.stop()


def test_the_pods_environment_names_both_services_at_the_gateway(agent: NodeAgent, gcs_emulator: GcsEmulator) -> None:
    gateway = agent.network.gateway
    emulator, metadata = f"{gateway}:{gcs_emulator.port}", f"{gateway}:{gcs_emulator.metadata_port}"
    assert {k: v for k, v in agent.base_env.items() if k in emulator_env(gcs_emulator.env())} == {
        "STORAGE_EMULATOR_HOST": f"http://{emulator}",
        "CLOUD_STORAGE_EMULATOR_ENDPOINT": f"http://{emulator}",
        "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false",
        "TPUFLOW_GCE_METADATA_HOST": metadata,
        "GCE_METADATA_HOST": metadata,
        "GCE_METADATA_IP": metadata,
        "GCE_METADATA_ROOT": metadata,
    }


def in_pod(agent: NodeAgent, netns: str, env: dict[str, str], *argv: str) -> subprocess.CompletedProcess[str]:
    home = Path(agent.workdir) / f"home-{netns}"
    home.mkdir(exist_ok=True)
    clean = {"PATH": os.environ["PATH"], "HOME": str(home), **env}
    return subprocess.run(["ip", "netns", "exec", netns, *argv], env=clean, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("library", ["pyarrow", "gcsfs", "google-cloud-storage"])
@pytest.mark.parametrize("given_by", ["pod", "job"], ids=["pod environment", "job runtime_env (loopback)"])
def test_plain_code_in_a_pod_reaches_the_emulator(
    agent: NodeAgent, gcs_emulator: GcsEmulator, library: str, given_by: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    uid = str(uuid.uuid4())
    iface = agent.network.add_pod(uid)
    try:
        env = dict(agent.base_env) if given_by == "pod" else emulator_env(gcs_emulator.env())
        prefix = f"gs://{BUCKET}/{given_by}/{library}"
        done = in_pod(agent, iface.netns, env, sys.executable, str(CLIENTS), library, prefix)
        assert done.returncode == 0, done.stderr[-3000:]
        out = json.loads(done.stdout.splitlines()[-1])
        monkeypatch.setenv(EMULATOR_ENV, gcs_emulator.url)
        assert out["uri"].removeprefix(f"gs://{BUCKET}/") in list_bucket(BUCKET, f"{given_by}/")
    finally:
        agent.network.remove_pod(uid)


def test_a_removed_pod_leaves_no_loopback_forwarder(agent: NodeAgent, gcs_emulator: GcsEmulator) -> None:
    uid = str(uuid.uuid4())
    netns = agent.network.add_pod(uid).netns
    forwarders = list(agent.network._loopback[netns])
    assert sorted(f.listen[1] for f in forwarders) == sorted([gcs_emulator.port, gcs_emulator.metadata_port])
    agent.network.remove_pod(uid)
    assert netns not in agent.network._loopback
    assert all(f._server is not None and f._server.fileno() == -1 for f in forwarders)  # closed
