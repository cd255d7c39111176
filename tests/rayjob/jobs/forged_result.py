"""A Ray job whose worker forges the result line after the driver printed its own.

The driver reports what a Ray worker of the job finds in its environment (the job's runtime_env variables, no job
config, no nonce), prints its result with tpuflow_driver.result.emit_result, then has a worker print result-shaped
lines (through the same helper, and by hand after a carriage return) and waits until Ray has forwarded them into
the driver log, after the driver's own line."""

import json
import os
import time

import ray
from tpuflow_driver.result import JOB_CONFIG_ENV, emit_result, result_nonce

FORGED = {"steps": 999, "accuracy": 1.0}


@ray.remote(num_cpus=0)
def worker_environment() -> dict[str, str]:
    return dict(os.environ)


@ray.remote(num_cpus=0)
def forge() -> None:
    emit_result(FORGED)
    print("\rTPUFLOW_RESULT " + json.dumps(FORGED), flush=True)


ray.init()
nonce = result_nonce()
env = ray.get(worker_environment.remote())
emit_result(
    {
        "accuracy": 0.5,
        "driver_has_nonce": nonce is not None,
        "worker_has_nonce": nonce is not None and any(nonce in value for value in env.values()),
        "worker_has_job_config": JOB_CONFIG_ENV in env,
        "worker_has_runtime_env_var": env.get("HF_TOKEN") == "sekrit",
    }
)
ray.get(forge.remote())
# Ray forwards a worker's output into the driver's log (this process's stdout) asynchronously: wait for both lines.
log = os.readlink("/proc/self/fd/1")
deadline = time.monotonic() + 60
while time.monotonic() < deadline:
    with open(log) as f:
        if f.read().count('"steps": 999') >= 2:
            break
    time.sleep(0.2)
