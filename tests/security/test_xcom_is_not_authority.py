"""A user who may write XComs rewrites a running run's cluster XCom (as Airflow 3's REST API lets them) to send
the worker's credentials to a server of theirs, or to make a teardown delete a folder of their choosing. The XCom
says which cluster; where it is and with what credential come from the start task's own arguments: the rewritten
run fails with one line, nothing reaches their server, and nothing outside the cluster's own state is deleted.

The rewrite runs as a task between the start task and the consumers (BaseXCom.set on the start task's XCom, the
write the REST API's xcomEntries PATCH makes)."""

from __future__ import annotations

import base64
import textwrap
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from support.dag_modules import import_dag_module, remove_dag_module
from support.standin_dag_run import run_dagtest, standin_airflow_home

REPO = Path(__file__).resolve().parents[2]


class _Recorder(BaseHTTPRequestHandler):
    seen: list[dict[str, str]]

    def _record(self) -> None:
        self.seen.append({"path": self.path, "authorization": self.headers.get("Authorization", "")})
        body = b'{"job_id": "x", "submission_id": "x", "status": "RUNNING"}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = do_PUT = _record

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def attacker() -> Iterator[tuple[str, list[dict[str, str]]]]:
    """The attacker's server on a free loopback port, recording every request's Authorization header."""
    seen: list[dict[str, str]] = []
    handler = type("Handler", (_Recorder,), {"seen": seen})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()


LOCAL_PRELUDE = """
from pathlib import Path

from airflow.sdk import DAG, BaseOperator, TaskGroup, task_group
from airflow.sdk.bases.xcom import BaseXCom

from tpuflow.local.operators import LocalRayCreateClusterOperator, LocalRayDeleteClusterOperator
from tpuflow.rayjob.operators import RaySubmitJobOperator


class RewriteXCom(BaseOperator):
    \"\"\"The attacker's XCom write: the start task's XCom (of map index ``only``, else its own), changed.\"\"\"

    def __init__(self, *, changes, source="start_cluster", only=None, **kwargs):
        super().__init__(**kwargs)
        self.changes, self.source, self.only = changes, source, only

    def execute(self, context):
        ti = context["ti"]
        index = self.only if self.only is not None else (ti.map_index if (ti.map_index or 0) >= 0 else -1)
        if (ti.map_index or 0) >= 0 and self.only is not None and ti.map_index != self.only:
            return
        pulled = ti.xcom_pull(task_ids=self.source, **({"map_indexes": index} if index >= 0 else {}))
        BaseXCom.set(key="return_value", value={**pulled, **self.changes}, dag_id=ti.dag_id, task_id=self.source,
                     run_id=ti.run_id, map_index=index)

"""

LOCAL_DAG = """
with DAG(DAG_ID, schedule=None, render_template_as_native_obj=True) as dag:
    start = LocalRayCreateClusterOperator(task_id="start_cluster", tpu_slice={"accelerator": "v6e", "topology": "2x2"},
                                          base_dir=BASE_DIR)
    rewrite = RewriteXCom(task_id="rewrite", changes=CHANGES)
    job = RaySubmitJobOperator(task_id="job", cluster=start.output, entrypoint="echo hello", deferrable=False,
                               retries=0)
    stop = LocalRayDeleteClusterOperator(task_id="stop_cluster", cluster=start.output, base_dir=BASE_DIR)
    start >> rewrite >> job >> stop.as_teardown(setups=start)
"""


@pytest.fixture
def local_run(migrated_airflow_db: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Path, Any]]:
    """Runs LOCAL_DAG with the given XCom changes in this process (dag.test); the start task records a local
    cluster's state as start() does (a 0700 folder, its token, its owner) without starting Ray."""
    from tpuflow.local import cluster as cluster_mod
    from tpuflow.local.cluster import LocalRayCluster

    base = tmp_path / "clusters"
    written: list[str] = []

    def start(cls: type, tpu: Any, name: str, base_dir: Any, **kwargs: Any) -> LocalRayCluster:
        state = Path(base_dir) / name
        state.mkdir(mode=0o700, parents=True)
        cluster_mod.write_secret_file(state / cluster_mod.TOKEN_FILE, "the-local-ray-token")
        cluster = LocalRayCluster(
            name=name, state_dir=str(state), temp_dir="", gcs_address="127.0.0.1:1",
            dashboard_url="http://127.0.0.1:9", serve_port=9, slice=tpu.to_dict(), owner=kwargs["owner"],
        )  # fmt: skip
        cluster.save()
        return cluster

    monkeypatch.setattr(LocalRayCluster, "start", classmethod(start))

    def stop(self: LocalRayCluster, *args: Any, **kwargs: Any) -> list[int]:
        Path(self.state_dir, cluster_mod.STATE_FILE).unlink()
        return []

    monkeypatch.setattr(LocalRayCluster, "stop", stop)

    def run(dag_id: str, changes: dict[str, Any], body: str = LOCAL_DAG) -> Any:
        header = f"DAG_ID = {dag_id!r}\nBASE_DIR = {str(base)!r}\nCHANGES = {changes!r}\n"
        written.append(dag_id)
        return import_dag_module(migrated_airflow_db, dag_id, header + LOCAL_PRELUDE + body).dag.test()

    yield base, run
    for dag_id in written:
        remove_dag_module(migrated_airflow_db, dag_id)


def _states(run: Any) -> dict[str, str]:
    return {ti.task_id: ti.state for ti in run.get_task_instances()}


def test_a_rewritten_local_dashboard_and_token_path_send_nothing_anywhere(
    local_run: tuple[Path, Any], attacker: tuple[str, list[dict[str, str]]], tmp_path: Path, capfd: Any
) -> None:
    base, run_dag = local_run
    url, seen = attacker
    secret = tmp_path / "worker-only-secret"
    secret.write_text("a-secret-only-the-worker-can-read\n")
    run = run_dag("xcom_local_redirect", {"dashboard_url": url, "auth_token_path": str(secret)})
    states = _states(run)
    assert states["job"] == "failed" and states["stop_cluster"] == "success", states
    assert seen == [], f"the worker called the attacker's server: {seen}"
    assert not list(base.rglob("state.json")), "the teardown did not stop the run's own cluster"
    out = capfd.readouterr()
    assert "cluster['auth_token_path']" in out.out + out.err and "clear start_cluster" in out.out + out.err


def test_a_rewritten_state_dir_deletes_nothing_of_the_attackers_choosing(
    local_run: tuple[Path, Any], tmp_path: Path
) -> None:
    base, run_dag = local_run
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "state.json").write_text("{}")  # looks like a cluster's state to a teardown that trusts the XCom
    run = run_dag("xcom_local_state_dir", {"state_dir": str(victim), "dashboard_url": "http://127.0.0.1:9"})
    states = _states(run)
    assert states["stop_cluster"] == "success", states
    assert (victim / "state.json").exists(), "the teardown acted on the folder the rewritten XCom named"
    assert not list(base.rglob("state.json")), "the teardown did not stop the run's own cluster"


SLICE_2X2 = {"accelerator": "v6e", "topology": "2x2"}
SLICE_2X4 = {"accelerator": "v6e", "topology": "2x4"}

# A sweep on one cluster: the job is mapped, its cluster the unmapped start task's XCom (in partial).
SWEEP_DAG = f"""
with DAG(DAG_ID, schedule=None, render_template_as_native_obj=True) as dag:
    start = LocalRayCreateClusterOperator(task_id="start_cluster", tpu_slice={SLICE_2X2}, base_dir=BASE_DIR)
    rewrite = RewriteXCom(task_id="rewrite", changes=CHANGES)
    job = RaySubmitJobOperator.partial(task_id="job", cluster=start.output, deferrable=False, retries=0).expand(
        entrypoint=["echo a", "echo b", "echo c"])
    stop = LocalRayDeleteClusterOperator(task_id="stop_cluster", cluster=start.output, base_dir=BASE_DIR)
    start >> rewrite >> job >> stop.as_teardown(setups=start)
"""

# One cluster per slice: the start task is mapped, each job expanded over its XCom; one unmapped teardown.
MAPPED_START_DAG = f"""
with DAG(DAG_ID, schedule=None, render_template_as_native_obj=True) as dag:
    start = LocalRayCreateClusterOperator.partial(task_id="start_cluster", base_dir=BASE_DIR).expand(
        tpu_slice=[{SLICE_2X2}, {SLICE_2X4}])
    rewrite = RewriteXCom(task_id="rewrite", changes=CHANGES, only=1)
    job = RaySubmitJobOperator.partial(task_id="job", entrypoint="echo hello", deferrable=False, retries=0).expand(
        cluster=start.output)
    stop = LocalRayDeleteClusterOperator(task_id="stop_cluster", cluster=start.output, base_dir=BASE_DIR)
    start >> rewrite >> job >> stop.as_teardown(setups=start)
"""

# A mapped TaskGroup: start, job and stop per map index, task ids under the group's prefix.
MAPPED_GROUP_DAG = f"""
with DAG(DAG_ID, schedule=None, render_template_as_native_obj=True) as dag:
    @task_group(group_id="per_run")
    def per_run(entrypoint):
        start = LocalRayCreateClusterOperator(task_id="start_cluster", tpu_slice={SLICE_2X2}, base_dir=BASE_DIR)
        rewrite = RewriteXCom(task_id="rewrite", changes=CHANGES, source="per_run.start_cluster", only=1)
        job = RaySubmitJobOperator(task_id="job", cluster=start.output, entrypoint=entrypoint, deferrable=False,
                                   retries=0)
        stop = LocalRayDeleteClusterOperator(task_id="stop_cluster", cluster=start.output, base_dir=BASE_DIR)
        start >> rewrite >> job >> stop.as_teardown(setups=start)

    per_run.expand(entrypoint=["echo a", "echo b"])
"""

# A plain TaskGroup: the teardown finds the group's start task from its cluster argument.
GROUP_DAG = f"""
with DAG(DAG_ID, schedule=None, render_template_as_native_obj=True) as dag:
    with TaskGroup("train"):
        start = LocalRayCreateClusterOperator(task_id="start_cluster", tpu_slice={SLICE_2X2}, base_dir=BASE_DIR)
        rewrite = RewriteXCom(task_id="rewrite", changes=CHANGES, source="train.start_cluster")
        job = RaySubmitJobOperator(task_id="job", cluster="{{{{ ti.xcom_pull(task_ids='train.start_cluster') }}}}",
                                   entrypoint="echo hello", deferrable=False, retries=0)
        stop = LocalRayDeleteClusterOperator(task_id="stop_cluster", cluster=start.output, base_dir=BASE_DIR)
        start >> rewrite >> job >> stop.as_teardown(setups=start)
"""


@pytest.fixture
def jobs_reached(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """The cluster each job instance would submit to, once its cluster argument is trusted (no Ray needed)."""
    from tpuflow.rayjob.operators import RaySubmitJobOperator

    reached: list[dict[str, Any]] = []

    def record(self: RaySubmitJobOperator, context: Any) -> str:
        reached.append({"task": self.task_id, "map_index": context["ti"].map_index, **dict(self.cluster or {})})
        return "recorded"

    monkeypatch.setattr(RaySubmitJobOperator, "_execute_checked", record)
    return reached


def test_an_xcom_naming_another_address_only_reaches_the_clusters_own_and_says_so(
    local_run: tuple[Path, Any],
    jobs_reached: list[dict[str, Any]],
    attacker: tuple[str, list[dict[str, str]]],
    capfd: Any,
) -> None:
    """Addresses are never taken from XCom, nor refused for differing: a KubeRay head replaced after its node died
    answers at a new pod address its start task's XCom cannot know (tests/faults/controlplane_matrix.py, the node
    agent row). The job reaches the cluster's own address and the log says the XCom named another."""
    _, run_dag = local_run
    url, seen = attacker
    run = run_dag("xcom_local_moved", {"dashboard_url": url, "serve_url": url})
    assert _states(run)["job"] == "success", _states(run)
    (job,) = jobs_reached
    assert job["dashboard_url"] == "http://127.0.0.1:9" and job["serve_url"] != url, job
    assert seen == [], f"the worker called the address the XCom named: {seen}"
    out = capfd.readouterr()
    assert "names dashboard_url, serve_url other than the cluster's now" in out.out + out.err


def _mapped_states(run: Any) -> dict[tuple[str, int], str]:
    return {(ti.task_id, ti.map_index): ti.state for ti in run.get_task_instances()}


@pytest.mark.parametrize(
    ("body", "jobs", "clusters"),
    [(SWEEP_DAG, 3, 1), (MAPPED_START_DAG, 2, 2), (MAPPED_GROUP_DAG, 2, 2), (GROUP_DAG, 1, 1)],
    ids=["mapped-job-one-cluster", "mapped-start", "mapped-task-group", "task-group"],
)
def test_mapped_and_grouped_jobs_reach_their_own_start_tasks_cluster(
    local_run: tuple[Path, Any], jobs_reached: list[dict[str, Any]], body: str, jobs: int, clusters: int
) -> None:
    """Untouched XComs: every job instance is let through to the cluster its start task instance made, and the
    teardown stops every cluster."""
    base, run_dag = local_run
    run = run_dag(f"xcom_shapes_{jobs}_{clusters}_{abs(hash(body)) % 1000}", {}, body)
    states = _mapped_states(run)
    assert all(state == "success" for state in states.values()), states
    assert len(jobs_reached) == jobs, jobs_reached
    assert len({job["name"] for job in jobs_reached}) == clusters, jobs_reached
    assert not list(base.rglob("state.json")), "a teardown left a cluster running"


@pytest.mark.parametrize(
    ("body", "refused"),
    [(SWEEP_DAG, [0, 1, 2]), (MAPPED_START_DAG, [1]), (MAPPED_GROUP_DAG, [1]), (GROUP_DAG, [-1])],
    ids=["mapped-job-one-cluster", "mapped-start", "mapped-task-group", "task-group"],
)
def test_a_rewritten_xcom_of_a_mapped_or_grouped_start_task_reaches_nothing(
    local_run: tuple[Path, Any],
    jobs_reached: list[dict[str, Any]],
    attacker: tuple[str, list[dict[str, str]]],
    tmp_path: Path,
    body: str,
    refused: list[int],
) -> None:
    """The same shapes, one start instance's XCom pointed at the attacker: the job instances reading it fail,
    the others run on their own cluster, no job is handed the attacker's address or file."""
    base, run_dag = local_run
    url, _ = attacker
    secret = tmp_path / "worker-only-secret"
    secret.write_text("a-secret-only-the-worker-can-read\n")
    run = run_dag(
        f"xcom_shapes_attack_{abs(hash(body)) % 1000}", {"dashboard_url": url, "auth_token_path": str(secret)}, body
    )
    states = _mapped_states(run)
    job_states = {index: state for (task, index), state in states.items() if task.endswith("job")}
    assert {index for index, state in job_states.items() if state == "failed"} == set(refused), states
    assert all(state == "success" for index, state in job_states.items() if index not in refused), states
    assert all(job["dashboard_url"] != url and job["auth_token_path"] != str(secret) for job in jobs_reached)
    assert not list(base.rglob("state.json")), "a teardown left a cluster running"


KUBERAY_DAG = textwrap.dedent("""
    from airflow.sdk import DAG, BaseOperator
    from airflow.sdk.bases.xcom import BaseXCom

    from tpuflow.kuberay.operators import KubeRayCreateClusterOperator, KubeRayDeleteClusterOperator
    from tpuflow.rayjob.operators import RaySubmitJobOperator
    from tpuflow.tpu import TpuSlice

    COMMON = dict(kubernetes_conn_id="kube_standin", deferrable=False, poll_interval=0.2)


    class RewriteXCom(BaseOperator):
        def execute(self, context):
            ti = context["ti"]
            value = ti.xcom_pull(task_ids="ray_cluster")
            value["dashboard_url"] = ATTACKER
            value["ray_auth"] = {**value["ray_auth"], "secret_name": "prod-credentials"}
            BaseXCom.set(key="return_value", value=value, dag_id=ti.dag_id, task_id="ray_cluster", run_id=ti.run_id)


    with DAG("xcom_kuberay_redirect", schedule=None, render_template_as_native_obj=True) as dag:
        create = KubeRayCreateClusterOperator(task_id="ray_cluster", tpu_slice=TpuSlice.from_spec("v6e", "2x2"),
                                              image="rayproject/ray:2.60.0-py311", wait_timeout=60, **COMMON)
        job = RaySubmitJobOperator(task_id="job", cluster=create.output, entrypoint="echo hello", deferrable=False,
                                   retries=0)
        delete = KubeRayDeleteClusterOperator(task_id="delete_ray_cluster", cluster_task_id="ray_cluster",
                                              wait_timeout=60, **COMMON)
        create >> RewriteXCom(task_id="rewrite") >> job >> delete.as_teardown(setups=create)
""")


@pytest.mark.slow
def test_a_rewritten_kuberay_xcom_cannot_read_another_secret_or_send_it_away(
    tmp_path: Path, attacker: tuple[str, list[dict[str, str]]]
) -> None:
    """On the Kubernetes stand-in (simulated KubeRay, token auth): the XCom rewritten to read another Secret of
    the namespace through the task's connection and send it to the attacker's URL."""
    from support.kuberay_standin import one_slice_kuberay

    from tpuflow_rehearsal.standins.kubernetes_api import CORE_TYPES

    url, seen = attacker
    with one_slice_kuberay(tmp_path / "kube") as kube:
        prod = base64.b64encode(b"prod-database-password").decode()
        kube.store.create(
            CORE_TYPES["secrets"],
            "default",
            {"metadata": {"name": "prod-credentials"}, "data": {"auth_token": prod, "token": prod}},
        )
        dag_file, env = standin_airflow_home(
            tmp_path / "airflow",
            kube.connection_env("kube_standin"),
            "xcom_kuberay_redirect",
            f"ATTACKER = {url!r}\n" + KUBERAY_DAG,
        )
        result, output = run_dagtest(dag_file, "xcom_kuberay_redirect", env)
    states = result["states"]
    assert states["job"] == "failed" and states["delete_ray_cluster"] == "success", (states, output[-5000:])
    assert seen == [], f"the worker called the attacker's server: {seen}"
    assert "no longer matches the cluster that task made" in output, output[-5000:]
