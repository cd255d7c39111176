"""Bad Params fail at trigger time (schema) or in the first task, naming the Param."""

from __future__ import annotations

import math

import pytest
from airflow.sdk import Param

from tpuflow.errors import UserInputError
from tpuflow.pipeline.params import pipeline_params, validate_params


def defaults() -> dict:
    return {k: p.value for k, p in pipeline_params().items()}


def test_defaults_are_valid_and_describe_the_slice():
    assert validate_params(defaults())["num_hosts"] == 4


@pytest.mark.parametrize(
    ("override", "field"),
    [
        ({"framework": "tensorflow"}, "params.framework"),
        ({"accuracy_threshold": 1.5}, "params.accuracy_threshold"),
        ({"accuracy_threshold": -0.1}, "params.accuracy_threshold"),
        ({"topology": "2x2x2"}, "params.topology"),  # v6e is 2D
        ({"topology": "16"}, "params.topology"),  # a chip count
        ({"accelerator": "TPU-V5P", "topology": "4x4"}, "params.topology"),
        ({"machine_type": "ct6e-standard-8t"}, "params.machine_type"),
    ],
)
def test_cross_field_validation_names_the_param(override, field):
    with pytest.raises(UserInputError) as err:
        validate_params({**defaults(), **override})
    assert err.value.field == field


# not the topology: which shapes exist depends on the accelerator, so the first task judges it (in one line)
@pytest.mark.parametrize(("name", "bad"), [("framework", "mxnet"), ("accuracy_threshold", 2), ("serve_topology", "16")])
def test_form_schema_rejects_bad_values_at_trigger_time(name, bad):
    param: Param = pipeline_params()[name]
    with pytest.raises(Exception, match="valid|enum|greater|less|maximum"):
        Param(bad, **param.schema).resolve()


@pytest.mark.parametrize(
    ("topology", "machine_type", "serve_topology", "expected"),
    [
        # (serve topology, chips per host, multi-host, num_slices: hosts that hold one such replica)
        ("4x4", None, "", ("2x2", 4, False, 4)),
        ("4x4", None, "1x1", ("1x1", 1, False, 16)),
        ("4x4", None, "4x4", ("4x4", 4, True, 1)),
        ("2x4", None, "", ("2x4", 8, False, 1)),
        ("2x4", "ct6e-standard-4t", "2x4", ("2x4", 4, True, 1)),
    ],
)
def test_local_serve_slice_is_the_training_slice_or_one_of_its_hosts(topology, machine_type, serve_topology, expected):
    params = {**defaults(), "topology": topology, "machine_type": machine_type, "serve_topology": serve_topology}
    serve = validate_params(params)["serve"]
    assert (serve["topology"], serve["chips_per_host"], serve["multi_host"], serve["num_slices"]) == expected


@pytest.mark.parametrize(
    ("serve_topology", "fix"),
    [
        ("2x4", "simulates only the training slice"),  # a multi-host shape the local cluster does not have
        ("2x2x2", "2D"),  # a shape the generation lacks
        ("8x8", "serve from all of it"),
    ],
)
def test_local_serve_topology_the_cluster_lacks_is_refused(serve_topology, fix):
    with pytest.raises(UserInputError) as err:
        validate_params({**defaults(), "serve_topology": serve_topology})
    assert err.value.field == "params.serve_topology" and fix in str(err.value)


def test_both_pipelines_share_the_serve_topology_param():
    from tpuflow.pipeline.gke import gke_pipeline_params

    assert (
        pipeline_params()["serve_topology"].value is None
        and "4x4" in pipeline_params()["serve_topology"].schema["enum"]
    )
    assert gke_pipeline_params()["serve_topology"].schema == pipeline_params()["serve_topology"].schema


def test_resume_is_a_trigger_form_choice_the_train_task_takes():
    from tpuflow.rayjob.workload_operators import RESUME_POLICIES

    param = pipeline_params()["resume"]
    assert param.value == "auto" and param.schema["enum"] == list(RESUME_POLICIES) == ["auto", "never"]
    assert param.schema["type"] == "string" and param.schema["title"] and "never" in param.description


def _ray_accepts(generation: str, topology: str) -> bool:
    """What every pipeline's cross-field check asks of a slice shape (validate_params, the GKE pipeline's)."""
    from tpuflow.tpu import TpuSlice

    try:
        TpuSlice.from_spec(generation, topology).require(ray=True)
    except UserInputError:
        return False
    return True


def test_form_topologies_are_exactly_the_shapes_the_slice_catalog_accepts():
    from tpuflow.tpu import GENERATIONS

    offered = pipeline_params()["topology"].schema["examples"]  # the form's suggestions: check_params judges
    catalog = {t for g in GENERATIONS.values() for t in g.known_topologies if _ray_accepts(g.name, t)}
    assert len(offered) == len(set(offered))
    assert not [t for t in offered if t not in catalog], "offered, but no generation accepts it"
    assert not sorted(catalog - set(offered)), "a generation accepts it, but the form does not offer it"
    assert pipeline_params()["serve_topology"].schema["enum"] == [None, "", *offered]


def test_form_topologies_list_2d_then_3d_shapes_each_by_chip_count():
    offered = pipeline_params()["topology"].schema["examples"]
    shapes = [tuple(int(d) for d in t.split("x")) for t in offered]
    keys = [(len(s), math.prod(s)) for s in shapes]
    assert keys == sorted(keys)
    assert offered[:3] == ["1x1", "2x2", "2x4"] and offered[offered.index("16x16") + 1] == "2x2x1"


@pytest.mark.parametrize(("accelerator", "topology"), [("TPU-V6E", "8x8"), ("TPU-V7X", "4x4x4")])
def test_form_offers_large_v6e_and_tpu7x_slices(accelerator, topology):
    for name in ("topology", "serve_topology"):
        param: Param = pipeline_params()[name]
        assert Param(topology, **param.schema).resolve() == topology
    assert validate_params({**defaults(), "accelerator": accelerator, "topology": topology})["topology"] == topology
