"""Through a running Airflow: the UI's trigger form, the plugin, slice leases under a backfill.

The pipeline's own end-to-end runs (REST trigger, two-date backfill) are in test_pipeline_runs.py.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import pytest
import requests
from support.real_airflow import ARTIFACTS, PIPELINE, backfill_create, explain, wait_for_runs

pytestmark = pytest.mark.slow
PROBE = "tpuflow_slice_lease_probe"


def test_services_healthy_with_project_dags_plugin_and_provider(services: Any, api: Any) -> None:
    health = requests.get(f"{services.url}/api/v2/monitor/health", timeout=10).json()
    assert {k: v["status"] for k, v in health.items()} == {
        "metadatabase": "healthy",
        "scheduler": "healthy",
        "triggerer": "healthy",
        "dag_processor": "healthy",
    }
    assert api.get("/importErrors").json()["total_entries"] == 0
    dag_ids = {d["dag_id"] for d in api.get("/dags", params={"limit": 100}).json()["dags"]}
    assert {PIPELINE, PROBE} <= dag_ids
    plugins = {p["name"]: p for p in api.get("/plugins").json()["plugins"]}
    assert [v["href"] for v in plugins["tpuflow"]["external_views"]] == ["/tpuflow/clusters", "/tpuflow/ledger"]
    for route, title in (("clusters", "Local Ray clusters"), ("ledger", "Chip-hour ledger")):
        assert requests.get(f"{services.url}/tpuflow/{route}", timeout=10).status_code == 401
        page = requests.get(f"{services.url}/tpuflow/{route}", cookies={"_token": services.token()}, timeout=10)
        assert page.ok and title in page.text, route
    # The outputs page serves only a DAG's folder under the output root.
    sneaky = requests.get(
        f"{services.url}/tpuflow/outputs/{PIPELINE}/%2e%2e/%2e%2e/%2e%2e/etc/passwd",
        cookies={"_token": services.token()},
        timeout=10,
    )
    assert sneaky.status_code == 404 and "root:" not in sneaky.text
    providers = {p["package_name"] for p in api.get("/providers", params={"limit": 100}).json()["providers"]}
    assert "tpuflow" in providers
    # Nothing but the API server listens: scheduler/triggerer log servers are off.
    for port in (8793, 8794):
        assert f":{port} " not in _listening_owned_by(services), f"a log server listens on {port}"


def _listening_owned_by(services: Any) -> str:
    """Listening TCP sockets of the services' processes, as 'addr:port ' text (from /proc)."""
    inodes = set()
    for pgid in services.pids.values():
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            try:
                if int((proc / "stat").read_text().rsplit(")", 1)[1].split()[2]) != pgid:
                    continue
                for fd in (proc / "fd").iterdir():
                    target = str(fd.readlink())
                    if target.startswith("socket:["):
                        inodes.add(target[8:-1])
            except OSError:
                continue
    out = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            parts = line.split()
            if parts[3] == "0A" and parts[9] in inodes:  # LISTEN
                out.append(f":{int(parts[1].rsplit(':', 1)[1], 16)} ")
    return "".join(out)


def test_trigger_form_shows_params_as_fields_with_choices(services: Any) -> None:
    """What a user sees after pressing Trigger: one field per Param, choices for accelerator, suggestions for topology."""
    from support.ui_browser import airflow_page, wait_for

    from tpuflow.pipeline.params import ACCELERATORS, TOPOLOGIES

    with airflow_page(services.url, services.token()) as page:
        page.goto(f"{services.url}/dags/{PIPELINE}")
        trigger = page.locator('button[aria-label="Trigger Dag"]')
        trigger.wait_for(timeout=120_000)
        trigger.click()
        page.locator("#element_accelerator").wait_for(state="attached", timeout=60_000)
        fields = page.evaluate(
            "Object.fromEntries([...document.querySelectorAll('[role=dialog] [name^=element_]')]"
            ".map(e => [e.name.slice(8), e.type === 'checkbox' ? e.checked : e.value]))"
        )
        assert fields == {
            "accelerator": "TPU-V6E",
            "topology": "4x4",
            "machine_type": "",
            "num_slices": "1",
            "preflight": True,
            "framework": "jax",
            "train_steps": "1500",
            "checkpoint_every": "500",
            "accuracy_threshold": "0.9",
            "keep_endpoint": False,
            "idle_timeout": "",
            "num_train": "20000",
            "num_eval": "200",
            "max_chip_hours": "",
            "over_budget": "fail",
            "serve_topology": "__null__",  # the form's select shows None as its null choice
            "resume": "auto",
        }
        # accelerator is a dropdown (react-select) of the allowed values; topology a text field suggesting the
        # catalog's shapes (a datalist: check_params refuses a bad one in one line with the shape hint)
        title = page.get_by_text("Trigger Dag - ").first
        suggested = page.evaluate("[...document.querySelectorAll('#list_topology option')].map(o => o.value)")
        page.locator("#element_accelerator").click()
        listed = wait_for(
            page,
            "(() => { const o = [...document.querySelectorAll('[id*=-option-]')].map(e => e.innerText);"
            " return o.length ? o : null; })()",
            20,
            "the accelerator choices",
        )
        assert {"topology": suggested, "accelerator": listed} == {"topology": TOPOLOGIES, "accelerator": ACCELERATORS}
        shot = ARTIFACTS / "trigger_form.png"
        page.screenshot(path=shot)
        assert shot.stat().st_size > 20_000
        title.click()
        # With the defaults the form must be submittable: a Param the UI thinks is missing disables Trigger.
        submit = page.locator("[role=dialog] button").filter(has_text=re.compile(r"^\s*Trigger\s*$"))
        state = "missing" if submit.count() == 0 else ("disabled" if submit.first.is_disabled() else "enabled")
        invalid = page.evaluate(
            "[...document.querySelectorAll('[role=dialog] [data-invalid] [name^=element_], [role=dialog] [aria-invalid=true]')]"
            ".map(e => e.name || e.id)"
        )
        empty = sorted(k for k, v in fields.items() if v == "")
        assert state == "enabled", (
            f"the trigger form's Trigger button is {state} with the default Params (invalid: {invalid}; empty: {empty}). "
            "The UI treats an empty string default as a missing required value: make optional Params nullable, "
            'e.g. Param(None, type=["null", "string"]).'
        )


def test_backfill_runs_share_one_slice_lease(services: Any, api: Any, tmp_path: Path) -> None:
    """`airflow backfill create` without --max-active-runs (Airflow's default: 10 runs at once) still
    holds one slice at a time: the lease waits are deferred to the triggerer, and the holds never overlap."""
    api.patch(f"/dags/{PROBE}", json={"is_paused": False}).raise_for_status()
    backfill_create(services, PROBE, "2026-11-01", "2026-11-03")
    runs = api.get(f"/dags/{PROBE}/dagRuns", params={"run_type": "backfill"}).json()["dag_runs"]
    run_ids = sorted(r["dag_run_id"] for r in runs)
    assert len(run_ids) == 3
    final = wait_for_runs(api, PROBE, run_ids, timeout=240)
    for run in final.values():
        assert run["state"] == "success", explain(api, PROBE, run)
    holds_dir = Path(services.env["TPUFLOW_PROBE_LEASES"]).parent / "probe-holds"
    holds = sorted((json.loads(p.read_text()) for p in holds_dir.glob("*.json")), key=lambda h: h["start"])
    assert len(holds) == 3
    for earlier, later in zip(holds, holds[1:], strict=False):
        assert later["start"] >= earlier["end"], f"two runs held a slice at once: {earlier} / {later}"
    # The runs that had to wait did so in the triggerer (a trigger log file per deferral), not in a worker slot.
    logs = Path(services.home) / "logs" / f"dag_id={PROBE}"
    deferred = [p for p in logs.glob("run_id=*/task_id=acquire_slice/*.trigger.*.log") if "held by" in p.read_text()]
    assert len(deferred) >= 2, "waiting runs should defer to the triggerer"
    assert not list(Path(services.env["TPUFLOW_PROBE_LEASES"]).glob("slot-*.json")), "a lease was not given back"


def test_cli_status_and_env_describe_the_running_services(services: Any) -> None:
    import subprocess
    import sys

    tpuflow = str(Path(sys.executable).with_name("tpuflow"))
    status = subprocess.run(
        [tpuflow, "airflow", "status", "--work-dir", services.work_dir], capture_output=True, text=True, timeout=60
    )
    assert status.returncode == 0, status.stdout + status.stderr
    assert services.url in status.stdout and services.password in status.stdout
    env = subprocess.run(
        [tpuflow, "airflow", "env", "--work-dir", services.work_dir], capture_output=True, text=True, timeout=60
    )
    assert f"export AIRFLOW_HOME={services.home}" in env.stdout


XCOM_PROBE = "tpuflow_xcom_probe"


def test_a_plain_user_who_rewrites_the_cluster_xcom_gets_no_token_and_the_job_refuses_it(
    services: Any, tmp_path: Path
) -> None:
    """A user with Airflow's plain "user" role triggers the probe run, then rewrites its start task's XCom through
    the REST API (Airflow lets them) so the dashboard is their server and the token file any file the worker can
    read. The job fails with one line naming the change; their server sees no request; the teardown stops the
    run's own cluster."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    seen: list[str] = []

    class Attacker(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            seen.append(self.headers.get("Authorization", ""))
            self.send_response(200)
            self.end_headers()

        do_POST = do_GET

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Attacker)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    services.api().patch(f"/dags/{XCOM_PROBE}", json={"is_paused": False}).raise_for_status()
    user = services.api("requester")
    go = tmp_path / "go"
    try:
        resp = user.post(f"/dags/{XCOM_PROBE}/dagRuns", json={"logical_date": None, "conf": {"go_file": str(go)}})
        assert resp.status_code == 200, resp.text
        run_id = resp.json()["dag_run_id"]
        entry = f"/dags/{XCOM_PROBE}/dagRuns/{run_id}/taskInstances/start_cluster/xcomEntries/return_value"
        deadline = time.time() + 300
        while (xcom := user.get(entry, params={"deserialize": True})).status_code != 200:
            assert time.time() < deadline, f"start_cluster pushed no XCom: {xcom.text}"
            time.sleep(2)
        info = xcom.json()["value"]
        secret = tmp_path / "worker-readable"
        secret.write_text("a-secret-the-worker-can-read\n")
        forged = {
            **info,
            "dashboard_url": f"http://127.0.0.1:{server.server_address[1]}",
            "auth_token_path": str(secret),
        }
        rewritten = user.patch(entry, json={"value": forged})
        assert rewritten.status_code == 200, rewritten.text  # the plain user may do this: the attack is real
        go.write_text("go")
        run = wait_for_runs(user, XCOM_PROBE, [run_id], 600)[run_id]
    finally:
        server.shutdown()
        server.server_close()
    assert run["tis"]["job"]["state"] == "failed" and run["tis"]["stop_cluster"]["state"] == "success", explain(
        services.api(), XCOM_PROBE, run
    )
    assert seen == [], f"the worker called the attacker's server: {seen}"
    log = "".join(p.read_text() for p in (Path(services.home) / "logs" / f"dag_id={XCOM_PROBE}").rglob("*.log"))
    assert "no longer matches the cluster that task made" in log and "clear start_cluster" in log
    assert not list((Path(services.env["TPUFLOW_HOME"]) / "clusters").glob("*/state.json"))
