"""An approver's decision on a run over its chip-hour budget (``over_budget="ask"``), through Airflow's own
human-in-the-loop: the task waits in Airflow's *awaiting input* state, the UI's Required Actions show the
estimate and its basis, and an approver approves or rejects there or through the REST API's ``hitlDetails``.

Who may approve is an admin's choice, never the requester's: the Variable ``tpuflow_budget_approvers`` names them
(users, and ``role:NAME`` for every user of that role or a higher one where the auth manager lists its users:
Airflow's SimpleAuthManager), less the run's own triggering user. They become the HITL request's
``assigned_users``, which Airflow's API server checks itself when an answer arrives (``is_authorized_hitl_task``:
anyone else gets 403; an auth manager that lets everyone answer, ``simple_auth_manager_all_admins``, is warned of in
the task's log). Nobody left to ask fails the task in one line.

Neither the approval nor the slices trust the run's XComs or task states for this: the approval computes the guard's
decision again from the guard's own arguments (TPUCheckChipBudgetOperator.decide), an approver's answer is recorded in
the run's output folder (storage only the workers write), and BudgetGate, run by every task that bills a slice before
it starts, computes the decision a third time and finds that record. A user who may mark task instances can mark
``approve_budget`` success through the REST API; the slice tasks then fail with one line instead of provisioning.

Cheap to import (the DAG files import it): the standard provider's HITL module, the budget guard and tpuflow's storage
helpers (their clients load when used).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any, cast

from airflow.providers.standard.operators.hitl import ApprovalOperator

from tpuflow.cost.operators import TPUCheckChipBudgetOperator
from tpuflow.errors import UserInputError
from tpuflow.limits import OVER_BUDGET_CHOICES, variable
from tpuflow.naming import owner_run_digest
from tpuflow.storage import read_text, write_text

if TYPE_CHECKING:
    from airflow.sdk import Context
    from airflow.sdk.execution_time.hitl import HITLUser

__all__ = ["APPROVERS_VARIABLE", "OVER_BUDGET_CHOICES", "BudgetGate", "ChipBudgetApprovalOperator", "budget_approvers"]

APPROVERS_VARIABLE = "tpuflow_budget_approvers"
DEFAULT_APPROVERS = "role:admin"
_FIELD = f"Variable {APPROVERS_VARIABLE}"
_APPROVERS_FIX = (
    'an admin names the approvers: user names, comma-separated or a JSON list ("role:admin" for every admin the '
    'auth manager lists), or {"id", "name"} pairs where the auth manager\'s ids are not the names'
)


def parse_approvers(value: Any) -> list[str | HITLUser]:
    """The Variable's entries: names ("alice", "role:admin") or {"id", "name"} pairs, from text (comma-separated
    or JSON) or a list."""
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("["):
            try:
                value = json.loads(text)
            except ValueError:
                raise UserInputError(_FIELD, value, _APPROVERS_FIX) from None
        else:
            value = [part.strip() for part in text.split(",") if part.strip()]
    if not isinstance(value, list | tuple):
        raise UserInputError(_FIELD, value, _APPROVERS_FIX)
    entries: list[str | HITLUser] = []
    for entry in value:
        if isinstance(entry, str) and entry.strip():
            entries.append(entry.strip())
        elif isinstance(entry, Mapping) and all(isinstance(entry.get(k), str) and entry[k] for k in ("id", "name")):
            entries.append({"id": entry["id"], "name": entry["name"]})
        else:
            raise UserInputError(_FIELD, entry, _APPROVERS_FIX)
    return entries


def role_members(role: str) -> list[str]:
    """The users of ``role`` or a higher one, where the auth manager lists them (Airflow's SimpleAuthManager, from
    ``[core] simple_auth_manager_users``); any other auth manager: a one-line error asking for the users' names."""
    from airflow.configuration import conf

    manager = conf.get("core", "auth_manager", fallback="") or ""
    if not manager.endswith(".SimpleAuthManager"):
        raise UserInputError(
            _FIELD,
            f"role:{role}",
            f"this Airflow's auth manager ({manager or 'unknown'}) does not list a role's users to a task: "
            "name the approvers' users instead",
        )
    from airflow.api_fastapi.auth.managers.simple.simple_auth_manager import SimpleAuthManager, SimpleAuthManagerRole

    orders = {r.name.lower(): r.order for r in SimpleAuthManagerRole}
    if role.lower() not in orders:
        raise UserInputError(_FIELD, f"role:{role}", f"name a role of {', '.join(orders)}")
    return [u.username for u in SimpleAuthManager.get_users() if orders.get(str(u.role).lower(), -1) >= orders[role]]


def resolve_approvers(entries: Iterable[str | HITLUser]) -> list[HITLUser]:
    """Airflow's HITL users ({"id", "name"}) for the entries, each once, in order."""
    users: dict[str, HITLUser] = {}
    for entry in entries:
        if isinstance(entry, dict):
            users.setdefault(entry["id"], entry.copy())
        elif entry.lower().startswith("role:"):
            for name in role_members(entry.split(":", 1)[1].strip().lower()):
                users.setdefault(name, {"id": name, "name": name})
        else:
            users.setdefault(entry, {"id": entry, "name": entry})
    return list(users.values())


def budget_approvers(requester: str | None, also: Iterable[HITLUser] = ()) -> tuple[list[HITLUser], str]:
    """(who may approve a run triggered by ``requester``: the Variable's approvers and ``also``, less the requester;
    how they were named, for a message)."""
    raw = variable(APPROVERS_VARIABLE, DEFAULT_APPROVERS)
    users = resolve_approvers([*parse_approvers(raw), *(cast("HITLUser", dict(u)) for u in also)])
    named = f"Variable {APPROVERS_VARIABLE}={raw!r}: {', '.join(u['name'] for u in users) or 'nobody'}"
    return [u for u in users if requester is None or requester not in (u["id"], u["name"])], named


class ChipBudgetApprovalOperator(ApprovalOperator):
    """Ask an approver when the budget guard found the run over its budget and was told to ask.

    Within the budget (or with ``over_budget`` "fail" or "run", where the guard itself failed the run or let it
    go) it ends at once without asking. Over it, it is Airflow's ApprovalOperator assigned to the approvers
    (Variable ``tpuflow_budget_approvers``, default ``role:admin``) less the run's triggering user: *Approve* lets
    the run provision; *Reject* skips everything downstream but the teardowns (nothing was provisioned yet); no
    answer within ``response_timeout`` fails the task, and the run with it, before anything billable. With no
    approver left to ask, the task fails at once, naming the Variable.

    :param guard_task_id: the TPUCheckChipBudgetOperator's task id: its decision (whether to ask, and why) is computed
        again here from that task's own arguments, never read from its XCom.
    :param record_dir: templated; where an approval is recorded (``<record_dir>/approvals/<run>.json``), for
        BudgetGate: the run's output folder. None: not recorded (and a BudgetGate asking for it fails).
    :param gcp_conn_id: the connection for a gs:// ``record_dir``.

    Every other argument is ApprovalOperator's (``subject`` has a default; ``body`` is written from the guard's
    estimate when the task runs; ``assigned_users``, if given, approve beside the Variable's).
    """

    ui_color = "#fff3cd"
    template_fields: Sequence[str] = (*ApprovalOperator.template_fields, "guard_task_id", "record_dir")

    def __init__(
        self,
        *,
        guard_task_id: str = "budget_guard",
        subject: str = "Run {{ run_id }} of {{ dag.dag_id }} is over its chip-hour budget: approve it?",
        response_timeout: timedelta | None = timedelta(hours=4),
        record_dir: str | None = None,
        gcp_conn_id: str = "google_cloud_default",
        **kwargs: Any,
    ) -> None:
        super().__init__(subject=subject, response_timeout=response_timeout, **kwargs)
        self.guard_task_id = guard_task_id
        self.record_dir = record_dir
        self.gcp_conn_id = gcp_conn_id

    def execute(self, context: Context) -> Any:
        from airflow.sdk.exceptions import AirflowFailException

        guard = guard_decision(self, self.guard_task_id, context)
        if not (guard["over_budget"] and guard["over_budget_action"] == "ask"):
            self.log.info("Nothing to approve: the run is within its chip-hour budget (or goes on without asking)")
            return {"asked": False}
        requester = getattr(context.get("dag_run"), "triggering_user_name", None)
        approvers, named = budget_approvers(requester, self.assigned_users or ())
        if not approvers:
            raise AirflowFailException(
                f"Nobody may approve this over-budget run: {named}, less its triggering user {requester!r} (never "
                f"an approver of their own run), leaves nobody; an admin names approvers in the Variable "
                f"{APPROVERS_VARIABLE}"
            )
        self.assigned_users = approvers
        self.body = (
            f"The run would use about **{guard['estimate']:.3f} chip-hours**, over its budget "
            f"`max_chip_hours={guard['max_chip_hours']}`.\n\nEstimated from {guard['basis']}.\n\n"
            "*Approve* provisions the slices and runs it (training is still stopped at the budget); *Reject* ends "
            "the run before anything is provisioned."
        )
        self.log.info(
            "Over budget: waiting for %s to approve or reject (not %s, who triggered the run; %s)",
            " or ".join(u["name"] for u in approvers),
            requester,
            guard["basis"],
        )
        self._warn_if_anyone_may_answer()
        return super().execute(context)

    def execute_complete(self, context: Context, event: dict[str, Any]) -> Any:
        """Airflow's own completion (a rejection skips downstream); an approval is recorded for BudgetGate with the
        decision as it stands now and who answered."""
        answer = super().execute_complete(context, event)
        if self.APPROVE in (answer.get("chosen_options") or []) and self.record_dir:
            decision = guard_decision(self, self.guard_task_id, context)
            record = {
                **_run_of(context),
                "approved_by": answer.get("responded_by_user"),
                "estimate": decision["estimate"],
                "max_chip_hours": decision["max_chip_hours"],
            }
            write_text(approval_uri(self.record_dir, context), json.dumps(record), self.gcp_conn_id)
        return answer

    def _warn_if_anyone_may_answer(self) -> None:
        from airflow.configuration import conf

        if conf.getboolean("core", "simple_auth_manager_all_admins", fallback=False):
            self.log.warning(
                "[core] simple_auth_manager_all_admins lets every user answer this request, the assigned approvers "
                "aside: Airflow does not tell users apart in that mode"
            )


def guard_decision(task: Any, guard_task_id: str, context: Context) -> dict[str, Any]:
    """The budget decision of ``guard_task_id`` for this run, computed again from that task as the DAG file
    defines it, rendered for ``context`` (its XCom is not read: a user who may write XComs could change it)."""
    defined = task.dag.task_dict.get(guard_task_id) if task.has_dag() else None
    if not isinstance(defined, TPUCheckChipBudgetOperator):
        raise UserInputError("guard_task_id", guard_task_id, "name the DAG's TPUCheckChipBudgetOperator task")
    guard = defined.prepare_for_execution()  # a copy: rendering it leaves the DAG's task as written
    guard.render_template_fields(context)
    return guard.decide(context)


def _run_of(context: Context) -> dict[str, str]:
    ti = context["ti"]
    return {"dag_id": ti.dag_id, "run_id": ti.run_id}


def approval_uri(record_dir: str, context: Context) -> str:
    """Where the run's approval is recorded: one file per run, named for its digest."""
    ti = context["ti"]
    return f"{record_dir.rstrip('/')}/approvals/{owner_run_digest(ti.dag_id, ti.run_id)}.json"


class BudgetGate:
    """Run by a task that bills a slice before it starts (its ``pre_execute``): when the run is over its budget and
    the admin's rule is to ask, it starts only once an approver's answer is recorded for this run, for at least the
    estimate as it stands now. Marking ``approve_budget`` success (the REST API lets a user who may edit task
    instances do it) or rewriting the guard's XCom records no answer: the task fails with one line.

    :param guard_task_id: the TPUCheckChipBudgetOperator's task id.
    :param record_dir: where the ChipBudgetApprovalOperator records approvals (its ``record_dir``); templated with
        the task's context.
    """

    def __init__(
        self, *, guard_task_id: str = "budget_guard", record_dir: str, gcp_conn_id: str = "google_cloud_default"
    ) -> None:
        self.guard_task_id = guard_task_id
        self.record_dir = record_dir
        self.gcp_conn_id = gcp_conn_id

    def __call__(self, context: Context) -> None:
        from airflow.sdk.exceptions import AirflowFailException

        task = context["task"]
        decision = guard_decision(task, self.guard_task_id, context)
        if not (decision["over_budget"] and decision["over_budget_action"] == "ask"):
            return
        record_dir = task.render_template(self.record_dir, context)
        uri = approval_uri(record_dir, context)
        try:
            record = json.loads(read_text(uri, self.gcp_conn_id) or "null")
        except ValueError:
            record = None
        requester = getattr(context.get("dag_run"), "triggering_user_name", None)
        approved_by = record.get("approved_by") if isinstance(record, Mapping) else None
        who = approved_by if isinstance(approved_by, Mapping) else {}
        if (
            not isinstance(record, Mapping)
            or {k: record.get(k) for k in ("dag_id", "run_id")} != _run_of(context)
            or not who
            or requester in (who.get("id"), who.get("name"))
            or not isinstance(record.get("estimate"), int | float)
            or record["estimate"] < decision["estimate"] - 1e-9
        ):
            raise AirflowFailException(
                f"{task.task_id}: this run would use about {decision['estimate']:.3f} chip-hours, over its budget "
                f"max_chip_hours={decision['max_chip_hours']}, and no approver's answer for that is recorded at {uri} "
                "(the approval task was marked done without one, or the run's cost grew since): nothing was "
                "provisioned; clear the approval task to ask again"
            )
        task.log.info(
            "Over budget, approved by %s for %.3f chip-hours: going ahead", who.get("name"), record["estimate"]
        )
