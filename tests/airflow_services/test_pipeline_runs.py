"""The local pipeline through a running Airflow: a REST-triggered run and a two-date backfill.

Cost (2 cores): each run starts a local Ray cluster simulating a v6e 2x2 slice (one host) and trains
briefly, without the accuracy gate.
"""

from __future__ import annotations

import json
import re
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from support.real_airflow import ARTIFACTS, PIPELINE, backfill_create, explain, task_instances, wait_for_runs

pytestmark = pytest.mark.slow
# What these runs check is the orchestration (deferral to the triggerer, links, leases, per-date outputs), not
# model quality: a one-host slice and a short training without the accuracy gate. The demo runs in
# tests/pipeline train the product defaults behind the gate.
CONF = {"topology": "2x2", "accelerator": "TPU-V6E", "framework": "jax"}
# 600 steps: the smoke test asks "17+25=" for 42 and each run asserts success; at 300 the four-worker run
# answered 48 once in CI (the same data in one process: 42 for every seed, held-out 0.89-0.97)
BACKFILL_CONF = {**CONF, "train_steps": 600, "num_train": 3000, "accuracy_threshold": 0}
DEFERRABLE = ("prep", "train", "deploy")  # the training workers evaluate: no evaluate job
RUN_TIMEOUT = 1200


def _trigger_logs(services: Any, run_id: str, task_id: str) -> list[Path]:
    folder = Path(services.home) / "logs" / f"dag_id={PIPELINE}" / f"run_id={run_id}" / f"task_id={task_id}"
    return sorted(folder.glob("attempt=*.log.trigger.*.log"))


def _report(services: Any, date: str) -> dict[str, Any]:
    path = Path(services.output_root) / PIPELINE / date / "report.json"
    assert path.exists(), f"no report for {date} at {path}"
    return dict(json.loads(path.read_text()))


def _no_live_cluster(services: Any) -> None:
    live = sorted(p.parent.name for p in (Path(services.env["TPUFLOW_HOME"]) / "clusters").glob("*/state.json"))
    assert live == [], f"the teardown left local Ray clusters running: {live}"


@pytest.fixture(scope="module")
def unpaused(api: Any) -> None:
    api.patch(f"/dags/{PIPELINE}", json={"is_paused": False}).raise_for_status()


# long: a whole pipeline run through a real scheduler (222 s); make test keeps the over-budget run below, which is
# triggered through the same REST API and waits in the same triggerer
@pytest.mark.long
@pytest.mark.timeout(RUN_TIMEOUT + 300)  # the test's own wait, not the suite's 900 s default
def test_rest_triggered_run_defers_to_the_triggerer(services: Any, api: Any, unpaused: None) -> None:
    resp = api.post(f"/dags/{PIPELINE}/dagRuns", json={"logical_date": "2026-11-03T00:00:00Z", "conf": BACKFILL_CONF})
    assert resp.status_code == 200, resp.text
    run_id = resp.json()["dag_run_id"]
    run = wait_for_runs(api, PIPELINE, [run_id], RUN_TIMEOUT)[run_id]
    assert run["state"] == "success", explain(api, PIPELINE, run)
    # Each wait ran in the real triggerer process: it writes a trigger log beside the task's log.
    for task_id in DEFERRABLE:
        logs = _trigger_logs(services, run_id, task_id)
        assert logs and any(p.stat().st_size for p in logs), f"{task_id} never deferred to the triggerer"
    report = _report(services, "2026-11-03")
    # evaluated on the held-out set, and the endpoint answered the smoke test's prompt
    assert 0 <= report["accuracy"] <= 1 and report["heldout_examples"] == 200
    assert isinstance(report["sample_completion"], str)
    _no_live_cluster(services)

    links = api.get(f"/dags/{PIPELINE}/dagRuns/{run_id}/taskInstances/train/links").json()["extra_links"]
    assert links["Ray Job"].startswith("http://127.0.0.1:") and "/#/jobs/tpuflow-train-" in links["Ray Job"]
    assert links["Outputs"] == f"/tpuflow/outputs/{PIPELINE}/2026-11-03/train"
    # the full driver log, kept after the cluster is gone, opens in the UI (file:// links are hidden there)
    assert links["Ray Job Log"].startswith(f"/tpuflow/outputs/{PIPELINE}/2026-11-03/logs/train"), links
    deploy_links = api.get(f"/dags/{PIPELINE}/dagRuns/{run_id}/taskInstances/deploy/links").json()["extra_links"]
    assert deploy_links["Serve Endpoint"].startswith("http://127.0.0.1:")
    _task_page_shows_links(services, run_id)
    # every task that ran work on the slice recorded it, through the real triggerer: the ledger's timeline has it
    seconds = report["ledger"]["slices"][0]["timeline"]["seconds"]
    # the training workers' evaluation after the last step is the loop's own (its StepClock's "evaluation")
    assert {"cluster_start", "data_prep", "preflight", "productive", "evaluation", "serving"} <= set(seconds), seconds
    assert 0 < report["ledger"]["goodput"]["goodput"] < 1
    _ledger_page_shows_the_timeline(services, run_id)


def _ledger_page_shows_the_timeline(services: Any, run_id: str) -> None:
    """The plugin's ledger page draws the run's goodput bar and its slice's timeline, cut by cause."""
    from support.ui_browser import airflow_page_at, wait_for

    with airflow_page_at(services, "/tpuflow/ledger") as page:
        causes = wait_for(
            page,
            "(() => { const c = [...document.querySelectorAll(\"svg[aria-label='slice timeline'] rect\")]"
            ".map(r => r.dataset.cause); return c.length ? c : null; })()",
            60,
            "the slice timeline on the ledger page",
        )
        # the evaluation ran inside the training job (its loop's seconds count it, above): no segment of its own
        assert {"cluster_start", "training", "serving"} <= set(causes), causes
        assert page.locator("svg[aria-label='goodput per run']").count() == 1
        assert run_id in page.inner_text("body")
        shot = ARTIFACTS / "ledger_timeline.png"
        page.screenshot(path=shot, full_page=True)
        assert shot.stat().st_size > 20_000


def _task_page_shows_links(services: Any, run_id: str) -> None:
    """The task page in the UI renders the extra links as buttons, and the Outputs one opens the run's folder."""
    from support.ui_browser import airflow_page_at, wait_for

    with airflow_page_at(services, f"/dags/{PIPELINE}/runs/{run_id}/tasks/train/details") as page:
        shown = wait_for(
            page,
            "(() => { const n = [...document.querySelectorAll('a')].map(a => a.innerText.trim())"
            ".filter(t => ['Ray Job', 'Ray Dashboard', 'Outputs'].includes(t)); return n.length === 3 ? n : null; })()",
            90,
            "the extra links Ray Job, Ray Dashboard and Outputs on the task page",
        )
        assert sorted(shown) == ["Outputs", "Ray Dashboard", "Ray Job"]
        page.screenshot(path=ARTIFACTS / "task_links.png")
        page.locator("a").filter(has_text=re.compile(r"^\s*Outputs\s*$")).first.click()
        wait_for(page, "document.title.startsWith('Outputs:')", 30, "the outputs page")
        listing = page.inner_text("body")
        assert "checkpoint" in listing.lower() or "jax-tpu-v6e-2x2" in listing, listing[:1000]


def _awaiting_approval(api: Any, run_id: str, timeout: float = 300) -> dict[str, Any]:
    """The run's approve_budget request once the task waits for a person (Airflow's HITL details)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        states = {ti["task_id"]: ti["state"] for ti in task_instances(api, PIPELINE, run_id)}
        if states.get("approve_budget") == "awaiting_input":
            # as a person would: not within the second the task paused. Airflow 3.3's scheduler marks a task
            # answered before it took in the executor's report of the pause up_for_retry, and the retry asks again
            time.sleep(10)
            return dict(
                api.get(f"/dags/{PIPELINE}/dagRuns/{run_id}/taskInstances/approve_budget/-1/hitlDetails").json()
            )
        assert states.get("approve_budget") not in ("success", "failed", "skipped"), states
        time.sleep(2)
    raise AssertionError(f"approve_budget never waited for a person: {states}")


def _wait_for_state(api: Any, run_id: str, task_id: str, states: tuple[str, ...], timeout: float) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        now = {ti["task_id"]: ti["state"] for ti in task_instances(api, PIPELINE, run_id)}
        if now.get(task_id) in states:
            return
        assert now.get(task_id) not in ("success", "failed", "skipped", "upstream_failed"), now
        time.sleep(2)
    raise AssertionError(f"{task_id} never reached {states}")


@pytest.mark.timeout(RUN_TIMEOUT + 600)
def test_a_run_over_its_budget_waits_for_an_approver_never_its_requester(
    services: Any, api: Any, unpaused: None
) -> None:
    """After a run left a ledger, a run whose budget its estimate exceeds, with over_budget=ask, waits in
    Airflow's human-in-the-loop (awaiting input) before anything is provisioned. The admin names the approvers
    (Variable tpuflow_budget_approvers); a plain user who triggered the run cannot approve it through the REST
    API. One is rejected by the approver in the browser (nothing starts), one is killed while it waits, and one
    is approved through the API: it provisions, then is failed from the API mid-training and its teardowns
    leave nothing."""
    from support.ui_browser import airflow_page_at, wait_for

    from tpuflow.paths import output_root

    # an earlier run's ledger, where its chip_ledger task writes it (the guard reads the DAG's output folder):
    # 4 chips for 10 minutes, with make test-long's whole run (above) or without it
    earlier = Path(output_root(services.env)) / PIPELINE / "2026-10-01" / "ledger.json"
    earlier.parent.mkdir(parents=True, exist_ok=True)
    earlier.write_text(json.dumps({"slices": [{"role": "train", "chips": 4, "created_at": 1.0, "seconds": 600.0}]}))
    api.post("/variables", json={"key": "tpuflow_budget_approvers", "value": "approver"}).raise_for_status()
    requester, approver = services.api("requester"), services.api("approver")
    conf = {**BACKFILL_CONF, "max_chip_hours": 1e-6, "over_budget": "ask"}
    rejected = requester.post(f"/dags/{PIPELINE}/dagRuns", json={"logical_date": "2026-11-05T00:00:00Z", "conf": conf})
    assert rejected.status_code == 200, rejected.text
    run_id = rejected.json()["dag_run_id"]
    request = _awaiting_approval(api, run_id)
    assert "over its chip-hour budget" in request["subject"] and "max_chip_hours=1e-06" in request["body"]
    assert "previous run's measured times" in request["body"] and request["options"] == ["Approve", "Reject"]
    hitl = f"/dags/{PIPELINE}/dagRuns/{run_id}/taskInstances/approve_budget/-1/hitlDetails"
    own = requester.patch(hitl, json={"chosen_options": ["Approve"], "params_input": {}})
    assert own.status_code == 403 and "not a respondent" in own.text, own.text  # the requester approves nothing
    approval = f"/dags/{PIPELINE}/runs/{run_id}/tasks/approve_budget/required_actions"
    with airflow_page_at(services, approval, "approver") as page:
        wait_for(page, "document.body.innerText.includes('chip-hours')", 90, "the approval request with its estimate")
        page.screenshot(path=ARTIFACTS / "budget_approval.png")
        page.get_by_role("button", name="Reject").first.click()
        run = wait_for_runs(api, PIPELINE, [run_id], 300)[run_id]
    states = {ti["task_id"]: ti["state"] for ti in task_instances(api, PIPELINE, run_id)}
    assert states["approve_budget"] == "success" and states["acquire_slice"] == "skipped", states
    assert states["start_cluster"] == "skipped" and states["train"] == "skipped", states
    assert run["state"] == "success", explain(api, PIPELINE, run)  # a person's no is not a failure
    _no_live_cluster(services)

    # killed while it waits (the task marked failed, as from the UI): the run ends at once, nothing was made,
    # and the next run is not held up by it
    killed = requester.post(f"/dags/{PIPELINE}/dagRuns", json={"logical_date": "2026-11-07T00:00:00Z", "conf": conf})
    run_id = killed.json()["dag_run_id"]
    _awaiting_approval(api, run_id)
    resp = api.patch(f"/dags/{PIPELINE}/dagRuns/{run_id}/taskInstances/approve_budget", json={"new_state": "failed"})
    assert resp.status_code == 200, resp.text
    run = wait_for_runs(api, PIPELINE, [run_id], 300)[run_id]
    states = {ti["task_id"]: ti["state"] for ti in task_instances(api, PIPELINE, run_id)}
    assert run["state"] == "failed" and states["approve_budget"] == "failed", (states, explain(api, PIPELINE, run))
    assert states["acquire_slice"] != "success" and states["start_cluster"] != "success", states
    _no_live_cluster(services)
    held = sorted((Path(services.env["TPUFLOW_HOME"]) / "slice-leases").rglob("slot-*.json"))
    assert held == [], f"a killed run before any slice holds a lease: {held}"

    # approved by the approver: the run provisions its slice and trains (the REST-triggered run above ran a whole
    # pipeline); failed from the API while it trains, its teardowns stop the cluster and free the lease
    approved = requester.post(f"/dags/{PIPELINE}/dagRuns", json={"logical_date": "2026-11-06T00:00:00Z", "conf": conf})
    run_id = approved.json()["dag_run_id"]
    _awaiting_approval(api, run_id)
    answer = approver.patch(
        f"/dags/{PIPELINE}/dagRuns/{run_id}/taskInstances/approve_budget/-1/hitlDetails",
        json={"chosen_options": ["Approve"], "params_input": {}},
    )
    assert answer.status_code == 200, answer.text
    _wait_for_state(api, run_id, "train", ("running", "deferred"), RUN_TIMEOUT)
    resp = api.patch(f"/dags/{PIPELINE}/dagRuns/{run_id}/taskInstances/train", json={"new_state": "failed"})
    assert resp.status_code == 200, resp.text
    run = wait_for_runs(api, PIPELINE, [run_id], RUN_TIMEOUT)[run_id]
    states = {ti["task_id"]: ti["state"] for ti in task_instances(api, PIPELINE, run_id)}
    assert states["acquire_slice"] == "success" and states["start_cluster"] == "success", states
    assert run["state"] == "failed" and states["stop_cluster"] == "success", (states, explain(api, PIPELINE, run))
    _no_live_cluster(services)
    held = sorted((Path(services.env["TPUFLOW_HOME"]) / "slice-leases").rglob("slot-*.json"))
    assert held == [], f"a finished run holds a lease: {held}"


@pytest.mark.long  # two pipeline runs; make test checks the lease across a backfill with the probe DAG (test_real_airflow)
@pytest.mark.timeout(2 * RUN_TIMEOUT + 300)  # two pipeline runs, one after the other
def test_backfill_two_dates_one_slice_at_a_time(services: Any, api: Any, unpaused: None) -> None:
    """`airflow backfill create` as a user types it (no --max-active-runs): both dates succeed, each
    with its own outputs, and the two runs' clusters never exist at the same time."""
    backfill_create(services, PIPELINE, "2026-11-05", "2026-11-06", "--dag-run-conf", json.dumps(BACKFILL_CONF))
    runs = api.get(f"/dags/{PIPELINE}/dagRuns", params={"run_type": "backfill"}).json()["dag_runs"]
    run_ids = sorted(r["dag_run_id"] for r in runs)
    assert len(run_ids) == 2
    final = wait_for_runs(api, PIPELINE, run_ids, 2 * RUN_TIMEOUT)
    for run in final.values():
        assert run["state"] == "success", explain(api, PIPELINE, run)
    reports = {d: _report(services, d) for d in ("2026-11-05", "2026-11-06")}
    assert reports["2026-11-05"]["output_dir"] != reports["2026-11-06"]["output_dir"]
    for date in reports:
        assert (Path(services.output_root) / PIPELINE / date / "train").is_dir()
    # One slice at a time: cluster lifetimes [start_cluster start, stop_cluster end] do not overlap.
    spans = []
    for rid in run_ids:
        tis = {ti["task_id"]: ti for ti in task_instances(api, PIPELINE, rid)}
        spans.append((_ts(tis["start_cluster"]["start_date"]), _ts(tis["stop_cluster"]["end_date"]), rid))
    spans.sort()
    assert spans[1][0] >= spans[0][1], f"two slices at once: {spans}"
    _no_live_cluster(services)


def _ts(value: str) -> float:
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
