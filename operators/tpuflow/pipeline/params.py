"""The pipeline's Params (the trigger form in the Airflow UI) and their cross-field check.

Each Param carries a JSON schema (``param_specs``: plain data, no Airflow import), so the UI form rejects
a bad single value at trigger time and `tpuflow demo` its flags before anything starts;
the accelerator/topology pair is checked by `validate_params` in the first task, before any
cluster or node pool exists. ``topology`` has no schema rule of its own: only `validate_params` can tell a
shape of the chosen generation, and say so in one line (Airflow's own refusal lists the whole schema).
"""

from __future__ import annotations

import copy
import math
from datetime import datetime
from functools import partial
from typing import TYPE_CHECKING, Any

from tpuflow.cost.budget import MAX_CHIP_HOURS_PARAM, check_max_chip_hours
from tpuflow.errors import UserInputError
from tpuflow.limits import OVER_BUDGET_CHOICES, check_idle_timeout
from tpuflow.rayjob.workload_operators import check_multislice
from tpuflow.tpu.generations import GENERATIONS

if TYPE_CHECKING:
    from airflow.sdk import Param

    from tpuflow.pipeline.workload import Workload


def _catalog_topologies() -> list[str]:
    """Every shape some generation's slice can take in a pipeline (every pipeline requires Ray to accept
    it: validate_params, the GKE pipeline's check), 2D before 3D, each by chip count. Read from the
    generation table, not tpuflow.tpu.slice: DAG parsing must not load the slice arithmetic."""
    shapes = set().union(*(g.ray_topologies for g in GENERATIONS.values()))
    dims = {t: tuple(int(d) for d in t.split("x")) for t in shapes}
    return sorted(shapes, key=lambda t: (len(dims[t]), math.prod(dims[t]), dims[t]))


ACCELERATORS = [g.ray_accelerator_type for g in GENERATIONS.values()]
TOPOLOGIES = _catalog_topologies()
FRAMEWORKS = ["jax", "torch"]
START_DATE = datetime(2026, 11, 1)  # the pipelines' default start_date: Airflow runs no task of an earlier run
RESUME_POLICIES = ["auto", "never"]  # RayTrainOperator(resume=...)
# Shapes a serve slice may take (which ones exist depends on the generation); "": one host.
SERVE_TOPOLOGIES = ["", *TOPOLOGIES]


class ParamSpec:
    """One Param's default and JSON schema keywords (type, enum, bounds, title, description)."""

    def __init__(self, default: Any, **schema: Any) -> None:
        self.value = default
        self.schema = schema  # what Param(default, **schema).schema holds

    def param(self) -> Param:
        from airflow.sdk import Param

        return _sharing_schema_in_copies(Param(self.value, **self.schema))


def _sharing_schema_in_copies(param: Param) -> Param:
    """``param``, whose deep copies copy its value and share its schema (and copy themselves alike).

    Airflow deep-copies the DAG's Params once per ``__init__`` of each operator's class chain (``apply_defaults``
    merges them into each level's kwargs): 93 copies for the GKE DAG's 27 tasks, a fifth of its parse, most of it
    the schemas' enums (over 100 topologies). A schema is never changed once its Param exists (Airflow's own
    ``Param.__copy__`` shares it). ``copy.deepcopy`` looks ``__deepcopy__`` up on the object, so the Param stays
    of Airflow's own class: the DAG serializes, and the scheduler rebuilds it, as any Param."""
    param.__dict__["__deepcopy__"] = partial(_copy_sharing_schema, param)  # an instance attribute, as Param has none
    return param


def _copy_sharing_schema(param: Param, memo: dict[int, Any]) -> Param:
    clone = object.__new__(type(param))
    clone.__dict__.update(param.__dict__)
    clone.value = copy.deepcopy(param.value, memo)
    return _sharing_schema_in_copies(clone)


def serve_topology_param() -> Param:
    return _serve_topology_spec().param()


def pipeline_params(
    *, accelerator: str = "TPU-V6E", topology: str = "4x4", workload: Workload | None = None
) -> dict[str, Param]:
    """The pipeline's Params; with ``workload``, only those of the steps it has (step_params_lacking)."""
    specs = param_specs(accelerator=accelerator, topology=topology, workload=workload)
    return {name: spec.param() for name, spec in specs.items()}


# The Params only one step reads, by the step a workload may lack (tpuflow.pipeline.workload.Workload): the trigger
# form of a workload without the step has none of them, and no task of its DAG reads them.
STEP_PARAMS = {
    "prep": ("num_train", "num_eval"),  # prep's --num-train / --num-heldout
    "evaluation": ("accuracy_threshold",),  # the quality gate of evaluate, or of evaluate_in_training
    "serving": ("serve_topology", "keep_endpoint", "idle_timeout"),  # serve_app's slice, endpoint and idle stop
}


def step_params_lacking(workload: Workload | None) -> set[str]:
    """The Params of the steps ``workload`` does not have (STEP_PARAMS); none for None (every step)."""
    if workload is None:
        return set()
    has = {
        "prep": bool(workload.prep),
        "evaluation": bool(workload.evaluate_job or workload.evaluate_in_training),
        "serving": workload.serve_app is not None,
    }
    return {name for step, names in STEP_PARAMS.items() if not has[step] for name in names}


def _serve_topology_spec() -> ParamSpec:
    # None, not "": the trigger form treats an empty-string default as a missing required value.
    return ParamSpec(
        None,
        type=["null", "string"],
        enum=[None, *SERVE_TOPOLOGIES],
        title="Serve slice topology (optional)",
        description="The slice the endpoint's replicas serve from, of the training accelerator. Empty: one host "
        "(locally a host of the training slice; on GKE the smallest single-host slice, 1x1 on v5e/v6e, 2x2x1 on "
        "v4/v5p/tpu7x). A multi-host shape (e.g. 4x4) serves one model from every host of one slice: locally "
        "it must be the training slice's shape.",
    )


MAX_RUN_DURATION_PARAM = "max_run_duration_seconds"


def max_run_duration_param() -> Param:
    """The GKE pipeline's maxRunDurationSeconds for queued capacity (tpuflow.capacity.provisioning_request)."""
    return ParamSpec(
        None,
        type=["null", "integer"],
        minimum=1,
        maximum=7 * 24 * 3600,
        title="Queued capacity: max run duration, seconds (optional)",
        description="With tpuflow_tpu_capacity=queued: the ProvisioningRequest's maxRunDurationSeconds, after "
        "which GKE takes the nodes back (1 to 604800). Empty: GKE's default, seven days.",
    ).param()


ZONES_PARAM = "zones"
ZONE_FAILOVER_PARAM = "zone_failover"


def zones_param() -> Param:
    """The GKE pipeline's zones to try, in order (GKECreateTPUNodePoolOperator's node_zone)."""
    return ParamSpec(
        "",
        type="string",
        title="Zones to try (optional)",
        description="Zones of the cluster's region, comma-separated, tried in order when one has no room or no "
        "quota for the slice, e.g. us-east5-a,us-east5-b,us-east5-c. Empty: the tpuflow_gke_node_zone Variable.",
    ).param()


def zone_failover_param() -> Param:
    return ParamSpec(
        "zone-first",
        type="string",
        enum=["zone-first", "capacity-first"],
        title="Zone failover order",
        description="With several zones: zone-first tries every zone with the first capacity before the next "
        "capacity (fallback_capacity); capacity-first tries every capacity in a zone before the next zone.",
    ).param()


def param_specs(
    *, accelerator: str = "TPU-V6E", topology: str = "4x4", workload: Workload | None = None
) -> dict[str, ParamSpec]:
    """Each Param's default and JSON schema, as plain data: `tpuflow demo` checks its flags with them
    without loading Airflow. With ``workload``: only those of the steps it has (step_params_lacking)."""
    lacking = step_params_lacking(workload)
    return {name: spec for name, spec in _all_param_specs(accelerator, topology).items() if name not in lacking}


def _all_param_specs(accelerator: str, topology: str) -> dict[str, ParamSpec]:
    return {
        "accelerator": ParamSpec(
            accelerator,
            type="string",
            enum=ACCELERATORS,
            title="TPU accelerator",
            description="Ray accelerator type of the training slice (TPU-V5LITEPOD is v5e).",
        ),
        "topology": ParamSpec(
            topology,
            # Suggestions, not an enum: which shapes exist depends on the accelerator, so check_params judges the
            # value (one line with the hint and shapes of that generation); an enum here would make Airflow refuse
            # a bad one with every shape of every generation and its whole schema, before check_params runs.
            examples=TOPOLOGIES,
            title="Slice topology",
            description="The slice's shape, not a chip count: 4x4 = 16 chips = 4 hosts on v6e. Checked against the "
            "accelerator before anything starts.",
        ),
        "machine_type": ParamSpec(
            None,
            type=["null", "string"],
            title="Machine type (optional)",
            description="Only to pick the two-VM form of v5e/v6e 2x4: ct6e-standard-4t.",
        ),
        "num_slices": ParamSpec(
            1,
            type="integer",
            minimum=1,
            maximum=64,
            title="Slices",
            description="Identical slices trained on together (data parallel across them over DCN), 1 to 64; "
            "each takes one slice lease.",
        ),
        "preflight": ParamSpec(
            True,
            type="boolean",
            title="Slice preflight",
            description="Before training, check every host of the slice(s) with one all-reduce (seconds).",
        ),
        "framework": ParamSpec(
            "jax",
            type="string",
            enum=FRAMEWORKS,
            title="Framework",
            description="JaxTrainer (ray.train.v2.jax) or TorchTrainer.",
        ),
        "train_steps": ParamSpec(1500, type="integer", minimum=1, maximum=100_000, title="Training steps"),
        "checkpoint_every": ParamSpec(
            500,
            type="integer",
            minimum=1,
            maximum=100_000,
            title="Checkpoint every (steps)",
            description="Steps between the training's checkpoints on the run's storage (its train loop's "
            "checkpoint_every). A preempted or failed run resumes from the latest: fewer steps between them lose "
            "less work, and spend more time saving.",
        ),
        "resume": ParamSpec(
            "auto",
            type="string",
            enum=RESUME_POLICIES,
            title="Resume training",
            description="auto: continue this date's training from its latest checkpoint (a rerun of a finished "
            "run trains 0 steps and reuses that checkpoint; the train log and the report say so). never: train "
            "from scratch in a new run beside it; earlier checkpoints are kept.",
        ),
        "accuracy_threshold": ParamSpec(
            0.9,
            type="number",
            minimum=0,
            maximum=1,
            title="Accuracy threshold",
            description="Quality gate: the model is not deployed below this held-out accuracy.",
        ),
        "keep_endpoint": ParamSpec(
            False,
            type="boolean",
            title="Keep the endpoint running",
            description="Leave the cluster and Serve endpoint up after the run, marked kept so the orphan reaper "
            "leaves them (local: `tpuflow local down` removes them; GKE: see docs/cost-and-goodput.md, Orphan reaper).",
        ),
        "idle_timeout": ParamSpec(
            None,
            type=["null", "number"],
            minimum=0,
            title="Stop a kept endpoint when idle (minutes, optional)",
            description="With keep_endpoint: the endpoint and its slice are torn down once Ray Serve has answered "
            "no request for this many minutes (read from Serve's own metrics; the run waits for it in the "
            "triggerer, and its ledger records the reason). At most the admin's ceiling (Variable "
            "tpuflow_max_idle_timeout, default 60); empty or 0: that ceiling.",
        ),
        "num_train": ParamSpec(20000, type="integer", minimum=100, maximum=1_000_000, title="Training examples"),
        "num_eval": ParamSpec(
            200,
            type="integer",
            minimum=10,
            maximum=5000,  # of the 10,000 two-digit problems: the rest stay for training
            title="Held-out examples",
            description="Size of the held-out set the evaluation step scores (on every host of the slice).",
        ),
        MAX_CHIP_HOURS_PARAM: ParamSpec(
            None,
            type=["null", "number"],
            exclusiveMinimum=0,
            title="Chip-hour budget (optional)",
            description="Refuse to provision when the estimate (the previous run's durations) exceeds it; "
            "training is stopped at its last checkpoint when the ledger reaches it. At most the admin's ceiling "
            "(Variable tpuflow_max_chip_hours, default 100); empty: that ceiling.",
        ),
        "over_budget": ParamSpec(
            "fail",
            type="string",
            enum=list(OVER_BUDGET_CHOICES),
            title="Over the budget",
            description="What happens when the estimate exceeds max_chip_hours: fail (the run ends before anything is "
            "provisioned), ask (the approve_budget task waits up to 4 hours for an approver named by the admin, "
            "never the run's own triggering user, to approve or reject it in the UI's Required Actions) or run "
            "(it goes ahead, training still stopped at the budget). At most as loose as the admin allows (Variable "
            "tpuflow_over_budget, default ask).",
        ),
        "serve_topology": _serve_topology_spec(),
    }


_FIX_CHOICES = 16  # a rejected value's fix names at most this many of its Param's choices


def schema_fix(schema: dict[str, Any]) -> str:
    """What a Param's JSON schema accepts, in words (the fix of a rejected value)."""
    if "enum" in schema:
        names = list(dict.fromkeys("(empty)" if v in (None, "") else str(v) for v in schema["enum"]))
        if len(names) > _FIX_CHOICES:  # the topologies: one line, not all of them
            return f"use one of {', '.join(names[:_FIX_CHOICES])}, ... ({len(names)} choices in all)"
        return "use one of " + ", ".join(names)
    types = schema.get("type")
    kinds = set(types) if isinstance(types, list) else {types}
    noun = {"integer": "a whole number", "number": "a number", "boolean": "true or false"}.get(
        next((k for k in ("integer", "number", "boolean") if k in kinds), ""), "a string"
    )
    bounds = [f"> {schema['exclusiveMinimum']:g}"] if "exclusiveMinimum" in schema else []
    bounds += [f">= {schema['minimum']:g}"] if "minimum" in schema else []
    bounds += [f"<= {schema['maximum']:g}"] if "maximum" in schema else []
    return (
        f"give {noun}"
        + (f" {' and '.join(bounds)}" if bounds else "")
        + (", or leave it empty" if "null" in kinds else "")
    )


def check_param(name: str, value: Any, params: dict[str, ParamSpec] | None = None) -> Any:
    """One Param's value against its JSON schema (what the trigger form and ``dags trigger`` enforce),
    finite where it is a number; UserInputError ``params.NAME`` otherwise. Returns the value."""
    from jsonschema import ValidationError, validate

    schema = (params or param_specs())[name].schema
    try:
        validate(value, schema)
    except ValidationError:
        raise UserInputError(f"params.{name}", value, schema_fix(schema)) from None
    if isinstance(value, float) and not math.isfinite(value):
        raise UserInputError(f"params.{name}", value, schema_fix(schema) + " (a finite number)")
    return value


def check_conf(conf: dict[str, Any], params: dict[str, ParamSpec] | None = None) -> dict[str, Any]:
    """A run's conf as ``airflow dags test/trigger -c`` hands it over: each key a Param (of ``params``, default
    the pipeline's), each value valid for its schema. Returns every Param's value (the defaults where conf has
    none); the cross-field check (validate_params, or the GKE pipeline's) is the caller's next step."""
    params = params or param_specs()
    for name, value in conf.items():
        if name not in params:
            raise UserInputError("params", name, f"the pipeline's Params are {', '.join(params)}")
        check_param(name, value, params)
    return {name: param.value for name, param in params.items()} | conf


def validate_params(params: dict[str, Any], *, local_serve: bool = True) -> dict[str, Any]:
    """Cross-field validation; returns the training slice's description, with the local serve slice
    under ``serve`` (``local_serve``; the GKE pipeline derives its own)."""
    from tpuflow.tpu import TpuSlice

    framework = params.get("framework")
    if framework not in FRAMEWORKS:
        raise UserInputError("params.framework", framework, f"use one of {', '.join(FRAMEWORKS)}")
    threshold = params.get("accuracy_threshold")
    # absent: the workload has no evaluation, so no quality gate (STEP_PARAMS)
    if "accuracy_threshold" in params and (not isinstance(threshold, int | float) or not 0 <= float(threshold) <= 1):
        raise UserInputError("params.accuracy_threshold", threshold, "give a number between 0 and 1")
    check_max_chip_hours(params.get(MAX_CHIP_HOURS_PARAM))
    check_idle_timeout(params.get("idle_timeout"))  # a kept endpoint's idle stop: finite, or none (the admin's)
    try:
        tpu = TpuSlice.from_spec(
            params.get("accelerator", ""),
            params.get("topology", ""),
            params.get("machine_type") or None,
            params.get("num_slices", 1),
        )
        tpu.require(ray=True)
        check_multislice(tpu, framework, simulated=local_serve, field="num_slices")
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
