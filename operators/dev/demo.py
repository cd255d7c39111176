"""`tpuflow demo`: run the local pipeline end to end through Airflow (`airflow dags test`)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from datetime import date
from pathlib import Path

from tpuflow.paths import output_root

REPO = Path(__file__).resolve().parents[2]
DAG_ID = "tpu_llm_pipeline_local"


def demo_env(home: Path, outputs: Path) -> dict[str, str]:
    """A throw-away Airflow home so the demo never touches a user's own Airflow."""
    env = dict(os.environ)
    env.update(
        {
            "AIRFLOW_HOME": str(home),
            "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags"),
            "AIRFLOW__CORE__PLUGINS_FOLDER": str(REPO / "plugins"),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home}/airflow.db",
            "TPUFLOW_OUTPUT_ROOT": str(outputs),
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
        }
    )
    return env


def _run(args: argparse.Namespace) -> int:
    work = Path(args.work_dir).resolve()
    home, outputs = work / "airflow", work / "outputs"
    home.mkdir(parents=True, exist_ok=True)
    env = demo_env(home, outputs)
    airflow = str(Path(sys.executable).with_name("airflow"))
    subprocess.run([airflow, "db", "migrate"], env=env, check=True, stdout=subprocess.DEVNULL)
    conf = {"framework": args.framework, "accelerator": args.accelerator, "topology": args.topology,
            "machine_type": args.machine_type or "", "train_steps": args.train_steps,
            "keep_endpoint": args.keep_endpoint, "accuracy_threshold": args.accuracy_threshold,
            "num_train": args.num_train}
    run_date = args.date or date.today().isoformat()
    print(f"tpuflow demo: running {DAG_ID} for {run_date} with {json.dumps(conf)}", flush=True)
    started = time.time()
    proc = subprocess.run([airflow, "dags", "test", DAG_ID, run_date, "-c", json.dumps(conf)], env=env)
    elapsed = time.time() - started
    report_path = Path(output_root(env)) / DAG_ID / run_date / "report.json"
    if proc.returncode != 0 or not report_path.exists():
        print(f"\ntpuflow demo: the pipeline FAILED after {elapsed:.0f}s (see the task logs above)", file=sys.stderr)
        return 1
    report = json.loads(report_path.read_text())
    print(f"\n=== tpuflow demo: pipeline succeeded in {elapsed:.0f}s ===")
    print(f"outputs:            {report['output_dir']}")
    print(f"held-out accuracy:  {report['accuracy']:.3f} on {report['heldout_examples']} problems")
    print(f"sample completion:  {report['sample_prompt']!r} -> {report['sample_completion']!r}")
    if args.keep_endpoint:
        print(f"endpoint (kept):    {report['endpoint']}  (stop it with: tpuflow local down)")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("demo", help="run the local pipeline end to end (embedded Ray, simulated TPU slice)")
    parser.add_argument("--framework", default="jax", choices=("jax", "torch"))
    parser.add_argument("--accelerator", default="TPU-V6E")
    parser.add_argument("--topology", default="4x4")
    parser.add_argument("--machine-type", default="")
    parser.add_argument("--train-steps", type=int, default=1500)
    parser.add_argument("--num-train", type=int, default=20000, help="training examples")
    parser.add_argument("--accuracy-threshold", type=float, default=0.9, help="quality gate on held-out accuracy")
    parser.add_argument("--keep-endpoint", action="store_true", help="leave the cluster and Serve endpoint running")
    parser.add_argument("--date", default=None, help="logical date YYYY-MM-DD (default today)")
    parser.add_argument("--work-dir", default=str(REPO / ".tpuflow"), help="Airflow home and outputs (default .tpuflow/)")
    parser.set_defaults(func=_run)
