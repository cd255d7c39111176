"""Who may approve a run over its budget: approvers an admin names (Variable tpuflow_budget_approvers), never the
run's own triggering user. Tried as that user would: answering the approval through the REST API's hitlDetails,
which Airflow's own API server route judges (its assigned users check), on a run of a real DAG (dag.test)."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from airflow.sdk.exceptions import AirflowFailException
from cost_support import RunTaskInstance
from support.airflow_context import task_context

from tpuflow.errors import UserInputError

DAG_ID = "tpuflow_budget_approval_rest"
# dag.test() records its runs as triggered by "dag_test": the requester here. The guard estimates 16 chips x 45 min =
# 12 chip-hours from the previous run's ledger in LEDGERS, over its 8; provision bills a slice, behind BudgetGate.
DAG_FILE = """
from airflow.providers.standard.operators.python import PythonOperator
from airflow.sdk import DAG

from tpuflow.cost.approval import BudgetGate, ChipBudgetApprovalOperator
from tpuflow.cost.operators import TPUCheckChipBudgetOperator

with DAG("tpuflow_budget_approval_rest", schedule=None) as dag:
    guard = TPUCheckChipBudgetOperator(
        task_id="budget_guard", max_chip_hours=8, over_budget="ask", ledger_dir=LEDGERS,
        slices=[{"role": "train", "tpu": {"generation": "v6e", "chips": 16, "num_slices": 1}}],
    )
    approve = ChipBudgetApprovalOperator(task_id="approve_budget", record_dir=RECORDS)
    provision = PythonOperator(task_id="provision", python_callable=lambda: "provisioned",
                               pre_execute=BudgetGate(record_dir=RECORDS))
    guard >> approve >> provision
"""
PREVIOUS_LEDGER = {"slices": [{"role": "train", "created_at": 1.0, "seconds": 2700.0}]}
OVER = {"over_budget": True, "over_budget_action": "ask", "estimate": 12.0, "max_chip_hours": 8.0, "basis": "x"}


@pytest.fixture
def dag_file(dags_folder: Path, tmp_path: Path) -> Iterator[Path]:
    ledgers, records = tmp_path / "outputs", tmp_path / "outputs" / "today"
    (ledgers / "yesterday").mkdir(parents=True)
    (ledgers / "yesterday" / "ledger.json").write_text(json.dumps(PREVIOUS_LEDGER))
    path = dags_folder / f"{DAG_ID}.py"
    path.write_text(f"LEDGERS = {str(ledgers)!r}\nRECORDS = {str(records)!r}\n" + DAG_FILE)
    yield path
    path.unlink()


@pytest.fixture
def hitl_api() -> Any:
    """Airflow's own hitlDetails route, as its API server serves it, with Airflow's SimpleAuthManager."""
    from airflow.api_fastapi.app import init_auth_manager
    from airflow.api_fastapi.core_api.routes.public.hitl import task_instances_hitl_router
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    app = FastAPI()
    init_auth_manager(app)
    app.include_router(task_instances_hitl_router, prefix="/api/v2")
    return TestClient(app)


def answer_as(api: Any, user: str, run_id: str, option: str = "Approve") -> Any:
    from airflow.api_fastapi.app import get_auth_manager
    from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser

    token = get_auth_manager().generate_jwt(SimpleAuthManagerUser(username=user, role="admin"))
    return api.patch(
        f"/api/v2/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances/approve_budget/-1/hitlDetails",
        json={"chosen_options": [option], "params_input": {}},
        headers={"Authorization": f"Bearer {token}"},
    )


def waiting_run(timeout: float = 120) -> str:
    """The run whose approve_budget task waits for an answer (Airflow's awaiting input state)."""
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session

    deadline = time.time() + timeout
    while time.time() < deadline:
        with create_session() as session:
            waiting = session.query(TaskInstance).filter_by(
                dag_id=DAG_ID, task_id="approve_budget", state="awaiting_input"
            )
            if (ti := waiting.first()) is not None:  # an earlier test's run of the DAG no longer waits
                return ti.run_id
        time.sleep(0.3)
    raise AssertionError("approve_budget never waited for an answer")


@pytest.mark.timeout(300)
def test_the_requester_cannot_approve_their_own_run_through_the_rest_api(
    dag_file: Path, hitl_api: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from support.gke_pipeline import load_dag_file, task_states

    # the admin names the requester among the approvers too: they are still not one for their own run
    monkeypatch.setenv("AIRFLOW_VAR_TPUFLOW_BUDGET_APPROVERS", "dag_test,alice")
    answers: list[Any] = []

    def answer() -> None:
        run_id = waiting_run()
        answers.append(answer_as(hitl_api, "dag_test", run_id))  # the triggering user approves their own run
        answers.append(answer_as(hitl_api, "alice", run_id))  # an approver does

    answering = threading.Thread(target=answer, daemon=True)
    answering.start()
    run = load_dag_file(dag_file, DAG_ID, poll=0.5).test()  # in this thread: the task runner needs the main one
    answering.join(30)
    mallory, alice = answers
    assert mallory.status_code == 403 and "not a respondent" in mallory.text, mallory.text
    assert alice.status_code == 200 and alice.json()["responded_by"]["name"] == "alice", alice.text
    assert run.state == "success" and task_states(run)["provision"] == "success", task_states(run)


@pytest.mark.timeout(300)
def test_marking_the_approval_done_through_the_rest_api_provisions_nothing(
    dag_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The requester, who may edit the DAG's task instances, marks approve_budget success while it waits (the
    taskInstances PATCH of Airflow's REST API, through its own route): the task that would bill a slice fails
    with one line; before, it ran."""
    from airflow.api_fastapi.app import get_auth_manager, init_auth_manager
    from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser
    from airflow.api_fastapi.common.dagbag import create_dag_bag
    from airflow.api_fastapi.core_api.routes.public.task_instances import task_instances_router
    from fastapi import FastAPI
    from fastapi.testclient import TestClient
    from support.gke_pipeline import load_dag_file, task_states

    monkeypatch.setenv("AIRFLOW_VAR_TPUFLOW_BUDGET_APPROVERS", "alice")
    app = FastAPI()
    init_auth_manager(app)
    app.state.dag_bag = create_dag_bag()
    app.include_router(task_instances_router, prefix="/api/v2")
    api = TestClient(app)
    marked: list[Any] = []

    def mark_done() -> None:
        run_id = waiting_run()
        token = get_auth_manager().generate_jwt(SimpleAuthManagerUser(username="dag_test", role="user"))
        marked.append(
            api.patch(
                f"/api/v2/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances/approve_budget",
                json={"new_state": "success"},
                headers={"Authorization": f"Bearer {token}"},
            )
        )

    marking = threading.Thread(target=mark_done, daemon=True)
    marking.start()
    run = load_dag_file(dag_file, DAG_ID, poll=0.5).test()
    marking.join(30)
    (response,) = marked
    assert response.status_code == 200, response.text  # the attack is real: Airflow lets them
    states = task_states(run)
    assert states["approve_budget"] == "success" and states["provision"] == "failed", states


def test_the_gate_lets_a_slice_start_only_with_an_approvers_answer_for_this_run(tmp_path: Path) -> None:
    """BudgetGate against the records the approval writes: none, another run's, the requester's own, a smaller
    estimate's fail; an approver's answer for this run's estimate passes; within the budget nothing is needed."""
    from airflow.providers.standard.operators.python import PythonOperator
    from airflow.sdk import DAG

    from tpuflow.cost.approval import BudgetGate, approval_uri
    from tpuflow.cost.operators import TPUCheckChipBudgetOperator

    ledgers = tmp_path / "outputs"
    (ledgers / "yesterday").mkdir(parents=True)
    (ledgers / "yesterday" / "ledger.json").write_text(json.dumps(PREVIOUS_LEDGER))
    records = str(tmp_path / "records")
    gate = BudgetGate(record_dir=records)
    slices = [{"role": "train", "tpu": {"generation": "v6e", "chips": 16, "num_slices": 1}}]
    with DAG("gate", schedule=None):
        TPUCheckChipBudgetOperator(
            task_id="budget_guard", max_chip_hours=8, over_budget="ask", ledger_dir=str(ledgers), slices=slices
        )
        provision = PythonOperator(task_id="provision", python_callable=lambda: None)
    ti = RunTaskInstance(task_id="provision", dag_id="gate", run_id="r1")
    context = {**task_context(ti), "task": provision, "dag_run": SimpleNamespace(triggering_user_name="mallory")}
    uri = Path(approval_uri(records, context))

    def record(**fields: Any) -> None:
        uri.parent.mkdir(parents=True, exist_ok=True)
        base = {"dag_id": "gate", "run_id": "r1", "approved_by": {"id": "alice", "name": "alice"}, "estimate": 12.0}
        uri.write_text(json.dumps({**base, **fields}))

    with pytest.raises(AirflowFailException, match=r"^provision: .*12.000 chip-hours.*no approver's answer"):
        gate(context)
    for bad in ({"run_id": "r0"}, {"approved_by": {"id": "mallory", "name": "mallory"}}, {"estimate": 9.0}):
        record(**bad)
        with pytest.raises(AirflowFailException, match="no approver's answer"):
            gate(context)
    record()
    gate(context)  # alice approved this run's 12 chip-hours
    uri.unlink()
    (ledgers / "yesterday" / "ledger.json").write_text(json.dumps({"slices": [{"role": "train", "created_at": 1.0,
                                                                                "seconds": 600.0}]}))  # fmt: skip
    gate(context)  # 4 chip-hours: within the budget, nothing to approve


def test_the_guard_reads_earlier_ledgers_from_storage_not_from_a_rewritable_xcom(tmp_path: Path) -> None:
    """A user who may write XComs rewrites the previous run's chip_ledger XCom to a tiny run; the guard with a
    ledger_dir estimates from the ledger files the workers wrote."""
    from tpuflow.cost.operators import TPUCheckChipBudgetOperator

    ledgers = tmp_path / "outputs"
    (ledgers / "yesterday").mkdir(parents=True)
    (ledgers / "yesterday" / "ledger.json").write_text(json.dumps(PREVIOUS_LEDGER))
    (ledgers / "broken").mkdir()
    (ledgers / "broken" / "ledger.json").write_text("not json")  # skipped with a warning
    rewritten = {"slices": [{"role": "train", "created_at": 9.0, "seconds": 1.0}]}
    ti = RunTaskInstance(task_id="budget_guard", prior={"chip_ledger": rewritten})
    slices = [{"role": "train", "tpu": {"generation": "v6e", "chips": 16, "num_slices": 1}}]
    guard = TPUCheckChipBudgetOperator(
        task_id="budget_guard", max_chip_hours=8, over_budget="ask", ledger_dir=str(ledgers), slices=slices
    )
    assert guard.execute(task_context(ti))["estimate"] == pytest.approx(12.0)
    # only the newest run folders are read (every slice task decides again): an old, longer run is no basis
    (ledgers / "2000-01-01").mkdir()
    (ledgers / "2000-01-01" / "ledger.json").write_text(
        json.dumps({"slices": [{"role": "train", "created_at": 99.0, "seconds": 9000.0}]})
    )
    for day in range(1, 31):  # a month of daily runs after it, the last billed as the first test's
        (ledgers / f"2026-11-{day:02d}").mkdir()
        last = PREVIOUS_LEDGER if day == 30 else {"slices": []}
        (ledgers / f"2026-11-{day:02d}" / "ledger.json").write_text(json.dumps(last))
    assert guard.execute(task_context(ti))["estimate"] == pytest.approx(12.0)


def approval_context(requester: str | None) -> dict[str, Any]:
    ti = RunTaskInstance(task_id="approve_budget", prior={"chip_ledger": PREVIOUS_LEDGER})
    ti.id = uuid.uuid4()  # type: ignore[attr-defined]  # the task instance's id the HITL request is keyed by
    return {**task_context(ti), "dag_run": SimpleNamespace(triggering_user_name=requester)}


def approval_operator() -> Any:
    """The approval of a DAG whose guard finds the run over its budget (12 of 8 chip-hours), asking."""
    from airflow.sdk import DAG

    from tpuflow.cost.approval import ChipBudgetApprovalOperator
    from tpuflow.cost.operators import TPUCheckChipBudgetOperator

    with DAG(f"approval_{uuid.uuid4().hex[:6]}", schedule=None):
        TPUCheckChipBudgetOperator(
            task_id="budget_guard",
            max_chip_hours=8,
            over_budget="ask",
            slices=[{"role": "train", "tpu": {"generation": "v6e", "chips": 16, "num_slices": 1}}],
        )
        return ChipBudgetApprovalOperator(task_id="approve_budget")


def asked(monkeypatch: pytest.MonkeyPatch, requester: str | None) -> list[dict[str, str]]:
    """The assigned users of the HITL request the approval writes for a run triggered by ``requester``."""
    from airflow.providers.standard.operators import hitl
    from airflow.sdk.exceptions import TaskAwaitingInput

    written: list[Any] = []
    monkeypatch.setattr(hitl, "upsert_hitl_detail", lambda **request: written.append(request))
    with pytest.raises(TaskAwaitingInput):  # parked until an answer comes
        approval_operator().execute(approval_context(requester))
    (request,) = written
    return request["assigned_users"]


def test_a_role_of_approvers_is_its_users_less_the_requester(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS", "mallory:admin,alice:admin,olga:op,victor:viewer")
    monkeypatch.delenv("AIRFLOW_VAR_TPUFLOW_BUDGET_APPROVERS", raising=False)  # the default: role:admin
    assert [u["name"] for u in asked(monkeypatch, "mallory")] == ["alice"]
    monkeypatch.setenv("AIRFLOW_VAR_TPUFLOW_BUDGET_APPROVERS", "role:op, bob")  # op and above, and bob
    assert [u["name"] for u in asked(monkeypatch, "mallory")] == ["alice", "olga", "bob"]
    # an auth manager whose ids are not the names: {"id", "name"} pairs, the requester known by name
    monkeypatch.setenv(
        "AIRFLOW_VAR_TPUFLOW_BUDGET_APPROVERS", '[{"id": "7", "name": "mallory"}, {"id": "9", "name": "ann"}]'
    )
    assert asked(monkeypatch, "mallory") == [{"id": "9", "name": "ann"}]  # fmt: skip


def test_with_only_the_requester_to_approve_the_approval_fails_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:

    monkeypatch.setenv("AIRFLOW_VAR_TPUFLOW_BUDGET_APPROVERS", "mallory")
    with pytest.raises(AirflowFailException, match=r"^Nobody may approve this over-budget run: .*'mallory'") as err:
        approval_operator().execute(approval_context("mallory"))
    assert "\n" not in str(err.value) and "tpuflow_budget_approvers" in str(err.value)
    monkeypatch.setenv("AIRFLOW_VAR_TPUFLOW_BUDGET_APPROVERS", "role:nobody")
    with pytest.raises(
        UserInputError, match=r"^Variable tpuflow_budget_approvers='role:nobody' is invalid: name a role of"
    ):
        approval_operator().execute(approval_context("mallory"))
