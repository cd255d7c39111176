"""`tpuflow standins up` / `env`: the export lines that point an Airflow at the stand-ins (issue 25, item 5).

The lines `up` prints and `eval "$(tpuflow standins env --workdir DIR)"` applies are the whole configuration:
applied to the environment, Airflow's own connection lookup reaches the running GKE and Kubernetes stand-ins
through tpuflow's hooks, the Variables are the ones the GKE pipeline tests set (tests/support/gke_pipeline.py),
and the output root is a bucket on the GCS emulator `up` started beside them.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.gke_pipeline import point_airflow_at

from tpuflow.errors import UserInputError
from tpuflow_rehearsal.cli.standins_cmd import GCS_BUCKET, airflow_env, export_lines

REPO = Path(__file__).resolve().parents[2]


def tpuflow(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tpuflow.cli", *args], capture_output=True, text=True, env=env, timeout=120
    )


def parse_exports(text: str) -> dict[str, str]:
    """The `export KEY=VALUE` lines of `text`, read as a shell reads them."""
    out = {}
    for line in text.splitlines():
        if line.startswith("export "):
            words = shlex.split(line)
            assert len(words) == 2, line  # one quoted word per value
            key, _, value = words[1].partition("=")
            out[key] = value
    return out


@pytest.fixture(scope="module")
def standins(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str]]:
    """`tpuflow standins up --fake` in a folder whose name needs quoting; yields (work dir, up's stdout)."""
    work = tmp_path_factory.mktemp("standins") / "it's $(a) dir"
    up = tpuflow("standins", "up", "--workdir", str(work), "--fake", "--operation-seconds", "0.1")
    assert up.returncode == 0, up.stdout + up.stderr
    pids = [json.loads((work / name / "state.json").read_text())["pid"] for name in (".", "gcs-emulator")]
    pids.append(json.loads((work / "gcs-emulator" / "state.json").read_text())["metadata_pid"])
    try:
        yield work, up.stdout
    finally:
        down = tpuflow("standins", "down", "--workdir", str(work))
        assert down.returncode == 0 and f"stopped the GCS emulator (pid {pids[1]})" in down.stdout, down.stdout
        assert f"GCE metadata stand-in (pid {pids[2]})" in down.stdout, down.stdout
        for pid in pids:
            with pytest.raises(ProcessLookupError):
                os.kill(pid, 0)


def test_env_evals_to_the_lines_up_printed(standins: tuple[Path, str]) -> None:
    work, up_out = standins
    printed = parse_exports(up_out)
    assert f'eval "$(tpuflow standins env --workdir {shlex.quote(str(work))})"' in up_out
    assert "Kubernetes API:  https://127.0.0.1:" in up_out  # what the kubectl test reads is still there
    env = tpuflow("standins", "env", "--workdir", str(work))
    assert env.returncode == 0 and env.stderr == "", env.stderr
    assert parse_exports(env.stdout) == printed
    # The shell's own eval, on a work dir holding a quote and $(...), gives the same values.
    shell = subprocess.run(
        ["bash", "-c", f'eval "$({shlex.join([sys.executable, "-m", "tpuflow.cli", "standins", "env", "--workdir", str(work)])})" && env -0'],
        capture_output=True,
        text=True,
        timeout=60,
    )  # fmt: skip
    assert shell.returncode == 0, shell.stderr
    evaluated = dict(item.split("=", 1) for item in shell.stdout.split("\0") if "=" in item)
    assert {key: evaluated[key] for key in printed} == printed


def test_the_lines_point_airflow_and_the_pipeline_at_the_running_standins(
    standins: tuple[Path, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow.sdk import Variable

    from tpuflow.gke.hooks import GKENodePoolHook
    from tpuflow.kuberay.hooks import KubeRayHook

    work, up_out = standins
    state = json.loads((work / "state.json").read_text())
    exports = parse_exports(up_out)
    # The Variables are the ones the GKE pipeline tests configure, the output root a bucket on the emulator.
    expected = _point_airflow_at_variables(monkeypatch, outputs=f"gs://{GCS_BUCKET}/outputs")
    for key, value in exports.items():
        monkeypatch.setenv(key, value)
    assert {name: Variable.get(name) for name in expected} == expected
    assert Variable.get("tpuflow_backend") == "gke"
    emulator = exports["STORAGE_EMULATOR_HOST"]
    with urllib.request.urlopen(f"{emulator}/storage/v1/b/{GCS_BUCKET}", timeout=10) as response:
        assert json.load(response)["name"] == GCS_BUCKET
    # ... and the GCE metadata stand-in beside it, which the jobs' plain client libraries take a token from
    metadata = exports["TPUFLOW_GCE_METADATA_HOST"]
    token = f"http://{metadata}/computeMetadata/v1/instance/service-accounts/default/token"
    with urllib.request.urlopen(urllib.request.Request(token, headers={"Metadata-Flavor": "Google"}), timeout=10) as r:
        assert json.load(r)["token_type"] == "Bearer"

    # Both connections resolve, through Airflow's lookup, to the running stand-ins.
    gcp = GKENodePoolHook(gcp_conn_id=Variable.get("tpuflow_gcp_conn_id"), location=state["zone"])
    assert gcp.get_connection(gcp.gcp_conn_id).extra_dejson["container_api_endpoint"] == state["gke_url"]
    assert gcp.list_node_pools(project_id=state["project"], cluster_name=Variable.get("tpuflow_gke_cluster")) == []
    kube = KubeRayHook(conn_id=Variable.get("tpuflow_kubernetes_conn_id"))
    kubeconfig = yaml.safe_load(Path(kube.get_connection(kube.conn_id).extra_dejson["kube_config_path"]).read_text())
    assert kubeconfig["clusters"][0]["cluster"]["server"] == state["kubernetes_url"]
    assert kube.get("rayclusters", "none-yet", "default") is None  # an authenticated round trip, a 404 answered


def _point_airflow_at_variables(monkeypatch: pytest.MonkeyPatch, outputs: str) -> dict[str, str]:
    """The Variables tests/support/gke_pipeline.py's point_airflow_at sets (its connections aside)."""

    class Standin:
        def airflow_connection(self, project: str) -> dict[str, Any]:
            return {}

        def connection_env(self, conn_id: str) -> dict[str, str]:
            return {}

    with monkeypatch.context() as scoped:
        for key in [k for k in os.environ if k.startswith("AIRFLOW_VAR_")]:
            scoped.delenv(key)
        point_airflow_at(scoped, Standin(), Standin(), outputs)  # type: ignore[arg-type]
        return {
            k.removeprefix("AIRFLOW_VAR_").lower(): v for k, v in os.environ.items() if k.startswith("AIRFLOW_VAR_")
        }


STATE = {
    "zone": "us-east5-b",
    "cluster": "tpu-cluster",
    "gcp_conn_id": "gke_standin",
    "kubernetes_conn_id": "kube_standin",
    "airflow_connections": {"AIRFLOW_CONN_GKE_STANDIN": '{"conn_type": "google_cloud_platform"}'},
}


def test_without_an_emulator_the_output_root_is_the_work_dir_and_no_emulator_is_named(tmp_path: Path) -> None:
    env = airflow_env(STATE, tmp_path, None)
    assert env["AIRFLOW_VAR_TPUFLOW_GKE_OUTPUT_ROOT"] == str(tmp_path / "outputs")
    assert "STORAGE_EMULATOR_HOST" not in env and env["AIRFLOW_VAR_TPUFLOW_BACKEND"] == "gke"
    assert export_lines({"A": "it's"}) == ["export A='it'\"'\"'s'"]
    with pytest.raises(UserInputError, match="restart them"):  # a state.json from before `env` existed
        airflow_env({k: v for k, v in STATE.items() if k != "airflow_connections"}, tmp_path, None)


def test_env_without_running_standins_says_how_to_start_them_in_one_line(tmp_path: Path) -> None:
    proc = tpuflow("standins", "env", "--workdir", str(tmp_path))
    assert proc.returncode == 2 and proc.stdout == "" and proc.stderr.count("\n") == 1, proc.stderr
    assert f"tpuflow standins up --workdir {tmp_path}" in proc.stderr and "Traceback" not in proc.stderr
