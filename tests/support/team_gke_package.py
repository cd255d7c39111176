"""A team's own package and DAG written fresh (not the project's): Acme's churn model. Its prep writes gs:// with
plain Ray Data and plain pyarrow (no tpuflow helper), and its train loop resumes from Ray Train's checkpoint and
reports how many rows its dataset shard held, so a rerun shows whether the data doubled
(tests/pipeline/test_team_dag_gke_killed.py)."""

from __future__ import annotations

from pathlib import Path

from support.python_packages import write_team_folder

DAG_ID = "acme_churn_daily"

DAG_FILE = '''\
"""Airflow DAG: Acme's daily churn model on a TPU slice."""

from pathlib import Path

from tpuflow.pipeline.dag import tpu_pipeline
from tpuflow.pipeline.workload import Workload

churn = Workload(
    code_dir=Path(__file__).parent / "acme_churn",
    prep="acme_churn.prep",
    train_loop="acme_churn.fit:loop",
    train_loop_config={"step_seconds": 1.0},
)
dag = tpu_pipeline("acme_churn_daily", workload=churn, schedule="@daily", tags=["acme"])
'''

PREP = '''\
"""Customer features: the training set with Ray Data, the held-out set with plain pyarrow; both to gs://."""

import argparse

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import ray


def main() -> None:
    p = argparse.ArgumentParser()
    for flag in ("--output-dir", "--date"):
        p.add_argument(flag, required=True)
    p.add_argument("--num-train", type=int, required=True)
    p.add_argument("--num-heldout", type=int, required=True)
    args = p.parse_args()

    def features(batch: dict) -> dict:
        rng = np.random.default_rng(int(batch["id"][0]))
        tenure = rng.uniform(0.0, 60.0, len(batch["id"]))
        return {"tenure": tenure, "churned": (tenure < 6.0).astype(float)}

    ray.data.range(args.num_train).map_batches(features).write_parquet(f"{args.output_dir}/train")
    heldout = pa.table({"tenure": np.linspace(0.0, 60.0, args.num_heldout), "churned": np.zeros(args.num_heldout)})
    pq.write_table(heldout, f"{args.output_dir}/heldout/part-0.parquet")
    print(f"acme_churn: wrote {args.num_train} + {args.num_heldout} customers", flush=True)


if __name__ == "__main__":
    main()
'''

FIT = '''\
"""A logistic churn model in JAX, one step a second, checkpointing every few steps and resuming from the last."""

import json
import os
import tempfile
import time


def loop(config: dict) -> None:
    import jax
    import jax.numpy as jnp
    import numpy as np
    import ray.train

    rows = list(ray.train.get_dataset_shard("train").iter_rows())
    x = jnp.asarray(np.array([[r["tenure"] / 60.0, 1.0] for r in rows]))
    y = jnp.asarray(np.array([r["churned"] for r in rows]))
    loss = jax.jit(lambda w: jnp.mean(jnp.logaddexp(0.0, x @ w) - y * (x @ w)))
    step = jax.jit(lambda w: w - 0.5 * jax.grad(loss)(w))
    w, start = jnp.zeros(2), 0
    checkpoint = ray.train.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as folder:
            with open(os.path.join(folder, "state.json")) as f:
                state = json.load(f)
        w, start = jnp.asarray(state["w"]), int(state["step"])
    total, every = int(config["num_steps"]), int(config["checkpoint_every"])
    rank = ray.train.get_context().get_world_rank()
    for i in range(start + 1, total + 1):
        w = step(w)
        time.sleep(float(config["step_seconds"]))
        if i % every and i != total:
            continue
        metrics = {"step": i, "rows": len(rows), "resumed_from": start, "loss": float(loss(w))}
        if rank:
            ray.train.report(metrics)
            continue
        with tempfile.TemporaryDirectory() as folder:
            with open(os.path.join(folder, "state.json"), "w") as f:
                json.dump({"w": np.asarray(w).tolist(), "step": i, "rows": len(rows)}, f)
            ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(folder))
'''


def write_team_project(dags: Path) -> Path:
    """DAGS/acme_churn_dag.py and DAGS/acme_churn/; returns the DAG file."""
    return write_team_folder(dags, "acme_churn", {"prep": PREP, "fit": FIT}, DAG_FILE)
