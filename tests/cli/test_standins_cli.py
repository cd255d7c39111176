"""`tpuflow standins up/down`, driven with the real kubectl and gcloud as a user types them (seed 004's commands).

One `tpuflow standins up --fake` per module (no Ray processes: the simulated KubeRay scripts Ray's side);
its env.sh is the only configuration kubectl and gcloud get. Each client is skipped with a reason only
where its binary is absent.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
SEED = Path(os.environ.get("TPUFLOW_SEEDS", REPO.parent / "shared" / "seeds")) / "004_2897d876dac76289.txt"
IMAGE_URI = "us-docker.pkg.dev/tpu-proj-123/ray-torchtpu/ray-torchtpu:latest"


def tpuflow(*args: str, env: dict[str, str] | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [sys.executable, "-m", "tpuflow.cli", *args], capture_output=True, text=True, env=env, timeout=180
    )
    if check:
        assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def read_env_sh(path: Path) -> dict[str, str]:
    out = {}
    for line in path.read_text().splitlines():
        if line.startswith("export "):
            key, _, value = line.removeprefix("export ").partition("=")
            out[key] = shlex.split(value)[0] if value else ""
    return out


@pytest.fixture(scope="module")
def standins(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, dict[str, str]]]:
    work = tmp_path_factory.mktemp("standins")
    up = tpuflow("standins", "up", "--workdir", str(work), "--fake", "--operation-seconds", "0.1")
    assert f"source {work}/env.sh" in up.stdout and "Kubernetes API:  https://127.0.0.1:" in up.stdout
    state = json.loads((work / "state.json").read_text())
    env = {**os.environ, **read_env_sh(work / "env.sh"), "IMAGE_URI": IMAGE_URI}
    try:
        yield work, env
    finally:
        down = tpuflow("standins", "down", "--workdir", str(work))
        assert f"stopped the stand-ins (pid {state['pid']})" in down.stdout
        with pytest.raises(ProcessLookupError):
            os.kill(state["pid"], 0)
        assert not (work / "state.json").exists()


def run(env: dict[str, str], *command: str, stdin: str | None = None, ok: bool = True) -> str:
    proc = subprocess.run(list(command), input=stdin, capture_output=True, text=True, env=env, timeout=120)
    if ok:
        assert proc.returncode == 0, f"{' '.join(command)}\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout + proc.stderr


def kubectl(env: dict[str, str], *args: str, stdin: str | None = None, ok: bool = True) -> str:
    return run(env, "kubectl", *args, stdin=stdin, ok=ok)


def gke_pool(env: dict[str, str], name: str, machine: str, nodes: int, topology: str | None = None) -> None:
    """A node pool through the GKE API (the gcloud test drives gcloud itself), ready when this returns."""
    pool: dict[str, Any] = {"name": name, "config": {"machineType": machine}, "initialNodeCount": nodes}
    if topology:
        pool["placementPolicy"] = {"tpuTopology": topology}
    base = env["CLOUDSDK_API_ENDPOINT_OVERRIDES_CONTAINER"].rstrip("/")
    parent = f"projects/{env['PROJECT_ID']}/locations/{env['ZONE']}/clusters/{env['CLUSTER_NAME']}"
    request = urllib.request.Request(
        f"{base}/v1/{parent}/nodePools",
        data=json.dumps({"nodePool": pool}).encode(),
        method="POST",
        headers={"Content-Type": "application/json"},
    )
    urllib.request.urlopen(request, timeout=10).read()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with urllib.request.urlopen(f"{base}/v1/{parent}/nodePools/{name}", timeout=10) as response:
            if json.load(response)["status"] == "RUNNING":
                return
        time.sleep(0.1)
    raise AssertionError(f"node pool {name} never became RUNNING")


def delete_gke_pool(env: dict[str, str], name: str) -> None:
    base = env["CLOUDSDK_API_ENDPOINT_OVERRIDES_CONTAINER"].rstrip("/")
    parent = f"projects/{env['PROJECT_ID']}/locations/{env['ZONE']}/clusters/{env['CLUSTER_NAME']}"
    urllib.request.urlopen(urllib.request.Request(f"{base}/v1/{parent}/nodePools/{name}", method="DELETE"), timeout=10)


def seed_manifest(flavour: str) -> str:
    """Seed 004's RayCluster manifest for `flavour` ("Trillium (v6e)" / "Ironwood (TPU7x)") as the file holds it."""
    if not SEED.is_file():
        pytest.skip(f"seed 004 not found at {SEED} (set TPUFLOW_SEEDS to the seeds directory)")
    lines = SEED.read_text().splitlines()
    start = next(
        i for i, line in enumerate(lines) if line.strip() == "apiVersion: ray.io/v1" and flavour in lines[i - 2]
    )
    end = next(i for i in range(start, len(lines)) if "cloud.google.com/gke-tpu-topology" in lines[i])
    return "\n".join(line[3:] for line in lines[start : end + 1]) + "\n"


def envsubst(text: str, env: dict[str, str]) -> str:
    if shutil.which("envsubst"):
        return run(env, "envsubst", stdin=text)
    return text.replace("${IMAGE_URI}", env["IMAGE_URI"])


@pytest.fixture
def kubectl_pools(standins: tuple[Path, dict[str, str]]) -> Iterator[None]:
    """The slices the kubectl test's clusters need (two 4x4 slices and a single-host one), deleted afterwards."""
    _, env = standins
    pools = {"seed-pool": ("ct6e-standard-4t", 4, "4x4"), "rendered-pool": ("ct6e-standard-4t", 4, "4x4")}
    pools["serve-pool"] = ("ct6e-standard-1t", 1, None)
    try:
        for name, (machine, nodes, topology) in pools.items():
            gke_pool(env, name, machine, nodes, topology)
        yield
    finally:
        for name in pools:
            with contextlib.suppress(urllib.error.HTTPError):
                delete_gke_pool(env, name)


@pytest.mark.slow
def test_kubectl_against_tpuflow_standins_up(standins: tuple[Path, dict[str, str]], kubectl_pools: None) -> None:
    if shutil.which("kubectl") is None:
        pytest.skip("kubectl is not installed on this machine")
    work, env = standins
    assert "Server Version: v1.33" in kubectl(env, "version")
    resources = kubectl(env, "api-resources")
    assert any(line.split()[:2] == ["services", "svc"] for line in resources.splitlines())
    assert any(line.split()[:2] == ["pods", "po"] for line in resources.splitlines())
    seed = envsubst(seed_manifest("Trillium (v6e)"), env)
    assert "raycluster.ray.io/ray-torchtpu-cluster created" in kubectl(env, "apply", "-f", "-", stdin=seed)
    # Applied before seed 004's step 3 (the hf-secret its pods read HF_TOKEN from): the kubelet cannot create the
    # containers, and says why; the cluster starts once the Secret exists.
    deadline = time.monotonic() + 60
    while "CreateContainerConfigError" not in (
        pods := kubectl(env, "get", "pods", "-l", "ray.io/cluster=ray-torchtpu-cluster")
    ):
        assert time.monotonic() < deadline, pods
        time.sleep(0.2)
    assert 'Error: secret "hf-secret" not found' in kubectl(env, "get", "events")
    assert "secret/hf-secret created" in kubectl(
        env, "create", "secret", "generic", "hf-secret", "--from-literal=hf_api_token=hf_not_a_real_token"
    )  # kubectl sends this one as protobuf
    token = kubectl(env, "get", "secret", "hf-secret", "-o", "jsonpath={.data.hf_api_token}")
    assert base64.b64decode(token) == b"hf_not_a_real_token"
    assert "raycluster.ray.io/ray-torchtpu-cluster" in kubectl(env, "apply", "-f", "-", stdin=seed)
    assert "serverside-applied" in kubectl(env, "apply", "--server-side", "-f", "-", stdin=seed)
    rendered = tpuflow("render", "raycluster", "--accelerator", "v6e", "--topology", "4x4", "--name", "rendered").stdout
    assert "raycluster.ray.io/rendered serverside-applied" in kubectl(
        env, "apply", "--server-side", "-f", "-", stdin=rendered
    )
    serve_config = work / "serve.yaml"
    serve_config.write_text(yaml.safe_dump({"applications": [{"name": "addition", "import_path": "a.b:app"}]}))
    service = tpuflow(
        "render", "rayservice", "--accelerator", "v6e", "--topology", "1x1", "--name", "endpoint",
        "--serve-config", str(serve_config),
    ).stdout  # fmt: skip
    assert "rayservice.ray.io/endpoint created" in kubectl(env, "apply", "-f", "-", stdin=service)

    for name in ("ray-torchtpu-cluster", "rendered"):
        assert "condition met" in kubectl(
            env, "wait", "--for=condition=RayClusterProvisioned", f"raycluster/{name}", "--timeout=60s"
        )
    assert "condition met" in kubectl(env, "wait", "--for=condition=Ready", "rayservice/endpoint", "--timeout=60s")

    table = kubectl(env, "get", "rayclusters", "ray-torchtpu-cluster").splitlines()
    assert table[0].split() == [
        "NAME",
        "DESIRED",
        "WORKERS",
        "AVAILABLE",
        "WORKERS",
        "CPUS",
        "MEMORY",
        "GPUS",
        "STATUS",
        "AGE",
    ]
    assert table[1].split()[:7] == ["ray-torchtpu-cluster", "4", "4", "260", "816Gi", "0", "ready"]
    assert "TPUS" in kubectl(env, "get", "raycluster", "rendered", "-o", "wide")
    assert "ray-torchtpu-cluster" in kubectl(env, "get", "all")  # rayclusters are in the `all` category
    assert "SERVICE STATUS" in kubectl(env, "get", "rayservices") and "Running" in kubectl(env, "get", "rayservices")

    pods = kubectl(env, "get", "pods", "-l", "ray.io/cluster=ray-torchtpu-cluster").splitlines()
    assert pods[0].split() == ["NAME", "READY", "STATUS", "RESTARTS", "AGE"]
    rows = [line.split() for line in pods[1:]]
    assert sorted(r[0].split("-")[-2] for r in rows) == ["head", "worker", "worker", "worker", "worker"]
    assert {(r[1], r[2]) for r in rows} == {("1/1", "Running")}

    # Seed 004 step 4: the TPU variables the webhook injected.
    envs = kubectl(
        env, "get", "pods", "-l", "ray.io/cluster=ray-torchtpu-cluster,ray.io/node-type=worker",
        "-o=jsonpath={range .items[0].spec.containers[0].env[*]}{.name}={.value}{\"\\n\"}{end}",
    )  # fmt: skip
    injected = dict(line.split("=", 1) for line in envs.splitlines() if "=" in line)
    hosts = [f"v6e-16-0-{h}.ray-torchtpu-cluster-headless" for h in range(4)]
    assert injected["TPU_WORKER_HOSTNAMES"] == ",".join(hosts)
    assert injected["TPU_NAME"] == "v6e-16-0" and injected["TPU_WORKER_ID"] in {"0", "1", "2", "3"}
    assert injected["TORCH_TPU_TOPOLOGY"] == "4,4,1"
    assert injected["TORCH_TPU_SLICEBUILDER_ADDRESSES"].split(",") == [
        f"{h}:{p}" for h in hosts for p in range(8471, 8475)
    ]
    assert "ray-torchtpu-cluster-headless" in kubectl(env, "get", "svc")

    as_yaml = yaml.safe_load(kubectl(env, "get", "raycluster", "ray-torchtpu-cluster", "-o", "yaml"))
    assert {c["type"]: c["status"] for c in as_yaml["status"]["conditions"]}["RayClusterProvisioned"] == "True"
    head = kubectl(env, "get", "raycluster", "ray-torchtpu-cluster", "-o", "jsonpath={.status.head.podName}")
    described = kubectl(env, "describe", "raycluster", "ray-torchtpu-cluster")
    assert "CreatedHeadPod" in described and f"Created head Pod default/{head}" in described
    assert "CreatedWorkerPod" in kubectl(env, "events", "--for", "raycluster/ray-torchtpu-cluster")
    assert "Successfully assigned" in kubectl(env, "describe", "pod", head)
    assert "Ray runtime started" in kubectl(env, "logs", head)

    # The webhook refuses a numOfHosts that contradicts the topology; a schema violation is refused as kubectl shows it.
    wrong = seed.replace("numOfHosts: 4", "numOfHosts: 2").replace("name: ray-torchtpu-cluster", "name: wrong-hosts")
    refused = kubectl(env, "apply", "-f", "-", stdin=wrong, ok=False)
    assert 'admission webhook "validate-raycluster.gke-tpu.ray.io" denied the request' in refused
    assert "Number of workers in worker group not equal to specified topology" in refused
    typo = seed.replace("numOfHosts: 4", "numOfHosts: 4\n    numHosts: 4").replace(
        "name: ray-torchtpu-cluster", "name: typo"
    )
    assert 'strict decoding error: unknown field "spec.workerGroupSpecs[0].numHosts"' in kubectl(
        env, "apply", "-f", "-", stdin=typo, ok=False
    )

    assert 'raycluster.ray.io "ray-torchtpu-cluster" deleted' in kubectl(
        env, "delete", "raycluster", "ray-torchtpu-cluster", "--wait", "--timeout=60s"
    )
    assert "NotFound" in kubectl(env, "get", "raycluster", "ray-torchtpu-cluster", ok=False)
    assert kubectl(env, "get", "pods", "-l", "ray.io/cluster=ray-torchtpu-cluster", "-o", "name") == ""
    kubectl(env, "delete", "rayservice/endpoint", "raycluster/rendered", "--wait", "--timeout=60s")
    assert kubectl(env, "get", "rayclusters,rayservices,pods", "-o", "name") == ""
    assert 'secret "hf-secret" deleted' in kubectl(env, "delete", "secret", "hf-secret", "--ignore-not-found")


@pytest.mark.slow
def test_gcloud_runs_seed_004s_node_pool_commands(standins: tuple[Path, dict[str, str]]) -> None:
    if shutil.which("gcloud") is None:
        pytest.skip("gcloud is not installed on this machine")
    _, env = standins
    common = [f"--project={env['PROJECT_ID']}", f"--cluster={env['CLUSTER_NAME']}", f"--zone={env['ZONE']}"]
    creates = {  # seed 004's commands as written (v6e 4x4, tpu7x 2x2x2), and with its --spot / reservation tips
        "tpu-multi-host-pool": ["--machine-type=ct6e-standard-4t", "--tpu-topology=4x4", "--num-nodes=4"],
        "tpu7x-pool": ["--machine-type=tpu7x-standard-4t", "--tpu-topology=2x2x2", "--num-nodes=2"],
        "spot-pool": ["--machine-type=ct6e-standard-4t", "--tpu-topology=4x4", "--num-nodes=4", "--spot"],
        "reserved-pool": [
            "--machine-type=tpu7x-standard-4t", "--tpu-topology=2x2x2", "--num-nodes=2",
            "--reservation-affinity=specific", "--reservation=my-tpu-reservation",
        ],
    }  # fmt: skip
    # gcloud waits for each operation; the four creates run side by side (GKE allows 5 at once per cluster).
    procs = {
        name: subprocess.Popen(
            ["gcloud", "container", "node-pools", "create", name, *common, *flags],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
        )  # fmt: skip
        for name, flags in creates.items()
    }
    for name, proc in procs.items():
        out, _ = proc.communicate(timeout=120)
        assert proc.returncode == 0 and "Created [" in out and f"/nodePools/{name}]" in out, out
    listed = run(env, "gcloud", "container", "node-pools", "list", *common, "--format=json")
    pools = {p["name"]: p for p in json.loads(listed)}
    assert set(pools) == set(creates) and {p["status"] for p in pools.values()} == {"RUNNING"}
    assert pools["tpu-multi-host-pool"]["placementPolicy"] == {"tpuTopology": "4x4"}
    assert pools["spot-pool"]["config"]["spot"] is True
    assert pools["reserved-pool"]["config"]["reservationAffinity"] == {
        "consumeReservationType": "SPECIFIC_RESERVATION",
        "key": "compute.googleapis.com/reservation-name",
        "values": ["my-tpu-reservation"],
    }
    described = yaml.safe_load(run(env, "gcloud", "container", "node-pools", "describe", "tpu7x-pool", *common))
    assert described["config"]["machineType"] == "tpu7x-standard-4t" and described["initialNodeCount"] == 2
    # GKE's refusal, in GKE's words: a single-host machine cannot form a multi-host topology.
    refused = run(
        env, "gcloud", "container", "node-pools", "create", "bad-pool", *common,
        "--machine-type=ct6e-standard-8t", "--tpu-topology=4x4", "--num-nodes=2", ok=False,
    )  # fmt: skip
    assert "code=400" in refused and "cannot form TPU topology 4x4" in refused
    ops = json.loads(run(env, "gcloud", "container", "operations", "list", f"--zone={env['ZONE']}", "--format=json"))
    ops = [o for o in ops if o["targetLink"].rsplit("/", 1)[-1] in creates]  # other tests' pools aside
    assert sorted(o["targetLink"].rsplit("/", 1)[-1] for o in ops) == sorted(creates)
    assert {o["operationType"] for o in ops} == {"CREATE_NODE_POOL"} and {o["status"] for o in ops} == {"DONE"}
    op = yaml.safe_load(
        run(env, "gcloud", "container", "operations", "describe", ops[0]["name"], f"--zone={env['ZONE']}")
    )
    assert op["name"] == ops[0]["name"] and op["status"] == "DONE"
    deleted = run(env, "gcloud", "container", "node-pools", "delete", "tpu7x-pool", *common, "--quiet")
    assert "Deleted [" in deleted and "/nodePools/tpu7x-pool]" in deleted
    remaining = json.loads(run(env, "gcloud", "container", "node-pools", "list", *common, "--format=json"))
    assert sorted(p["name"] for p in remaining) == sorted(set(creates) - {"tpu7x-pool"})
    for name in remaining:
        delete_gke_pool(env, name["name"])


def test_standins_cli_refuses_bad_input_in_one_line(tmp_path: Path) -> None:
    proc = tpuflow("standins", "up", "--workdir", str(tmp_path), "--operation-seconds", "-1", check=False)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "--operation-seconds" in proc.stderr
    proc = tpuflow("standins", "up", "--workdir", str(tmp_path), "--crds", str(tmp_path), check=False)
    assert proc.returncode == 2 and "ray.io_rayclusters.yaml" in proc.stderr and "Traceback" not in proc.stderr
    assert tpuflow("standins", "down", "--workdir", str(tmp_path)).stdout.startswith("no stand-ins running")
    proc = tpuflow("standins", "up", "--workdir", str(tmp_path), "--control-plane", "real", "--fake", check=False)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "--fake" in proc.stderr


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0, reason="the node agent makes network namespaces: root only")
def test_standins_up_real_serves_kubectl_and_down_leaves_nothing(tmp_path: Path) -> None:
    """The real control plane behind `tpuflow standins up` (its default): kubectl sees the real API server's
    version, the node agent's default-pool node and KubeRay's CRDs; a slice's RayCluster that `tpuflow render`
    printed is applied with kubectl, waited for, listed, described and deleted as a user does it (not `kubectl
    logs`: the node agent serves no kubelet API), and a manifest whose numOfHosts contradicts its topology is refused by GKE's webhook, called by the real API
    server; `down` stops every process it started."""
    work = tmp_path / "real"
    up = tpuflow("standins", "up", "--workdir", str(work), "--no-gcs", "--operation-seconds", "0")
    assert "the real operator" in up.stdout, up.stdout
    state = json.loads((work / "state.json").read_text())
    pids = [state["pid"], *state["components"]["pids"].values()]
    env = {**os.environ, **read_env_sh(work / "env.sh")}
    try:
        if shutil.which("kubectl") is None:
            pytest.skip("kubectl is not installed on this machine")  # `down` below still runs
        shown = subprocess.run(
            ["kubectl", "version", "-o", "json"], capture_output=True, text=True, env=env, timeout=60
        )
        version = json.loads(shown.stdout)  # stderr may warn of version skew
        assert version["serverVersion"]["gitVersion"] == "v1.36.3"
        assert "gke-tpu-cluster-default-pool-0" in run(env, "kubectl", "get", "nodes", "-o", "name")
        assert "rayclusters.ray.io" in run(env, "kubectl", "get", "crd", "-o", "name")
        kubectl_drives_a_slice_cluster(env)
    finally:
        down = tpuflow("standins", "down", "--workdir", str(work))
    assert f"stopped the stand-ins (pid {state['pid']})" in down.stdout
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    assert not [
        n
        for n in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
        if n.startswith("tpf")
    ]


def kubectl_drives_a_slice_cluster(env: dict[str, str]) -> None:
    gke_pool(env, "kubectl-slice", "ct6e-standard-4t", 1)  # single-host: no placement policy
    rendered = tpuflow("render", "raycluster", "--accelerator", "v6e", "--topology", "2x2", "--name", "by-hand",
                       "--head-cpu", "1", "--head-memory", "2G", "--worker-cpu", "2", "--worker-memory", "4G", env=env)  # fmt: skip
    manifest = rendered.stdout
    assert "raycluster.ray.io/by-hand created" in run(env, "kubectl", "apply", "-f", "-", stdin=manifest)
    ready = "--for=jsonpath={.status.state}=ready"
    assert "condition met" in run(env, "kubectl", "wait", ready, "raycluster/by-hand", "--timeout=240s")
    table = run(env, "kubectl", "get", "rayclusters").splitlines()  # the real CRD's printer columns
    assert "DESIRED WORKERS" in table[0] and "STATUS" in table[0] and "ready" in table[1], table
    assert "CreatedWorkerPod" in run(env, "kubectl", "describe", "raycluster", "by-hand")
    head = run(env, "kubectl", "get", "raycluster", "by-hand", "-o", "jsonpath={.status.head.podName}").strip()
    assert "Successfully assigned" in run(env, "kubectl", "describe", "pod", head)  # the real scheduler's event
    workers = run(env, "kubectl", "get", "pods", "-l", "ray.io/node-type=worker", "-o",
                  "jsonpath={.items[0].spec.nodeName}")  # fmt: skip
    assert "kubectl-slice" in workers, workers
    wrong = yaml.safe_load(manifest)
    wrong["metadata"]["name"] = "wrong-hosts"
    wrong["spec"]["workerGroupSpecs"][0]["numOfHosts"] = 2  # a 2x2 v6e slice is one host
    refused = run(env, "kubectl", "apply", "-f", "-", stdin=yaml.safe_dump(wrong), ok=False)
    assert 'admission webhook "raycluster-kuberay-tpu-webhook.ray-system.svc" denied the request' in refused, refused
    assert "Number of workers in worker group not equal to specified topology" in refused, refused
    assert 'raycluster.ray.io "by-hand" deleted' in run(
        env, "kubectl", "delete", "raycluster", "by-hand", "--cascade=foreground", "--timeout=180s"
    )
    assert run(env, "kubectl", "get", "pods", "-l", "ray.io/cluster=by-hand", "-o", "name").strip() == ""
    delete_gke_pool(env, "kubectl-slice")


def test_demo_on_the_gke_standins_refuses_keep_endpoint_in_one_line(tmp_path: Path) -> None:
    proc = tpuflow("demo", "--backend", "gke", "--keep-endpoint", "--work-dir", str(tmp_path), check=False)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "--keep-endpoint" in proc.stderr
    assert not (tmp_path / "gke").exists()  # refused before anything started
