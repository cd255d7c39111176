"""The local pipeline's Ray steps run from an installed tpuflow wheel (run by that venv's python).

Usage: python installed_ray_steps.py WORK_DIR

Starts a local Ray cluster on a simulated v6e 2x2 slice with tpuflow's own launcher, runs
RayDataPrepOperator and RayTrainOperator (few steps, non-deferrable, a minimal task context),
checks that each job's working_dir is the installed tpuflow.workloads, and stops the cluster by
its PIDs. Prints one `RESULT {json}` line. The checkout must be unreachable from here: the caller
runs this from a folder outside it, with no PYTHONPATH.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tpuflow
from tpuflow.local.cluster import LocalRayCluster, _pids_referencing
from tpuflow.rayjob.workload_operators import RayDataPrepOperator, RayTrainOperator
from tpuflow.tpu import TpuSlice

DATE = "2026-11-02"


# Self-contained on purpose (runs in a venv holding only the wheel): not tests/support/airflow_context.py.
@dataclass
class FakeTI:
    dag_id: str
    run_id: str
    task_id: str
    map_index: int = -1
    try_number: int = 1
    xcoms: dict[str, Any] = field(default_factory=dict)

    def xcom_push(self, key: str, value: Any) -> None:
        self.xcoms[key] = value


class TaskStateStore(dict):
    def set(self, key: str, value: Any) -> None:
        self[key] = value


def context(task_id: str) -> dict[str, Any]:
    ti = FakeTI("installed_wheel", "run-1", task_id)
    return {"ti": ti, "task_instance": ti, "task_state_store": TaskStateStore()}


def files_of(folder: Path) -> dict[str, bytes]:
    """Relative path -> content of every file Ray ships from a working_dir (it leaves out __pycache__)."""
    return {
        str(p.relative_to(folder)): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and "__pycache__" not in p.relative_to(folder).parts
    }


def unpacked_working_dir(op: Any, ctx: dict[str, Any], cluster: LocalRayCluster) -> Path:
    """The folder the job's working_dir was unpacked into on the cluster's nodes."""
    sid = ctx["task_state_store"]["ray_submission_id"]
    uri = op.hook().get_client().get_job_info(sid).runtime_env["working_dir"]
    assert uri.startswith("gcs://_ray_pkg_") and uri.endswith(".zip"), f"job {sid}: working_dir {uri!r}"
    found = sorted(Path(cluster.temp_dir).glob(f"*/session_*/runtime_resources/working_dir_files/{uri[6:-4]}"))
    assert found, f"job {sid}: its working_dir {uri} was not unpacked under {cluster.temp_dir}"
    return found[0]


def main(work: Path) -> dict[str, Any]:
    installed = Path(tpuflow.workloads_dir())
    shipped = files_of(installed)
    assert "addition/prep.py" in shipped and "tpuflow_driver/train.py" in shipped, sorted(shipped)
    tpu = TpuSlice.from_spec("TPU-V6E", "2x2")
    cluster = LocalRayCluster.start(tpu, "wheel-v6e", work / "clusters", head_cpus=2, timeout=600)
    out: dict[str, Any] = {"temp_dir": cluster.temp_dir, "pids": [n.pid for n in cluster.nodes]}
    try:
        info = cluster.connection_info()
        prep = RayDataPrepOperator(
            task_id="prep",
            cluster=info,
            module="addition.prep",
            deferrable=False,
            poll_interval=0.5,
            arguments={"output_dir": str(work / "data"), "date": DATE, "num_train": 2000},
        )
        prep_ctx = context("prep")
        out["prep"] = prep.execute(prep_ctx)
        train = RayTrainOperator(
            task_id="train",
            cluster=info,
            deferrable=False,
            poll_interval=0.5,
            framework="jax",
            train_loop="addition.train_jax:train_loop_per_worker",
            tpu_slice={"accelerator": "TPU-V6E", "topology": "2x2"},
            storage_path=str(work / "train"),
            run_name="wheel",
            datasets={"train": str(work / "data" / "train")},
            train_loop_config={"num_steps": 20, "checkpoint_every": 10, "log_every": 10},
        )
        train_ctx = context("train")
        out["train"] = train.execute(train_ctx)
        # What the operators handed Ray, and what Ray unpacked for the jobs: the installed workloads.
        out["working_dirs"] = [prep.build_runtime_env()["working_dir"], train.build_runtime_env()["working_dir"]]
        for op, ctx in ((prep, prep_ctx), (train, train_ctx)):
            unpacked = unpacked_working_dir(op, ctx, cluster)
            assert files_of(unpacked) == shipped, (
                f"{op.task_id}: the job ran {sorted(files_of(unpacked))}, the wheel installed {sorted(shipped)}"
            )
    finally:
        out["signalled"] = cluster.stop()
        out["left"] = _pids_referencing(cluster.temp_dir)
    return out


if __name__ == "__main__":
    print("RESULT " + json.dumps(main(Path(sys.argv[1]))), flush=True)
