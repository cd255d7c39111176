"""Ray job driver: one actor per TPU chip of each slice (seed 004's placement), each reporting its host's identity."""

import json
import os
import socket
import sys

import ray
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
from ray.util.tpu import slice_placement_group

kwargs = json.loads(sys.argv[1])
ray.init()


@ray.remote(num_cpus=0)
def identity() -> dict:
    hostnames = os.environ["TPU_WORKER_HOSTNAMES"].split(",")
    return {
        "node_ip": ray.util.get_node_ip_address(),
        "slice": os.environ["TPU_NAME"],
        "worker": int(os.environ["TPU_WORKER_ID"]),
        "hostnames": hostnames,
        "resolved": [socket.gethostbyname(h) for h in hostnames],
        "torch_topology": os.environ["TORCH_TPU_TOPOLOGY"],
        "slicebuilder": os.environ["TORCH_TPU_SLICEBUILDER_ADDRESSES"].split(","),
    }


spg = slice_placement_group(**kwargs, resources_per_bundle={"TPU": 1})
pg = spg.placement_group
ray.get(pg.ready(), timeout=180)
refs = [
    identity.options(scheduling_strategy=PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=i)).remote()
    for i in range(pg.bundle_count)
]
print("TPUFLOW_RESULT " + json.dumps({"bundles": ray.get(refs, timeout=180)}))
