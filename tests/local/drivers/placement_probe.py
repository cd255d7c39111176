"""Ray job driver: reserve whole slices with slice_placement_group, run one task per host, report where."""

import json
import sys

import ray
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
from ray.util.tpu import slice_placement_group

kwargs = json.loads(sys.argv[1])
ray.init()


@ray.remote(num_cpus=0)
def where() -> dict:
    import os

    ctx = ray.get_runtime_context()
    return {"node": ctx.get_node_id(), "slice": os.environ.get("TPU_NAME"), "worker": os.environ.get("TPU_WORKER_ID")}


reservations = []
for _ in range(int(sys.argv[2])):
    spg = slice_placement_group(**kwargs)
    ray.get(spg.placement_group.ready(), timeout=120)
    reservations.append(spg)

hosts = []
for spg in reservations:
    refs = [
        where.options(
            resources={"TPU": spg.devices_per_host},
            scheduling_strategy=PlacementGroupSchedulingStrategy(
                placement_group=spg.placement_group, placement_group_bundle_index=i
            ),
        ).remote()
        for i in range(spg.num_bundles)
    ]
    hosts.append(ray.get(refs, timeout=120))
print("TPUFLOW_RESULT " + json.dumps({"reservations": hosts, "num_hosts": [s.num_hosts for s in reservations]}))
