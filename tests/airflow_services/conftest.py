"""A real local Airflow (api-server, scheduler, dag-processor, triggerer) for this folder's tests.

Started once per session through the same code as `tpuflow airflow up`, in a temporary work
dir with its own TPUFLOW_HOME (local Ray clusters, slice leases) and output root; stopped by
process group at the end, and the test session fails if any of its processes outlive that.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.real_airflow import REPO


@pytest.fixture(scope="session")
def services(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from tpuflow.dev.airflow_services import AirflowServices

    base = tmp_path_factory.mktemp("real-airflow")
    dags = base / "dags"
    dags.mkdir()
    for dag_file in [*(REPO / "dags").glob("*.py"), *(Path(__file__).parent / "dags").glob("*.py")]:
        (dags / dag_file.name).symlink_to(dag_file)
    tpuflow_home = base / "tpuflow-home"
    extra = {
        "AIRFLOW__CORE__DAGS_FOLDER": str(dags),
        "TPUFLOW_HOME": str(tpuflow_home),
        "TPUFLOW_OUTPUT_ROOT": str(base / "outputs"),
        "TPUFLOW_PROBE_LEASES": str(base / "probe" / "leases"),
        "JAX_PLATFORMS": "cpu",
    }
    started = time.time()
    svc = AirflowServices.start(base / "airflow", use_schedule=False, extra_env=extra, timeout=300)
    try:
        svc.wait_for_dags(["tpu_llm_pipeline_local", "tpuflow_slice_lease_probe"])
        print(f"\nreal Airflow up, DAGs parsed, in {time.time() - started:.0f}s at {svc.url}")
        yield svc
    finally:
        svc.stop()
        _stop_local_clusters(tpuflow_home / "clusters")
        leftovers = _processes_with_env("AIRFLOW_HOME", str(svc.home))
        assert leftovers == [], f"processes of the test Airflow outlived stop(): {leftovers}"


def _stop_local_clusters(base: Path) -> None:
    from tpuflow.local.cluster import STATE_FILE, LocalRayCluster

    for state in base.glob(f"*/{STATE_FILE}"):
        LocalRayCluster.load(state.parent).stop()


def _processes_with_env(key: str, value: str) -> list[str]:
    needle = f"{key}={value}".encode()
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            if needle in (proc / "environ").read_bytes().split(b"\0"):
                cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                found.append(f"{proc.name}: {cmdline[:200]}")
        except OSError:
            continue
    return found


@pytest.fixture(scope="session")
def api(services: Any) -> Any:
    return services.api()
