"""A team's own package and DAG file, unlike the demo's (names, model, steps), written into a folder as a user
would lay them out: DAGS/acme_sales_dag.py beside DAGS/acme_sales/ (tests/pipeline/test_user_pipeline.py)."""

from __future__ import annotations

from pathlib import Path

from support.python_packages import write_team_folder

DAG_ID = "acme_sales_forecast"

# The user's DAG file, as docs/your-own-model.md shows it (<= 30 lines): no backend in it.
DAG_FILE = '''\
"""Airflow DAG: Acme's daily sales forecast on a TPU slice (prepare, fit, report)."""

from pathlib import Path

from airflow.sdk import Param
from tpuflow.pipeline.dag import tpu_pipeline
from tpuflow.pipeline.workload import Workload

forecast = Workload(
    code_dir=Path(__file__).parent / "acme_sales",
    prep="acme_sales.build_features",
    train_loop="acme_sales.regress:fit",
    check_params="acme_sales.limits:check",
    params={"learning_rate": Param(0.01, type="number", exclusiveMinimum=0, title="Learning rate")},
    train_loop_config={"learning_rate": "{{ params.learning_rate }}"},
)
dag = tpu_pipeline("acme_sales_forecast", workload=forecast, schedule="@daily", tags=["acme"])
'''

BUILD_FEATURES = '''\
"""Weekly sales features with Ray Data: writes OUTPUT/train and OUTPUT/heldout as parquet."""

import argparse

import numpy as np
import ray


def main() -> None:
    p = argparse.ArgumentParser()
    for flag in ("--output-dir", "--date"):
        p.add_argument(flag, required=True)
    p.add_argument("--num-train", type=int, required=True)
    p.add_argument("--num-heldout", type=int, required=True)
    args = p.parse_args()
    seed = int(args.date.replace("-", ""))

    def features(batch: dict) -> dict:
        rng = np.random.default_rng(seed + int(batch["id"][0]))
        price = rng.uniform(1.0, 9.0, len(batch["id"]))
        promo = rng.integers(0, 2, len(batch["id"])).astype(float)
        return {"price": price, "promo": promo, "units": 40.0 - 3.0 * price + 12.0 * promo}

    for split, rows in (("train", args.num_train), ("heldout", args.num_heldout)):
        ray.data.range(rows).map_batches(features).write_parquet(f"{args.output_dir}/{split}")
    print(f"acme_sales: wrote {args.num_train} + {args.num_heldout} weeks to {args.output_dir}", flush=True)


if __name__ == "__main__":
    main()
'''

REGRESS = '''\
"""A linear demand model fitted with JAX on each worker's shard of the features."""

import os
import tempfile


def fit(config: dict) -> None:
    import jax
    import jax.numpy as jnp
    import numpy as np
    import ray.train

    rows = list(ray.train.get_dataset_shard("train").iter_rows())
    x = jnp.asarray(np.array([[r["price"], r["promo"], 1.0] for r in rows]))
    y = jnp.asarray(np.array([r["units"] for r in rows]))
    loss = jax.jit(lambda w: jnp.mean((x @ w - y) ** 2))
    rate = float(config["learning_rate"])
    step = jax.jit(lambda w: w - rate * jax.grad(loss)(w))
    w = jnp.zeros(3)
    for _ in range(int(config["num_steps"])):
        w = step(w)
    metrics = {"step": int(config["num_steps"]), "mse": float(loss(w)), "learning_rate": rate}
    if ray.train.get_context().get_world_rank() != 0:
        ray.train.report(metrics)
        return
    with tempfile.TemporaryDirectory() as folder:
        np.save(os.path.join(folder, "weights.npy"), np.asarray(w))
        ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(folder))
'''

LIMITS = """\
from tpuflow.errors import UserInputError


def check(params: dict) -> None:
    if params["framework"] != "jax":
        raise UserInputError("params.framework", params["framework"], "acme_sales fits with jax only")
"""


def write_user_project(dags: Path) -> Path:
    """DAGS/acme_sales_dag.py and DAGS/acme_sales/; returns the DAG file."""
    modules = {"build_features": BUILD_FEATURES, "regress": REGRESS, "limits": LIMITS}
    return write_team_folder(dags, "acme_sales", modules, DAG_FILE)
