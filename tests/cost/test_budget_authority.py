"""The budget is an admin's, not the requester's: what a trigger conf can do to a run's spend, tried as the user
who triggers it. Each conf goes through Airflow's own Param check (what the trigger form and the REST API's
``POST dagRuns`` run) and then through the pipeline's own templates, as the task that reads it renders them:

- ``max_chip_hours`` above the admin's ceiling, or empty, is held at the ceiling (Variable tpuflow_max_chip_hours);
  infinite or NaN is a one-line error naming it;
- ``over_budget`` cannot be looser than the admin allows (Variable tpuflow_over_budget);
- ``idle_timeout`` empty, 0 or above the cap is the admin's cap (Variable tpuflow_max_idle_timeout); infinite or
  NaN is a one-line error naming it; a kept endpoint's GKE pool lives at most the admin's kept lifetime;
- the estimate keeps scaling with the steps asked after a rerun that reused its finished checkpoint.
"""

from __future__ import annotations

import copy
import json
import math
import tempfile
from pathlib import Path
from typing import Any

import pytest
from airflow.sdk.exceptions import AirflowFailException
from cost_support import RunTaskInstance
from support.airflow_context import task_context

from tpuflow.errors import UserInputError

V6E_4X4 = {"generation": "v6e", "chips": 16, "num_slices": 1, "ray_accelerator_type": "TPU-V6E"}
# the previous run held the 4x4 for 45 minutes: 12 chip-hours (no measured steps: its duration stands)
PREVIOUS = {"slices": [{"role": "train", "created_at": 100.0, "seconds": 2700.0}]}


def pipeline(backend: str = "local") -> Any:
    from tpuflow.workloads.addition.pipeline import ADDITION

    from tpuflow.pipeline.dag import tpu_pipeline

    return tpu_pipeline(f"budget_authority_{backend}", workload=ADDITION, backend=backend)


def triggered(dag: Any, conf: dict[str, Any]) -> dict[str, Any]:
    """The run's Params once Airflow accepted the trigger's conf (its own schema check, as at trigger time)."""
    params = copy.deepcopy(dag.params)
    params.update(conf)
    return params.validate()


def rendered(
    dag: Any, task_id: str, conf: dict[str, Any], ti: RunTaskInstance, fields: tuple[str, ...] = ()
) -> tuple[Any, dict[str, Any]]:
    """The pipeline's task with its templates (or only ``fields``) rendered for a run triggered with ``conf``, as
    the worker renders them, and its context."""
    task = dag.get_task(task_id)
    context = {**task_context(ti), "params": triggered(dag, conf), "dag": dag, "task": task}
    env = dag.get_template_env(force_sandboxed=False)
    for field in fields or task.template_fields:
        setattr(task, field, task.render_template(getattr(task, field), context, env))
    return task, context


def guard_run(conf: dict[str, Any], dag: Any = None) -> tuple[Any, dict[str, Any]]:
    ti = RunTaskInstance(task_id="budget_guard")
    ti.others[("check_params", "return_value")] = V6E_4X4
    guard, context = rendered(dag or pipeline(), "budget_guard", conf, ti)
    return with_ledgers(guard, [PREVIOUS]), context


def with_ledgers(guard: Any, ledgers: list[dict[str, Any]]) -> Any:
    """The pipeline's guard reads earlier ledgers from its DAG's output folder (never from XCom): here, a folder
    holding ``ledgers``, one run folder each."""
    assert guard.ledger_dir.endswith(f"/{guard.dag_id}"), guard.ledger_dir
    folder = Path(tempfile.mkdtemp(prefix="ledgers-"))
    for index, ledger in enumerate(ledgers):
        (folder / f"run-{index}").mkdir()
        (folder / f"run-{index}" / "ledger.json").write_text(json.dumps(ledger))
    guard.ledger_dir = str(folder)
    return guard


@pytest.fixture
def admin(monkeypatch: pytest.MonkeyPatch) -> Any:
    """Set an admin's Variables (as AIRFLOW_VAR_<NAME>, as any Variable may be given)."""

    def set_variables(**values: Any) -> None:
        for name, value in values.items():
            monkeypatch.setenv(f"AIRFLOW_VAR_{name.upper()}", str(value))

    return set_variables


@pytest.mark.parametrize("asked", [1e9, None], ids=["above-the-ceiling", "null"])
def test_a_trigger_conf_cannot_raise_or_remove_the_budget(admin: Any, asked: Any) -> None:
    admin(tpuflow_max_chip_hours=8)
    guard, context = guard_run({"max_chip_hours": asked, "train_steps": 1500})
    with pytest.raises(AirflowFailException, match=r"max_chip_hours=8.0: this run would use about 12.000 chip-hours"):
        guard.execute(context)


def test_a_budget_below_the_ceiling_is_the_runs_and_none_is_the_default_ceiling(admin: Any) -> None:
    assert guard_run({"max_chip_hours": 20})[0].execute(guard_run({"max_chip_hours": 20})[1])["max_chip_hours"] == 20
    guard, context = guard_run({"max_chip_hours": None, "over_budget": "ask"})
    assert guard.execute(context)["max_chip_hours"] == 100.0  # unset Variable: the safe default, not "no budget"


@pytest.mark.parametrize("asked", [math.inf, math.nan], ids=["inf", "nan"])
def test_a_non_finite_budget_is_one_line_naming_it(asked: float) -> None:
    guard, context = guard_run({"max_chip_hours": asked})  # Airflow's schema lets both through
    with pytest.raises(UserInputError, match=r"^max_chip_hours=(inf|nan) is invalid: give a number of chip-hours"):
        guard.execute(context)


def test_over_budget_from_the_trigger_cannot_be_looser_than_the_admins(admin: Any) -> None:
    admin(tpuflow_max_chip_hours=8, tpuflow_over_budget="fail")
    guard, context = guard_run({"over_budget": "ask"})
    with pytest.raises(AirflowFailException, match="nothing was provisioned"):
        guard.execute(context)  # not a request for approval: the admin's policy is to fail
    admin(tpuflow_over_budget="ask")
    guard, context = guard_run({"over_budget": "run"})  # looser than the admin's "ask": the run asks
    verdict = guard.execute(context)
    assert verdict["over_budget"] is True and verdict["over_budget_action"] == "ask", verdict
    admin(tpuflow_over_budget="run")  # where an admin allows it, the run goes ahead (the training watch holds it)
    guard, context = guard_run({"over_budget": "run"})
    assert guard.execute(context)["over_budget_action"] == "run"


def test_a_bad_admin_limit_is_one_line_naming_the_variable_never_no_limit(admin: Any) -> None:
    bad = [("tpuflow_max_chip_hours", "inf"), ("tpuflow_max_chip_hours", "-1"), ("tpuflow_over_budget", "yes")]
    for name, value in bad:
        admin(**{"tpuflow_max_chip_hours": 8, "tpuflow_over_budget": "ask", name: value})
        guard, context = guard_run({})
        with pytest.raises(UserInputError, match=rf"^Variable {name}=.* is invalid: an admin sets it") as err:
            guard.execute(context)
        assert err.value.field == f"Variable {name}"


def idle_watch(conf: dict[str, Any]) -> Any:
    ti = RunTaskInstance(task_id="serve_until_idle")
    ti.others[("smoke_test", "return_value")] = {"answer": "ok"}
    return rendered(pipeline(), "serve_until_idle", {"keep_endpoint": True, **conf}, ti)[0]


@pytest.mark.parametrize(
    ("asked", "held"),
    [(1e9, 30.0), (None, 30.0), (0, 30.0), (10, 10)],
    ids=["above-the-cap", "null", "zero", "below"],
)
def test_a_kept_endpoint_always_stops_when_idle_within_the_admins_cap(admin: Any, asked: Any, held: float) -> None:
    admin(tpuflow_max_idle_timeout=30)
    watch = idle_watch({"idle_timeout": asked})
    assert watch.idle_timeout_minutes == held
    from tpuflow.serve.idle_stop import idle_minutes

    assert idle_minutes(watch.idle_timeout_minutes) == held  # what the watch then waits for: never "kept until deleted"


@pytest.mark.parametrize("asked", [math.inf, math.nan], ids=["inf", "nan"])
def test_a_non_finite_idle_timeout_is_one_line_naming_it(asked: float) -> None:
    from tpuflow.pipeline.params import validate_params

    dag = pipeline()
    params = triggered(dag, {"keep_endpoint": True, "idle_timeout": asked})  # Airflow's schema lets both through
    with pytest.raises(UserInputError, match=r"^params.idle_timeout=(inf|nan) is invalid") as err:
        validate_params(params)  # check_params: the run's first task, before anything is provisioned
    assert err.value.field == "params.idle_timeout"
    with pytest.raises(UserInputError, match=r"^params.idle_timeout=(inf|nan) is invalid"):
        idle_watch({"idle_timeout": asked})  # and the watch itself never gets it


def test_a_kept_gke_endpoint_lives_at_most_the_admins_kept_lifetime(admin: Any) -> None:
    """The kept endpoint's serve pool gets GKE's own deadline (maxRunDuration): the admin's kept lifetime, or the
    budget's bound for the serve slice when that is shorter; GKE ends it even when Airflow is down."""
    admin(tpuflow_max_kept_endpoint_hours=2)
    for bound, expected in [(None, 2 * 3600 + 900), (3600 + 900, 3600 + 900), (10**7, 2 * 3600 + 900)]:
        ti = RunTaskInstance(task_id="create_serve_node_pool")
        ti.others[("budget_guard", "return_value")] = {"max_run_seconds": {"serve": bound}}
        conf = {"keep_endpoint": True}
        task, _ = rendered(pipeline("gke"), "create_serve_node_pool", conf, ti, ("max_run_duration",))
        assert task.max_run_duration == expected, (bound, task.max_run_duration)


def test_a_pools_gke_deadline_from_the_default_ceiling_is_never_past_its_expiry() -> None:
    """Every run has a budget now (the ceiling when it gives none): spent on a small slice alone it could last days,
    so a pool's maxRunDuration stays at most its 24 h expiry, what a run without a budget had."""
    for bound, expected in [(100 * 3600 + 900, 24 * 3600), (9900, 9900), (None, 24 * 3600)]:
        ti = RunTaskInstance(task_id="create_node_pool")
        ti.others[("budget_guard", "return_value")] = {"max_run_seconds": {"train": bound}}
        task, _ = rendered(pipeline("gke"), "create_node_pool", {}, ti, ("max_run_duration",))
        assert task.max_run_duration == expected, (bound, task.max_run_duration)


def test_the_estimate_scales_with_the_steps_after_a_rerun_that_reused_its_checkpoint(admin: Any) -> None:
    """The first run trained 1,500 steps at 1 s each on the 4x4 (300 s more of the slice not training); its rerun
    of the same date reused the finished checkpoint and held the slice 150 s, training nothing. A run of 100,000
    steps is estimated from the measured steps, not from the rerun's 150 s (0.67 chip-hours)."""
    admin(tpuflow_max_chip_hours=1000)
    measured = {
        "slices": [
            {"role": "train", "created_at": 100.0, "seconds": 1800.0, "timeline": {"seconds": {"productive": 1500.0}}}
        ],
        "goodput": {"steps": {"productive": 1500, "compile": 1}},
    }
    rerun = {
        "slices": [{"role": "train", "created_at": 9000.0, "seconds": 150.0, "timeline": {"seconds": {"idle": 150}}}],
        "goodput": {"steps": {}},
    }
    ti = RunTaskInstance(task_id="budget_guard")
    ti.others[("check_params", "return_value")] = V6E_4X4
    conf = {"train_steps": 100_000, "max_chip_hours": 1000, "over_budget": "ask"}
    guard, context = rendered(pipeline(), "budget_guard", conf, ti)
    with_ledgers(guard, [rerun, measured])
    verdict = guard.execute(context)
    assert verdict["estimate"] == pytest.approx(16 * (300 + 100_000 * 1.0) / 3600)  # ~445.8 chip-hours, not 0.67
    assert "100000 steps x 1.000 s" in verdict["basis"]
