"""The pipeline's Params (the trigger form in the Airflow UI) and their cross-field check.

Each Param carries a JSON schema, so the UI form rejects a bad single value at trigger time;
the accelerator/topology pair is checked by `validate_params` in the first task, before any
cluster or node pool exists.
"""

from __future__ import annotations

from typing import Any

from airflow.sdk import Param
from tpuflow.cost.budget import MAX_CHIP_HOURS_PARAM, check_max_chip_hours
from tpuflow.errors import UserInputError
from tpuflow.tpu.generations import GENERATIONS

ACCELERATORS = [g.ray_accelerator_type for g in GENERATIONS.values()]
TOPOLOGIES = ["1x1", "2x2", "2x4", "4x4", "4x8", "2x2x1", "2x2x2", "2x2x4", "2x4x4"]
FRAMEWORKS = ["jax", "torch"]
# Shapes a serve slice may take (which ones exist depends on the generation); "": one host.
SERVE_TOPOLOGIES = ["", "1x1", "2x2", "2x4", "4x4", "4x8", "2x2x1", "2x2x2", "2x2x4", "2x4x4"]


def serve_topology_param() -> Param:
    # None, not "": the trigger form treats an empty-string default as a missing required value.
    return Param(
        None,
        type=["null", "string"],
        enum=[None, *SERVE_TOPOLOGIES],
        title="Serve slice topology (optional)",
        description="The slice the endpoint's replicas serve from, of the training accelerator. Empty: one host "
        "(locally a host of the training slice; on GKE the smallest single-host slice, 1x1 on v5e/v6e, 2x2x1 on "
        "v4/v5p/tpu7x). A multi-host shape (e.g. 4x4) serves one model from every host of one slice: locally "
        "it must be the training slice's shape.",
    )


def pipeline_params(*, accelerator: str = "TPU-V6E", topology: str = "4x4") -> dict[str, Param]:
    return {
        "accelerator": Param(
            accelerator,
            type="string",
            enum=ACCELERATORS,
            title="TPU accelerator",
            description="Ray accelerator type of the training slice (TPU-V5LITEPOD is v5e).",
        ),
        "topology": Param(
            topology,
            type="string",
            enum=TOPOLOGIES,
            title="Slice topology",
            description="The slice's shape, not a chip count: 4x4 = 16 chips = 4 hosts on v6e.",
        ),
        "machine_type": Param(
            None,
            type=["null", "string"],
            title="Machine type (optional)",
            description="Only to pick the two-VM form of v5e/v6e 2x4: ct6e-standard-4t.",
        ),
        "num_slices": Param(
            1,
            type="integer",
            minimum=1,
            maximum=64,
            title="Slices",
            description="Identical slices trained on together (data parallel across them over DCN); "
            "each takes one slice lease.",
        ),
        "preflight": Param(
            True,
            type="boolean",
            title="Slice preflight",
            description="Before training, check every host of the slice(s) with one all-reduce (seconds).",
        ),
        "framework": Param(
            "jax",
            type="string",
            enum=FRAMEWORKS,
            title="Framework",
            description="JaxTrainer (ray.train.v2.jax) or TorchTrainer.",
        ),
        "train_steps": Param(1500, type="integer", minimum=1, maximum=100_000, title="Training steps"),
        "accuracy_threshold": Param(
            0.9,
            type="number",
            minimum=0,
            maximum=1,
            title="Accuracy threshold",
            description="Quality gate: the model is not deployed below this held-out accuracy.",
        ),
        "keep_endpoint": Param(
            False,
            type="boolean",
            title="Keep the endpoint running",
            description="Leave the cluster and Serve endpoint up after the run "
            "(local: `tpuflow local down` removes them).",
        ),
        "num_train": Param(20000, type="integer", minimum=100, maximum=1_000_000, title="Training examples"),
        "num_eval": Param(
            200,
            type="integer",
            minimum=10,
            maximum=5000,  # of the 10,000 two-digit problems: the rest stay for training
            title="Held-out examples",
            description="Size of the held-out set the evaluation step scores (on every host of the slice).",
        ),
        MAX_CHIP_HOURS_PARAM: Param(
            None,
            type=["null", "number"],
            exclusiveMinimum=0,
            title="Chip-hour budget (optional)",
            description="Refuse to provision when the estimate (the previous run's durations) exceeds it; "
            "training is stopped at its last checkpoint when the ledger reaches it. Empty: no budget.",
        ),
        "serve_topology": serve_topology_param(),
    }


def validate_params(params: dict[str, Any], *, local_serve: bool = True) -> dict[str, Any]:
    """Cross-field validation; returns the training slice's description, with the local serve slice
    under ``serve`` (``local_serve``; the GKE pipeline derives its own)."""
    from tpuflow.rayjob.workload_operators import check_multislice
    from tpuflow.tpu import TpuSlice

    framework = params.get("framework")
    if framework not in FRAMEWORKS:
        raise UserInputError("params.framework", framework, f"use one of {', '.join(FRAMEWORKS)}")
    threshold = params.get("accuracy_threshold")
    if not isinstance(threshold, int | float) or not 0 <= float(threshold) <= 1:
        raise UserInputError("params.accuracy_threshold", threshold, "give a number between 0 and 1")
    check_max_chip_hours(params.get(MAX_CHIP_HOURS_PARAM))
    try:
        tpu = TpuSlice.from_spec(
            params.get("accelerator", ""),
            params.get("topology", ""),
            params.get("machine_type") or None,
            params.get("num_slices", 1),
        )
        tpu.require(ray=True)
        check_multislice(tpu, framework, simulated=local_serve)
    except UserInputError as err:
        raise UserInputError(f"params.{err.field}", err.value, err.fix) from None
    if not local_serve:
        return tpu.to_dict()
    return {**tpu.to_dict(), "serve": local_serve_slice(tpu, params.get("serve_topology")).to_dict()}


def local_serve_slice(train: Any, topology: str | None) -> Any:
    """The local pipeline's serve slice: the training slice itself, or one of its hosts.

    The local cluster simulates only the training slice (one machine's memory holds one set of
    simulated hosts), and training has finished before the deploy: the replicas serve from the same
    simulated hosts. ``num_slices`` of a single-host serve slice counts the hosts that can hold one.
    """
    from tpuflow.tpu import TpuSlice

    gen = train.generation
    field = "params.serve_topology"
    if not topology:
        shapes = sorted(
            (t for t in gen.ray_topologies if TpuSlice.from_spec(gen.name, t).chips == train.chips_per_host),
            key=lambda t: TpuSlice.from_spec(gen.name, t).num_hosts,
        )
        if not shapes:
            raise UserInputError(field, topology, f"give a {gen.name} topology of one {train.machine_type} host")
        one = TpuSlice.from_spec(gen.name, shapes[0], train.machine_type)
        return TpuSlice(gen, one.topology, one.chips_per_host, train.total_hosts)
    try:
        serve = TpuSlice.from_spec(gen.name, topology).require(ray=True)
    except UserInputError as err:
        raise UserInputError(field, topology, err.fix) from None
    if serve.chips <= train.chips_per_host:  # a shape that fits on one host of the training slice
        return TpuSlice(gen, serve.topology, serve.chips, train.total_hosts * (train.chips_per_host // serve.chips))
    if serve.topology != train.topology:
        raise UserInputError(
            field,
            topology,
            f"the local cluster simulates only the training slice ({gen.name} {train.topology}, "
            f"{train.num_hosts} x {train.machine_type}); serve from all of it (serve_topology {train.topology}) "
            "or from one host (empty)",
        )
    return train
