"""The slice catalog: every generation's shapes, both 2x4 forms, tpu7x logical devices, bad input."""

from __future__ import annotations

import pytest

from tpuflow.tpu import GENERATIONS, SliceSpecError, TpuSlice

# (accelerator as a user may type it, topology, machine type or None) -> expected facts
CASES = [
    # generation, topology, machine, chips, per host, hosts, pod type, multi-host
    ("TPU-V6E", "4x4", None, "v6e", 16, 4, 4, "ct6e-standard-4t", "v6e-16", True),
    ("tpu-v6e-slice", "2x2", None, "v6e", 4, 4, 1, "ct6e-standard-4t", "v6e-4", False),
    ("v6e", "1x1", None, "v6e", 1, 1, 1, "ct6e-standard-1t", "v6e-1", False),
    ("v6e", "2x4", None, "v6e", 8, 8, 1, "ct6e-standard-8t", "v6e-8", False),
    ("v6e", "2x4", "ct6e-standard-4t", "v6e", 8, 4, 2, "ct6e-standard-4t", "v6e-8", True),
    ("TPU-V5LITEPOD", "2x4", None, "v5e", 8, 8, 1, "ct5lp-hightpu-8t", "v5litepod-8", False),
    ("tpu-v5-lite-podslice", "2x4", "ct5lp-hightpu-4t", "v5e", 8, 4, 2, "ct5lp-hightpu-4t", "v5litepod-8", True),
    ("v5e", "4x8", None, "v5e", 32, 4, 8, "ct5lp-hightpu-4t", "v5litepod-32", True),
    ("TPU-V5P", "2x2x1", None, "v5p", 4, 4, 1, "ct5p-hightpu-4t", "v5p-8", False),
    ("v5p", "2x2x2", None, "v5p", 8, 4, 2, "ct5p-hightpu-4t", "v5p-16", True),
    ("TPU-V4", "2x2x4", None, "v4", 16, 4, 4, "ct4p-hightpu-4t", "v4-32", True),
    ("tpu-v4-podslice", "2x2x1", None, "v4", 4, 4, 1, "ct4p-hightpu-4t", "v4-8", False),
    ("tpu7x", "2x2x1", None, "tpu7x", 4, 4, 1, "tpu7x-standard-4t", "v7x-8", False),
    ("TPU-V7X", "2x2x2", None, "tpu7x", 8, 4, 2, "tpu7x-standard-4t", "v7x-16", True),
]


@pytest.mark.parametrize(
    ("accel", "topo", "machine", "gen", "chips", "per_host", "hosts", "mtype", "pod", "multi"), CASES
)
def test_slice_shapes(accel, topo, machine, gen, chips, per_host, hosts, mtype, pod, multi):
    tpu = TpuSlice.from_spec(accel, topo, machine)
    assert (tpu.generation.name, tpu.chips, tpu.chips_per_host, tpu.num_hosts) == (gen, chips, per_host, hosts)
    assert (tpu.machine_type, tpu.ray_pod_type, tpu.multi_host) == (mtype, pod, multi)
    assert tpu.node_selector == {
        "cloud.google.com/gke-tpu-accelerator": GENERATIONS[gen].gke_accelerator,
        "cloud.google.com/gke-tpu-topology": topo,
    }
    assert tpu.tpu_resource_request == {"google.com/tpu": str(per_host)}
    assert tpu.scaling_config()["num_workers"] == hosts
    assert tpu.gke_supported and tpu.ray_supported


def test_tpu7x_reports_logical_devices():
    tpu = TpuSlice.from_spec("tpu7x", "2x2x2")
    assert tpu.logical_devices_per_host == 8
    assert tpu.ray_worker_resources == {"TPU": 8}
    assert tpu.ray_env == {"RAY_TPU_RESOURCE_PER_CHIP": "2"}
    assert tpu.scaling_config()["resources_per_worker"] == {"TPU": 8}
    assert tpu.to_dict()["logical_devices_per_chip"] == 2


def test_num_slices_multiplies_workers_not_hosts_per_slice():
    tpu = TpuSlice.from_spec("TPU-V6E", "4x4", num_slices=2)
    assert tpu.num_hosts == 4 and tpu.total_hosts == 8
    assert tpu.scaling_config()["num_workers"] == 8


def test_shapes_only_one_platform_accepts_are_flagged():
    ray_only = TpuSlice.from_spec("v6e", "2x8")  # Ray's table has it, GKE does not
    assert ray_only.ray_supported and not ray_only.gke_supported
    with pytest.raises(SliceSpecError, match="GKE has no v6e node pool"):
        ray_only.require(gke=True)
    gke_only = TpuSlice.from_spec("v4", "16x16x16")  # GKE goes to 16x16x16, Ray's v4 table stops at 12x12x16
    assert gke_only.gke_supported and not gke_only.ray_supported
    with pytest.raises(SliceSpecError, match="Ray 2.60 does not accept"):
        gke_only.require(ray=True)


@pytest.mark.parametrize(
    ("kwargs", "field", "fix"),
    [
        ({"accelerator": "TPU-V6E", "topology": "16"}, "topology", "not a chip count"),
        ({"accelerator": "TPU-V6E", "topology": "4x5"}, "topology", "4x4"),
        ({"accelerator": "v6e", "topology": "2x2x2"}, "topology", "2D"),
        ({"accelerator": "v5p", "topology": "4x4"}, "topology", "3D"),
        ({"accelerator": "TPU-V5E", "topology": "2x2"}, "accelerator", "TPU-V5LITEPOD"),
        ({"accelerator": "TPU-X9", "topology": "2x2"}, "accelerator", "TPU-V6E"),
        (
            {"accelerator": "v6e", "topology": "4x4", "machine_type": "ct6e-standard-8t"},
            "machine_type",
            "ct6e-standard-4t",
        ),
        (
            {"accelerator": "v6e", "topology": "2x2", "machine_type": "ct5lp-hightpu-4t"},
            "machine_type",
            "ct6e-standard",
        ),
        ({"accelerator": "v6e", "topology": "4x4", "num_slices": 0}, "num_slices", "1 or more"),
        ({"accelerator": "v6e", "topology": "4x4", "num_slices": -2}, "num_slices", "1 or more"),
        ({"accelerator": "v6e", "topology": "4x4", "num_slices": "two"}, "num_slices", "1 or more"),
    ],
)
def test_bad_input_names_field_and_fix(kwargs, field, fix):
    with pytest.raises(SliceSpecError) as err:
        TpuSlice.from_spec(**kwargs)
    assert err.value.field == field
    assert fix in str(err.value)
    assert field in str(err.value)


def test_catalog_topology_tables_match_ray():
    from ray._private.accelerators.tpu import VALID_TPU_TOPOLOGY

    for gen in GENERATIONS.values():
        assert gen.ray_topologies == VALID_TPU_TOPOLOGY[gen.ray_version], gen.name


@pytest.mark.parametrize(("accel", "topo", "machine"), [(c[0], c[1], c[2]) for c in CASES])
def test_scaling_config_passes_ray_validation(accel, topo, machine, monkeypatch):
    from ray.train import ScalingConfig
    from ray.util.tpu import get_tpu_worker_resources

    tpu = TpuSlice.from_spec(accel, topo, machine)
    for key, value in tpu.ray_env.items():
        monkeypatch.setenv(key, value)
    cfg = ScalingConfig(**tpu.scaling_config())
    assert cfg.num_workers == tpu.total_hosts
    # Ray's own arithmetic agrees: one worker per host, each holding that host's TPU resource.
    workers, resources = get_tpu_worker_resources(
        topo,
        tpu.generation.ray_accelerator_type,
        resources_per_worker=cfg.resources_per_worker,
        chips_per_vm=tpu.chips_per_host,
    )
    assert workers == tpu.num_hosts
    assert resources["TPU"] == tpu.logical_devices_per_host
