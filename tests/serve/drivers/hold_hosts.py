"""Ray job driver: hold TPU_PER_HOST on each named host ("SLICE/WORKER_ID" ...) until the job is stopped,
as another workload holding part of each slice would."""

import sys
import time

import ray

ray.init()


@ray.remote(num_cpus=0)
class Holder:
    def ready(self) -> str:
        return ray.get_runtime_context().get_node_id()


holders = []
tpu_per_host = float(sys.argv[1])
for host in sys.argv[2:]:
    slice_name, worker_id = host.split("/")
    holders.append(
        Holder.options(
            resources={"TPU": tpu_per_host},
            label_selector={"ray.io/tpu-slice-name": slice_name, "ray.io/tpu-worker-id": worker_id},
        ).remote()
    )
print("HELD", ray.get([h.ready.remote() for h in holders], timeout=300), flush=True)
while True:
    time.sleep(60)
