"""A simulated host carries what GKE's TPU webhook injects, and the slice says what Ray cannot tell from a shape."""

from __future__ import annotations

import pytest

from tpuflow.local.cluster import default_host_cpus, host_ip
from tpuflow.tpu import TpuSlice
from tpuflow_rehearsal.standins.kuberay_controller.webhook import worker_env

WEBHOOK_KEYS = (
    "TPU_WORKER_ID",
    "TPU_NAME",
    "TPU_WORKER_HOSTNAMES",
    "TORCH_TPU_TOPOLOGY",
    "TORCH_TPU_SLICEBUILDER_ADDRESSES",
)


@pytest.mark.parametrize(
    ("accelerator", "topology", "machine_type", "gke_accelerator"),
    [
        ("TPU-V6E", "4x4", None, "tpu-v6e-slice"),
        ("TPU-V6E", "2x4", "ct6e-standard-4t", "tpu-v6e-slice"),
        ("tpu7x", "2x2x2", None, "tpu7x"),
    ],
)
def test_the_webhook_variables_match_the_kuberay_standins_webhook(accelerator, topology, machine_type, gke_accelerator):
    tpu = TpuSlice.from_spec(accelerator, topology, machine_type)
    group = {
        "groupName": "workers",
        "numOfHosts": tpu.num_hosts,
        "replicas": 1,
        "template": {
            "spec": {
                "nodeSelector": tpu.node_selector,
                "containers": [{"resources": {"limits": tpu.tpu_resource_request}}],
            }
        },
    }
    for worker in range(tpu.num_hosts):
        theirs = worker_env("c", group, 0, worker)
        hostnames = theirs["TPU_WORKER_HOSTNAMES"].split(",")
        ours = tpu.simulated_host_env("workers-0", worker, hostnames)
        assert {k: ours[k] for k in WEBHOOK_KEYS} == {k: theirs[k] for k in WEBHOOK_KEYS}


def test_hosts_get_their_own_loopback_address_and_a_cpu_per_tpu_device():
    addresses = [host_ip(s, w, 4) for s in range(80) for w in range(4)]
    assert len(set(addresses)) == len(addresses)
    assert all(a.startswith("127.") and a != "127.0.0.1" and not a.endswith((".0", ".255")) for a in addresses)
    assert default_host_cpus(TpuSlice.from_spec("TPU-V6E", "4x4")) == 4
    assert default_host_cpus(TpuSlice.from_spec("tpu7x", "2x2x2")) == 8  # two TPU devices per chip
    assert default_host_cpus(None) == 1


def test_a_two_host_2x4_names_what_ray_cannot_tell_from_its_shape():
    (caveat,) = TpuSlice.from_spec("TPU-V6E", "2x4", "ct6e-standard-4t").ray_caveats()
    assert "chips_per_vm=4" in caveat and "8-chip hosts" in caveat
    assert TpuSlice.from_spec("TPU-V6E", "2x4").ray_caveats() == []  # the single-host default: Ray reads it right
    assert TpuSlice.from_spec("TPU-V6E", "4x4").ray_caveats() == []
