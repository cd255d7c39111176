"""Who may approve a run over its budget: approvers an admin names (Variable tpuflow_budget_approvers), never the
run's own triggering user. Tried as that user would: answering the approval through the REST API's hitlDetails,
which Airflow's own API server route judges (its assigned users check), on a run of a real DAG (dag.test)."""

from __future__ import annotations

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
# dag.test() records its runs as triggered by "dag_test": the requester here
DAG_FILE = """
from airflow.providers.standard.operators.python import PythonOperator
from airflow.sdk import DAG

from tpuflow.cost.approval import ChipBudgetApprovalOperator

VERDICT = {"over_budget": True, "over_budget_action": "ask", "estimate": 12.0, "max_chip_hours": 8.0, "basis": "x"}

with DAG("tpuflow_budget_approval_rest", schedule=None) as dag:
    guard = PythonOperator(task_id="budget_guard", python_callable=lambda: VERDICT)
    approve = ChipBudgetApprovalOperator(task_id="approve_budget")
    provision = PythonOperator(task_id="provision", python_callable=lambda: "provisioned")
    guard >> approve >> provision
"""
OVER = {"over_budget": True, "over_budget_action": "ask", "estimate": 12.0, "max_chip_hours": 8.0, "basis": "x"}


@pytest.fixture
def dag_file(dags_folder: Path) -> Iterator[Path]:
    path = dags_folder / f"{DAG_ID}.py"
    path.write_text(DAG_FILE)
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
            ti = session.query(TaskInstance).filter_by(dag_id=DAG_ID, task_id="approve_budget").one_or_none()
            if ti is not None and ti.state == "awaiting_input":
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


def approval_context(requester: str | None, verdict: dict[str, Any] = OVER) -> dict[str, Any]:
    ti = RunTaskInstance(task_id="approve_budget", others={("budget_guard", "return_value"): verdict})
    ti.id = uuid.uuid4()  # type: ignore[attr-defined]  # the task instance's id the HITL request is keyed by
    return {**task_context(ti), "dag_run": SimpleNamespace(triggering_user_name=requester)}


def asked(monkeypatch: pytest.MonkeyPatch, requester: str | None) -> list[dict[str, str]]:
    """The assigned users of the HITL request the approval writes for a run triggered by ``requester``."""
    from airflow.providers.standard.operators import hitl
    from airflow.sdk.exceptions import TaskAwaitingInput

    from tpuflow.cost.approval import ChipBudgetApprovalOperator

    written: list[Any] = []
    monkeypatch.setattr(hitl, "upsert_hitl_detail", lambda **request: written.append(request))
    with pytest.raises(TaskAwaitingInput):  # parked until an answer comes
        ChipBudgetApprovalOperator(task_id="approve_budget").execute(approval_context(requester))
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
    from tpuflow.cost.approval import ChipBudgetApprovalOperator

    monkeypatch.setenv("AIRFLOW_VAR_TPUFLOW_BUDGET_APPROVERS", "mallory")
    with pytest.raises(AirflowFailException, match=r"^Nobody may approve this over-budget run: .*'mallory'") as err:
        ChipBudgetApprovalOperator(task_id="approve_budget").execute(approval_context("mallory"))
    assert "\n" not in str(err.value) and "tpuflow_budget_approvers" in str(err.value)
    monkeypatch.setenv("AIRFLOW_VAR_TPUFLOW_BUDGET_APPROVERS", "role:nobody")
    with pytest.raises(
        UserInputError, match=r"^Variable tpuflow_budget_approvers='role:nobody' is invalid: name a role of"
    ):
        ChipBudgetApprovalOperator(task_id="approve_budget").execute(approval_context("mallory"))
