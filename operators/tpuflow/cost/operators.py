"""The ledger and budget tasks of the pipelines (the local backend's span recording: tpuflow.cost.local).

Cheap to import (DAG files import this): the GKE hook, storage and the local cluster load in execute.
"""

from __future__ import annotations

import abc
import json
import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from airflow.sdk import BaseOperator

from tpuflow.arguments import ArgumentCheck, ArgumentChecks
from tpuflow.deprecations import warn_renamed
from tpuflow.errors import UserInputError
from tpuflow.limits import admin_limits, check_over_budget, hold_budget, hold_over_budget
from tpuflow.templating import is_true
from tpuflow.work_spans import WORK_SPAN_KEY, tasks_on_cluster

if TYPE_CHECKING:
    from airflow.sdk import Context


class SliceSpan(NamedTuple):
    """What the ledger knows of one slice's life (unix seconds; None: not known)."""

    created_at: float | None
    deleted_at: float | None
    pools: list[str]
    provisioned_at: float | None = None  # its nodes ready (GKE's create operation ended)
    cluster_ready_at: float | None = None  # its Ray cluster up (the local cluster's every node joined)
    reclaimed_at: float | None = None  # GKE ended its nodes at their maxRunDuration before the delete


def _check_slices(slices: Any) -> None:
    if not isinstance(slices, list) or not slices:
        raise UserInputError("slices", slices, 'give a list of {"role", "tpu", "task_id"} dicts')
    for entry in slices:
        if not isinstance(entry, Mapping) or not {"role", "tpu", "task_id"} <= set(entry):
            raise UserInputError("slices", entry, 'each slice is a dict with "role", "tpu" and "task_id"')
        tpu = entry["tpu"]
        if tpu is not None and not isinstance(tpu, Mapping):
            raise UserInputError("slices", entry, "tpu is check_params' slice (a dict with chips, num_slices)")
        work = entry.get("work", [])
        if not (
            isinstance(work, list | tuple)
            and all(isinstance(t, str) and t for t in work)
            or isinstance(work, Mapping)
            and all(isinstance(t, str) and (c is None or isinstance(c, str)) for t, c in work.items())
        ):
            raise UserInputError(
                f"slices[{entry['role']}].work",
                work,
                'give the task ids that ran work on the slice, a list or {"task_id": "cause"} '
                '(e.g. {"evaluate": "evaluation"})',
            )


def _finite(value: Any) -> float | None:
    """A finite number (not a bool), or None."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def _plain_json(value: Any) -> bool:
    """JSON without NaN or Infinity (what ledger.json and the UI's JSON.parse can read back)."""
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError):
        return False
    return True


def _bad_span_field(span: Mapping[str, Any]) -> str | None:
    """What of a work span a ledger cannot use (its times, its training breakdown), or None."""
    if _finite(span.get("started_at")) is None:
        return "started_at"
    if span.get("ended_at") is not None and _finite(span.get("ended_at")) is None:
        return "ended_at"
    breakdown = span.get("breakdown")
    if breakdown is not None and not (
        isinstance(breakdown, Mapping) and all(_finite(v) is not None and v >= 0 for v in breakdown.values())
    ):
        return "breakdown"
    return None


def work_spans(context: Context, work: Any, warn: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """The work_span records the slice's work tasks pushed (every map index of a mapped task), with the
    cause the slice entry names for a task, if it names one. A span whose times are not numbers is left out, one
    whose training breakdown is not seconds keeps its span without the breakdown; ``warn`` is told which."""
    causes = dict(work) if isinstance(work, Mapping) else dict.fromkeys(work or [])
    out = []
    for task_id, cause in causes.items():
        # a list of task ids: every map index's value, a mapped task's too
        for span in context["ti"].xcom_pull(task_ids=[task_id], key=WORK_SPAN_KEY) or []:
            if not isinstance(span, Mapping) or span.get("started_at") is None:
                continue
            span = {**span, "cause": cause or span.get("cause", "job"), "task_id": task_id}
            bad = _bad_span_field(span)
            if bad == "breakdown":
                span.pop("breakdown")
            elif bad is not None:
                if warn:
                    warn(f"{task_id}'s work span has a {bad} that is not a time ({span.get(bad)!r}): left out")
                continue
            if bad and warn:
                warn(f"{task_id}'s training breakdown is not seconds ({span.get(bad)!r}): its time is not split")
            out.append(span)
    return out


def slice_chips(tpu: Mapping[str, Any] | None) -> int:
    if not tpu:
        return 0
    return int(tpu.get("chips", 0)) * int(tpu.get("num_slices", 1) or 1)


class TPUWriteChipLedgerOperator(ArgumentChecks, BaseOperator):
    """Write the run's chip-hour ledger: ledger.json, a ``ledger`` key in report.json, and the task's XCom.

    A teardown: it runs after the slices' deletes whatever failed, and never changes the run's outcome.

    :param slices: templated; one ``{"role", "tpu", "task_id"}`` per slice: ``tpu`` is check_params'
        slice dict (chips, num_slices, generation), ``task_id`` the task whose record gives the span; and
        optionally ``work``: the tasks that ran work on the slice (their ``work_span`` XCom: Ray jobs, Serve
        deploys), a list of task ids or ``{task_id: cause}`` to name what a task's time counts as
        (None: the cause the task recorded; tpuflow.cost.goodput); the slice's timeline and the run's goodput are built from them.
    :param trained: templated; the train task's XCom (its ``fit_s`` is the training time), None if it failed.
    :param output_dir: templated; the run's output folder.
    :param prices: templated; JSON {generation: price per chip-hour} (Variable ``tpuflow_chip_hour_prices``).
    :param gcp_conn_id: templated; connection for a gs:// output folder (and, on GKE, the GKE API).
    :param endpoint: templated; the kept-endpoint watch's verdict (RayServeWaitForIdleOperator's XCom: kept, or
        stopped idle with its reason), recorded as the ledger's ``endpoint``; None: no endpoint.
    """

    template_fields: Sequence[str] = ("slices", "trained", "output_dir", "prices", "gcp_conn_id", "endpoint")
    ui_color = "#fff3cd"

    def __init__(
        self,
        *,
        slices: Any,
        trained: Any = None,
        output_dir: str,
        prices: Any = None,
        gcp_conn_id: str = "google_cloud_default",
        endpoint: Any = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.slices = slices
        self.trained = trained
        self.output_dir = output_dir
        self.prices = prices
        self.gcp_conn_id = gcp_conn_id
        self.endpoint = endpoint

    def argument_checks(self) -> list[ArgumentCheck]:
        return [*super().argument_checks(), ((self.slices,), lambda: _check_slices(self.slices))]

    @abc.abstractmethod
    def spans(self, context: Context) -> list[SliceSpan]:
        """What is known of each of ``slices``' life."""
        ...

    def execute(self, context: Context) -> dict[str, Any]:
        from tpuflow.cost.goodput import run_goodput, slice_timeline
        from tpuflow.cost.ledger import build_ledger, check_prices, slice_entry

        self.validate_arguments()
        # The ledger is always recorded: an input it cannot use (a bad price, a breakdown that is not seconds) is
        # left out of it with a warning, in the log and in the ledger's ``warnings``.
        warnings: list[str] = []

        def warn(text: str) -> None:
            warnings.append(text)
            self.log.warning("%s", text)

        try:
            prices = check_prices(self.prices)
        except UserInputError as err:
            warn(f"{err}; the ledger is recorded without money")
            prices = {}
        now = time.time()
        lines = []
        for entry, span in zip(self.slices, self.spans(context), strict=True):
            tpu = entry["tpu"] or {}
            line = slice_entry(
                entry["role"],
                tpu.get("generation", ""),
                slice_chips(tpu),
                span.created_at,
                span.deleted_at,
                pools=span.pools,
                now=now,
                reclaimed=span.reclaimed_at,
            )
            made = context["ti"].xcom_pull(task_ids=entry["task_id"])
            if isinstance(made, Mapping) and made.get("node_zone"):
                line["zone"] = made["node_zone"]  # where the slice landed (a zone failover's choice)
            line["timeline"] = slice_timeline(
                span.created_at,
                span.deleted_at if span.reclaimed_at is None else span.reclaimed_at,
                work_spans(context, self._work(entry), warn),
                now=now,
                provisioned_at=span.provisioned_at,
                cluster_ready_at=span.cluster_ready_at,
            )
            lines.append(line)
        trained = self.trained if isinstance(self.trained, Mapping) else {}
        fit_s = trained.get("fit_s")
        if fit_s is not None and (_finite(fit_s) is None or fit_s < 0):
            warn(f"the train task's fit_s is not seconds ({fit_s!r}): the ledger has no training chip-hours")
            fit_s = None
        train_tpu = next((e["tpu"] for e in self.slices if e["role"] == "train"), None)
        ledger = build_ledger(
            lines,
            training_seconds=fit_s,
            training_chips=slice_chips(train_tpu),
            prices=prices,
        )
        ledger["goodput"] = run_goodput(lines)
        raw_measured = trained.get("goodput")
        measured: Mapping[str, Any] = raw_measured if isinstance(raw_measured, Mapping) else {}
        for key in ("steps", "checkpoint", "attempts"):  # the training loop's own counts, beside the seconds
            if key in measured and _plain_json(measured[key]):
                ledger["goodput"][key] = measured[key]
            elif key in measured:
                warn(f"the train task's goodput {key} is not plain numbers ({measured[key]!r}): left out")
        if isinstance(self.endpoint, Mapping):  # why a kept endpoint's slice was let go, or that it is kept
            ledger["endpoint"] = dict(self.endpoint)
        if warnings:
            ledger["warnings"] = warnings
        self._record(ledger)
        return ledger

    def _work(self, entry: Mapping[str, Any]) -> dict[str, str | None]:
        """The slice's work tasks: the ones its entry names (with their causes), and every other task of the DAG
        whose ``cluster`` is the slice's cluster (``cluster_task_id``: a team's own Ray jobs on the slice)."""
        declared = entry.get("work") or {}
        work = dict(declared) if isinstance(declared, Mapping) else dict.fromkeys(declared)
        cluster_task_id = entry.get("cluster_task_id")
        dag = self.get_dag()
        if cluster_task_id and dag is not None:
            for task_id in tasks_on_cluster(dag.tasks, cluster_task_id):
                work.setdefault(task_id, None)
        return work

    def _record(self, ledger: dict[str, Any]) -> None:
        from tpuflow.cost.goodput import summary_line
        from tpuflow.cost.ledger import LEDGER_FILE
        from tpuflow.storage import read_text, write_text

        root = self.output_dir.rstrip("/")
        write_text(f"{root}/{LEDGER_FILE}", json.dumps(ledger, indent=2), self.gcp_conn_id)
        report_text = read_text(f"{root}/report.json", self.gcp_conn_id)
        try:
            report = json.loads(report_text) if report_text else None
        except ValueError:
            report = None
            self.log.warning("%s/report.json is not JSON: the ledger is in %s only", root, LEDGER_FILE)
        if isinstance(report, dict):
            report["ledger"] = ledger
            write_text(f"{root}/report.json", json.dumps(report, indent=2), self.gcp_conn_id)
        print(f"TPUFLOW_LEDGER {json.dumps(ledger)}")
        self.log.info(
            "Chip-hours: %.4f billed, %.4f training (ratio %s); %s",
            ledger["chip_hours"],
            ledger["training_chip_hours"],
            ledger["chip_hours_ratio"],
            summary_line(ledger["goodput"]),
        )


class GKEWriteChipLedgerOperator(TPUWriteChipLedgerOperator):
    """TPUWriteChipLedgerOperator whose spans are the GKE operations on the pools each create task made.

    :param project_id: the cluster's project; templated.
    :param location: the cluster's zone or region; templated.
    :param cluster_name: the GKE cluster; templated.

    Every other argument is TPUWriteChipLedgerOperator's; a slice's ``task_id`` is its create task (its
    ``node_pool_names`` XCom names the pools).
    """

    template_fields: Sequence[str] = (
        *TPUWriteChipLedgerOperator.template_fields,
        "project_id",
        "location",
        "cluster_name",
    )

    def __init__(self, *, project_id: str, location: str, cluster_name: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.project_id = project_id
        self.location = location
        self.cluster_name = cluster_name

    def spans(self, context: Context) -> list[SliceSpan]:
        return gke_slice_spans(context, self.slices, self.gcp_conn_id, self.project_id, self.location)


def gke_slice_spans(
    context: Context, slices: Sequence[Mapping[str, Any]], gcp_conn_id: str, project_id: str, location: str
) -> list[SliceSpan]:
    """Each slice's span from the GKE operations on the pools its create task made, and the maxRunDuration its
    create task gave them (its XCom's ``max_run_duration_s``): a pool whose nodes GKE ended at it (Airflow
    down longer than that) is billed until then, not until its delete."""
    from tpuflow.cost.ledger import pool_ready, pool_span, reclaimed_at
    from tpuflow.gke.hooks import GKENodePoolHook, to_rest_json

    hook = GKENodePoolHook(gcp_conn_id=gcp_conn_id, location=location)
    response = hook.get_cluster_manager_client().list_operations(parent=f"projects/{project_id}/locations/{location}")
    operations = [to_rest_json(op) for op in response.operations]
    out: list[SliceSpan] = []
    for entry in slices:
        names = context["ti"].xcom_pull(task_ids=entry["task_id"], key="node_pool_names") or []
        made = context["ti"].xcom_pull(task_ids=entry["task_id"])
        max_run_s = made.get("max_run_duration_s") if isinstance(made, Mapping) else None
        now = time.time()
        starts, ends, ready, reclaims = [], [], [], []
        for name in names:
            created, deleted = pool_span(operations, name)
            starts.append(created)
            ends.append(deleted)
            ready.append(pool_ready(operations, name))
            reclaims.append(reclaimed_at(ready[-1], deleted, max_run_s, now))
        created_at = min((s for s in starts if s is not None), default=None)
        # the slice is billed until its last pool is gone; one pool still there keeps it open
        deleted_at = None if not ends or None in ends else max(e for e in ends if e is not None)
        # ... or, once GKE ended some pools' nodes and the others are deleted, until the last of those ends
        pool_ends = [r if r is not None else d for r, d in zip(reclaims, ends, strict=True)]
        reclaimed = None
        if any(r is not None for r in reclaims) and None not in pool_ends:
            reclaimed = max(e for e in pool_ends if e is not None)
        # a multislice is ready when its last pool is
        provisioned_at = None if not ready or None in ready else max(r for r in ready if r is not None)
        out.append(SliceSpan(created_at, deleted_at, list(names), provisioned_at, reclaimed_at=reclaimed))
    return out


# The newest run folders a budget decision reads (a month of daily runs): every task that asks for a slice decides
# again, and a year of ledgers on Cloud Storage would be a read each.
LEDGERS_READ = 30


class TPUCheckChipBudgetOperator(ArgumentChecks, BaseOperator):
    """Refuse to provision when the run's estimated chip-hours exceed its budget.

    The budget is ``max_chip_hours`` held at the admin's ceiling (Variable ``tpuflow_max_chip_hours``,
    tpuflow.limits): a larger or empty value is the ceiling, said in one log line. The estimate is this run's
    slices' chips times the durations of the DAG's previous run (its chip_ledger XCom); without one there is no
    estimate and the run goes ahead (logged).

    :param max_chip_hours: templated; the budget (None/empty: the admin's ceiling). <= 0, not a number or not
        finite is rejected.
    :param over_budget: templated; "fail" (default): an estimate over the budget fails the run; "ask": the guard
        succeeds saying so (``over_budget``), and ChipBudgetApprovalOperator asks an approver; "run": the run goes
        ahead (training is still held to the budget). Held at the loosest the admin allows (Variable
        ``tpuflow_over_budget``, default "ask"); empty: the admin's.
    :param slices: templated; ``{"role", "tpu"}`` per slice the run will hold (check_params' slices), and
        ``steps`` for the slice that trains: the steps this run takes, so the estimate is the previous run's
        measured badput plus these steps at its measured time per step (its ledger's goodput).
    :param ledger_dir: templated; where the DAG's runs record their ledgers (``<ledger_dir>/<folder>/ledger.json``,
        the pipelines' output folder of the DAG): the previous runs are read there, in storage only the workers
        write. None: from the chip_ledger task's XCom of earlier runs, which a user who may write XComs can change
        (a DAG of its own without an output folder).

    Returns ``{"max_chip_hours", "estimate", "basis", "max_run_seconds", "over_budget", "over_budget_action"}``
    (``max_chip_hours`` and ``over_budget_action`` as the run is held to them): ``max_run_seconds`` is, per role,
    how long that slice may live (the budget spent on it alone, the DAG's ``dagrun_timeout``, plus a margin),
    what its node pool's ``max_run_duration`` is set to so that GKE ends it even when Airflow is down.
    """

    template_fields: Sequence[str] = ("max_chip_hours", "slices", "over_budget", "ledger_dir")
    ui_color = "#fff3cd"

    def __init__(
        self,
        *,
        max_chip_hours: Any = None,
        slices: Any,
        over_budget: str = "fail",
        ledger_dir: str | None = None,
        gcp_conn_id: str = "google_cloud_default",
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.max_chip_hours = max_chip_hours
        self.slices = slices
        self.over_budget = over_budget
        self.ledger_dir = ledger_dir
        self.gcp_conn_id = gcp_conn_id

    def argument_checks(self) -> list[ArgumentCheck]:
        return [
            *super().argument_checks(),
            ((self.slices,), self._check_planned_slices),
            ((self.max_chip_hours,), self.budget),
            ((self.over_budget,), self._check_over_budget),
        ]

    def _check_over_budget(self) -> str | None:
        return check_over_budget(self.over_budget)

    def _check_planned_slices(self) -> None:
        if not isinstance(self.slices, list) or not all(
            isinstance(s, Mapping) and {"role", "tpu"} <= set(s) for s in self.slices
        ):
            raise UserInputError("slices", self.slices, 'give a list of {"role", "tpu"} dicts')
        for s in self.slices:
            steps = s.get("steps")
            if steps not in (None, "") and not (str(steps).isdigit() and int(steps) > 0):
                raise UserInputError(f"slices[{s['role']}].steps", steps, "give the training steps, an integer > 0")

    def budget(self) -> float | None:
        """The (rendered) max_chip_hours as a number, as asked (before the admin's ceiling); None: none asked."""
        from tpuflow.cost.budget import check_max_chip_hours

        return check_max_chip_hours(self.max_chip_hours, "max_chip_hours")

    def held(self) -> tuple[float, str]:
        """(the budget, the over_budget action) the run is held to: what it asked, within the admin's limits; each
        one the admin's limit changed is said in one log line."""
        limits = admin_limits()
        budget = hold_budget(self.budget(), limits.max_chip_hours)
        action = hold_over_budget(self._check_over_budget(), limits.over_budget)
        for note in (budget.note, action.note):
            if note:
                self.log.warning("%s", note)
        return budget.value, action.value

    def previous_ledgers(self, context: Context) -> list[Any]:
        """The DAG's earlier ledgers: from ``ledger_dir`` when given (the ledger.json of its newest LEDGERS_READ run
        folders, by name: the pipelines' folders are dates; one that is not JSON is skipped), else from the
        chip_ledger XComs of earlier runs."""
        from tpuflow.cost.ledger import LEDGER_FILE, LEDGER_TASK_ID
        from tpuflow.storage import find_files, read_text

        if not self.ledger_dir:
            pulled = context["ti"].xcom_pull(task_ids=LEDGER_TASK_ID, include_prior_dates=True)
            return list(pulled) if isinstance(pulled, list | tuple) else [pulled]
        ledgers = []
        for uri in find_files(self.ledger_dir.rstrip("/"), LEDGER_FILE, self.gcp_conn_id)[-LEDGERS_READ:]:
            try:
                ledgers.append(json.loads(read_text(uri, self.gcp_conn_id) or "null"))
            except ValueError:
                self.log.warning("%s is not JSON: not a basis for the estimate", uri)
        return ledgers

    def decide(self, context: Context) -> dict[str, Any]:
        """The budget decision for this run (the task's value), from its rendered arguments, the admin's limits and
        the previous ledgers: computed again by the approval and the budget gate, never read back from XCom."""
        from tpuflow.cost.budget import basis_ledger, estimate_chip_hours, max_run_seconds

        self.validate_arguments()
        budget, action = self.held()
        wanted = [{"role": s["role"], "chips": slice_chips(s["tpu"]), "steps": s.get("steps")} for s in self.slices]
        estimate, basis = estimate_chip_hours(wanted, basis_ledger(wanted, self.previous_ledgers(context)))
        timeout = getattr(context.get("dag"), "dagrun_timeout", None)
        timeout_s = timeout.total_seconds() if timeout else None
        return {
            "max_chip_hours": budget,
            "estimate": estimate,
            "basis": basis,
            "max_run_seconds": {s["role"]: max_run_seconds(budget, s["chips"], timeout_s) for s in wanted},
            "over_budget": estimate is not None and estimate > budget,
            "over_budget_action": action,
        }

    def execute(self, context: Context) -> dict[str, Any]:
        from airflow.sdk.exceptions import AirflowFailException

        result = self.decide(context)
        budget, estimate, basis, action = (
            result[k] for k in ("max_chip_hours", "estimate", "basis", "over_budget_action")
        )
        if estimate is None:
            self.log.info("max_chip_hours %s: no estimate (%s); the training watch holds the run to it", budget, basis)
        elif estimate > budget and action == "ask":
            self.log.warning(
                "max_chip_hours=%s: this run would use about %.3f chip-hours (%s); an approver is asked to approve "
                "it before anything is provisioned",
                budget,
                estimate,
                basis,
            )
        elif estimate > budget and action == "run":
            self.log.warning(
                "max_chip_hours=%s: this run would use about %.3f chip-hours (%s); it goes ahead (over_budget=run, "
                "allowed by the admin) and training is still stopped at the budget",
                budget,
                estimate,
                basis,
            )
        elif estimate > budget:
            raise AirflowFailException(
                f"max_chip_hours={budget}: this run would use about {estimate:.3f} chip-hours ({basis}); nothing "
                "was provisioned. Lower its cost (a smaller slice or fewer steps), or ask within what the admin "
                "allows (max_chip_hours up to the Variable tpuflow_max_chip_hours, over_budget=ask)."
            )
        else:
            self.log.info("Estimated %.3f chip-hours within max_chip_hours %s (%s)", estimate, budget, basis)
        return result


class TPUReapOrphansOperator(ArgumentChecks, BaseOperator):
    """One reaper run (tpuflow.cost.reaper) from inside Airflow: what finished, killed or expired runs
    of ``dag_ids`` left behind is deleted; a failed list deletes nothing and fails the task.

    :param dag_ids: templated; DAGs whose runs own resources (their running runs are asked through the Task SDK),
        besides every DAG of the task's own bundle tagged ``tpuflow`` (every ``tpu_pipeline`` DAG) and every DAG
        with a run recorded in the lease root's supervision records (each run of a ``tpu_pipeline`` DAG records
        itself there when it takes its slice lease: tpuflow.slices.supervision).
        Another DAG's resources are never judged by its runs (still deleted: a node pool past its expiry, a
        local cluster whose processes are gone, a resource of a run whose supervising process is dead).
    :param output_root: templated; the GKE pipeline's output root (the Variable ``tpuflow_gke_output_root``): its
        lease root (tpuflow.paths.gke_lease_root) is looked at, and a killed run's ledger written under it;
        empty: the local lease root and output root.
    :param older_than: templated; e.g. "2h": only resources at least this old.
    :param dry_run: templated; only list them.
    :param gcp_conn_id, project_id, location, cluster_name: the GKE cluster (empty project: no GKE); templated.
    :param kubernetes_conn_id: templated; a kubernetes connection (default: through GKE).
    :param namespace: templated; the RayClusters' namespace.

    Resources a ``keep_endpoint`` run kept (the kept mark) are never deleted; the log says how many were skipped.
    Each resource is judged by the owner it records (exact dag and run); one whose owner cannot be read is never
    deleted, and the log names it (the answer's ``unreadable``).

    Returns ``{"dry_run", "found", "deleted", "failed", "kept", "unreadable"}``.
    """

    template_fields: Sequence[str] = (
        "dag_ids",
        "older_than",
        "dry_run",
        "gcp_conn_id",
        "project_id",
        "location",
        "cluster_name",
        "kubernetes_conn_id",
        "namespace",
        "output_root",
    )
    ui_color = "#f8d7da"

    def __init__(
        self,
        *,
        dag_ids: Any = None,
        older_than: str = "2h",
        dry_run: Any = False,
        gcp_conn_id: str = "google_cloud_default",
        project_id: str = "",
        location: str = "",
        cluster_name: str = "",
        kubernetes_conn_id: str = "",
        namespace: str = "",
        output_root: str = "",
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.dag_ids = dag_ids
        self.output_root = output_root
        self.older_than = older_than
        # the templated Param shadows BaseOperator.dry_run(), a method nothing in Airflow 3 calls on a task
        self.dry_run = dry_run  # type: ignore[method-assign]
        self.gcp_conn_id = gcp_conn_id
        self.project_id = project_id
        self.location = location
        self.cluster_name = cluster_name
        self.kubernetes_conn_id = kubernetes_conn_id
        self.namespace = namespace

    def argument_checks(self) -> list[ArgumentCheck]:
        return [
            *super().argument_checks(),
            ((self.dag_ids,), self._check_dag_ids),
            ((self.older_than,), self.older_than_seconds),
        ]

    def _check_dag_ids(self) -> None:
        if self.dag_ids is None:
            return
        if not (isinstance(self.dag_ids, list) and all(isinstance(d, str) and d for d in self.dag_ids)):
            raise UserInputError("dag_ids", self.dag_ids, "give a list of DAG ids")

    def older_than_seconds(self) -> float:
        """The (rendered) older_than in seconds."""
        from tpuflow.cost.reaper import parse_duration

        return parse_duration(self.older_than, "older_than")

    def execute(self, context: Context) -> dict[str, Any]:
        from airflow.sdk.exceptions import AirflowFailException

        from tpuflow import paths
        from tpuflow.cost.reaper import (
            FixedRunStates,
            ReaperListError,
            ReaperScope,
            TaskSdkRunStates,
            collect_orphans,
            prune_supervision,
            reap,
            settle_dead_runs,
            tagged_dag_ids,
        )
        from tpuflow.slices.leases import default_lease_root
        from tpuflow.slices.supervision import SupervisionStore

        self.validate_arguments()
        older_than = self.older_than_seconds()
        lease_root = paths.gke_lease_root(self.output_root) if self.output_root else None
        try:
            recorded = SupervisionStore(lease_root or default_lease_root(), self.gcp_conn_id).all()
        except Exception as err:
            raise AirflowFailException(f"Nothing deleted: reading the run supervision records: {err}") from err
        tagged = tagged_dag_ids(context["ti"])  # every tpu_pipeline DAG of this bundle, with a recorded run or not
        dag_ids = sorted({*(self.dag_ids or []), *(entry.dag_id for entry in recorded.values()), *tagged})
        scope = ReaperScope(
            gcp_conn_id=self.gcp_conn_id,
            project_id=self.project_id or None,
            location=self.location or None,
            cluster_name=self.cluster_name or None,
            kubernetes_conn_id=self.kubernetes_conn_id or None,
            namespace=self.namespace or None,
            lease_root=lease_root,
        )
        self.log.info("Judging the runs of DAGs %s", ", ".join(dag_ids) or "(none)")
        try:
            running = TaskSdkRunStates(context["ti"], dag_ids).running()  # asked once for both uses below
            orphans = collect_orphans(scope, FixedRunStates(running, dag_ids), older_than=older_than)
        except ReaperListError as err:
            raise AirflowFailException(f"Nothing deleted: {err}") from err
        outcome = reap(orphans, dry_run=is_true(self.dry_run), say=self.log.info)
        output_root = self.output_root or paths.output_root()
        settle_dead_runs(orphans, outcome, output_root=output_root, gcp_conn_id=self.gcp_conn_id, say=self.log.info)
        if not outcome["dry_run"] and orphans.supervision is not None:
            forgotten = prune_supervision(orphans.supervision, running, dag_ids)
            if forgotten:
                self.log.info("Forgot the supervision records of %d finished run(s)", len(forgotten))
        if outcome["failed"]:
            raise AirflowFailException(f"Could not delete: {'; '.join(outcome['failed'])}")
        return outcome


# Old names, kept for one release (tpuflow.deprecations): each warns and is the renamed class.
class ChipLedgerOperator(TPUWriteChipLedgerOperator):
    """Deprecated: renamed TPUWriteChipLedgerOperator; this name goes in the next release."""

    def __init__(self, **kwargs: Any) -> None:
        warn_renamed("ChipLedgerOperator", TPUWriteChipLedgerOperator)
        super().__init__(**kwargs)


class GKEChipLedgerOperator(GKEWriteChipLedgerOperator):
    """Deprecated: renamed GKEWriteChipLedgerOperator; this name goes in the next release."""

    def __init__(self, **kwargs: Any) -> None:
        warn_renamed("GKEChipLedgerOperator", GKEWriteChipLedgerOperator)
        super().__init__(**kwargs)


class ChipBudgetGuardOperator(TPUCheckChipBudgetOperator):
    """Deprecated: renamed TPUCheckChipBudgetOperator; this name goes in the next release."""

    def __init__(self, **kwargs: Any) -> None:
        warn_renamed("ChipBudgetGuardOperator", TPUCheckChipBudgetOperator)
        super().__init__(**kwargs)


class ReapOrphansOperator(TPUReapOrphansOperator):
    """Deprecated: renamed TPUReapOrphansOperator; this name goes in the next release."""

    def __init__(self, **kwargs: Any) -> None:
        warn_renamed("ReapOrphansOperator", TPUReapOrphansOperator)
        super().__init__(**kwargs)
