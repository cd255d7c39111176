"""The plugin's pages authorize exactly what they serve, tried as a plain user would: HTTP requests to the plugin's
app, mounted as the API server mounts it, signed in with a real JWT of Airflow's own SimpleAuthManager in
multi-team mode. Ana is a viewer in team_x; DAG Y belongs to team_y (its bundle's team, in the metadata DB).

- a "." segment as the DAG id (literal, %2e, %2E) does not stand for the output root, i.e. every DAG's folder;
- an id Airflow would not accept as a DAG id is refused before any folder is looked up;
- the auth manager is asked with the DAG's team, so team_x cannot read team_y's outputs nor see its ledger;
- a link inside a DAG's folder does not lead to, list or size another DAG's files.
"""

from __future__ import annotations

import asyncio
import importlib.util
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

PLUGIN = Path(__file__).resolve().parents[2] / "plugins" / "tpuflow_plugin.py"
PREFIX = "tpuflow_ui_auth"
DAG_X, DAG_Y = f"{PREFIX}_x", f"{PREFIX}_y"
TEAMS = {DAG_X: "team_x", DAG_Y: "team_y"}
DATE = "2026-11-05"
SECRET = "team_y's checkpoint manifest"
RUN_X, RUN_Y = "manual__ana_run", "manual__yara_run"


def _ledger() -> dict[str, Any]:
    return {"chip_hours": 1.5, "training_chip_hours": 1.0, "slices": []}


def _seed(dag_id: str, team: str, run_id: str) -> None:
    """A DAG of ``team`` (through its bundle, as Airflow binds DAGs to teams) with one run's chip_ledger XCom."""
    from airflow.models.dag import DagModel
    from airflow.models.dagbundle import DagBundleModel
    from airflow.models.dagrun import DagRun
    from airflow.models.taskinstance import TaskInstance
    from airflow.models.team import Team
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session
    from sqlalchemy import insert

    from tpuflow.cost.ledger import LEDGER_TASK_ID

    bundle = f"{dag_id}_bundle"
    with create_session() as session:
        team_row = session.get(Team, team) or Team(name=team)
        bundle_row = DagBundleModel(name=bundle)
        bundle_row.teams = [team_row]
        session.add_all([team_row, bundle_row])
        session.flush()
        session.add(DagModel(dag_id=dag_id, bundle_name=bundle))
        session.flush()
        run_pk = session.execute(
            insert(DagRun)
            .values(dag_id=dag_id, run_id=run_id, run_type="manual", run_after=datetime.now(UTC))
            .returning(DagRun.id)
        ).scalar_one()
        session.execute(
            insert(TaskInstance).values(
                id=uuid.uuid4(), dag_id=dag_id, task_id=LEDGER_TASK_ID, run_id=run_id, map_index=-1, pool="x"
            )
        )
        session.execute(
            insert(XComModel).values(
                dag_run_id=run_pk,
                dag_id=dag_id,
                run_id=run_id,
                task_id=LEDGER_TASK_ID,
                map_index=-1,
                key="return_value",
                value=XComModel.serialize_value(_ledger()),
            )
        )


def _unseed() -> None:
    from airflow.models.dag import DagModel
    from airflow.models.dagbundle import DagBundleModel
    from airflow.models.dagrun import DagRun
    from airflow.models.taskinstance import TaskInstance
    from airflow.models.team import Team
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session
    from sqlalchemy import delete

    with create_session() as session:
        for model in (XComModel, TaskInstance, DagRun, DagModel):
            session.execute(delete(model).where(model.dag_id.in_(TEAMS)))
        for bundle in session.query(DagBundleModel).filter(DagBundleModel.name.in_([f"{d}_bundle" for d in TEAMS])):
            bundle.teams = []
            session.delete(bundle)
        session.flush()
        session.execute(delete(Team).where(Team.name.in_(TEAMS.values())))


@pytest.fixture
def auth_calls(migrated_airflow_db: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[str, Any]]]:
    """Airflow's SimpleAuthManager (multi-team) as the API server's auth manager, recording what it is asked."""
    from airflow.api_fastapi.app import _AuthManagerState
    from airflow.api_fastapi.auth.managers.simple.simple_auth_manager import SimpleAuthManager

    class RecordingAuthManager(SimpleAuthManager):
        calls: list[tuple[str, Any]] = []

        def is_authorized_dag(self, *, method: Any, user: Any, access_entity: Any = None, details: Any = None) -> bool:
            self.calls.append((details.id if details else None, details.team_name if details else None))
            return super().is_authorized_dag(method=method, user=user, access_entity=access_entity, details=details)

    manager = RecordingAuthManager()
    manager.calls = []
    monkeypatch.setenv("AIRFLOW__CORE__MULTI_TEAM", "True")
    monkeypatch.setattr(_AuthManagerState, "instance", manager)
    _unseed()  # a run interrupted before its teardown
    for dag_id, team in TEAMS.items():
        _seed(dag_id, team, RUN_X if dag_id == DAG_X else RUN_Y)
    yield manager.calls
    _unseed()


@pytest.fixture
def output_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "outputs"
    for dag_id in TEAMS:
        (root / dag_id / DATE / "eval").mkdir(parents=True)
        (root / dag_id / DATE / "report.json").write_text(f'{{"dag": "{dag_id}"}}')
    (root / DAG_Y / DATE / "secret.txt").write_text(SECRET)
    monkeypatch.setenv("TPUFLOW_OUTPUT_ROOT", str(root))
    return root


@pytest.fixture
def airflow_api() -> FastAPI:
    """The plugin's apps mounted on an API server app as airflow.api_fastapi.app.init_plugins mounts them."""
    spec = importlib.util.spec_from_file_location("tpuflow_plugin", PLUGIN)
    assert spec and spec.loader
    plugin = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(plugin)
    api = FastAPI()
    for entry in plugin.TpuflowPlugin.fastapi_apps:
        api.mount(entry["url_prefix"], entry["app"])
    return api


def _token(role: str = "viewer", team: str = "team_x") -> str:
    from airflow.api_fastapi.app import get_auth_manager
    from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser

    return get_auth_manager().generate_jwt(SimpleAuthManagerUser(username="ana", role=role, teams=[team]))


@pytest.fixture
def ana(airflow_api: FastAPI, auth_calls: list, output_root: Path) -> TestClient:
    """Signed in as Ana (viewer, team_x), with the UI's cookie."""
    client = TestClient(airflow_api)
    client.cookies.set("_token", _token())
    return client


def _raw_get(app: FastAPI, path: str, token: str) -> tuple[int, bytes]:
    """GET with the path exactly as written ("/./" kept), as uvicorn hands `curl --path-as-is` to the app."""
    sent: list[dict[str, Any]] = []
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(b"host", b"testserver"), (b"cookie", f"_token={token}".encode())],
        "client": ("127.0.0.1", 50000),
        "server": ("testserver", 80),
        "state": {},
    }

    async def call() -> None:
        done = asyncio.Event()
        requests = [{"type": "http.request", "body": b"", "more_body": False}]

        async def receive() -> dict[str, Any]:
            if requests:
                return requests.pop()
            await done.wait()  # then the client goes away, as after any response
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)
            if message["type"] == "http.response.body" and not message.get("more_body"):
                done.set()

        await app(scope, receive, send)

    asyncio.run(call())
    status = next(m["status"] for m in sent if m["type"] == "http.response.start")
    return status, b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")


def test_a_dag_of_the_users_team_is_served_and_asked_with_its_team(ana: TestClient, auth_calls: list) -> None:
    response = ana.get(f"/tpuflow/outputs/{DAG_X}/{DATE}/report.json")
    assert response.status_code == 200 and DAG_X in response.text
    assert (DAG_X, "team_x") in auth_calls
    assert ana.get(f"/tpuflow/outputs/{DAG_X}/{DATE}").status_code == 200


def test_another_teams_outputs_are_refused(ana: TestClient, auth_calls: list) -> None:
    for path in (f"{DAG_Y}/{DATE}/secret.txt", f"{DAG_Y}/{DATE}", DAG_Y):
        response = ana.get(f"/tpuflow/outputs/{path}")
        assert response.status_code == 403, (path, response.status_code)
        assert SECRET not in response.text and "secret.txt" not in response.text
    assert auth_calls and set(auth_calls) == {(DAG_Y, "team_y")}  # asked with the DAG's team, every time
    # the same page opens for team_y's own viewer
    yara = ana.get(
        f"/tpuflow/outputs/{DAG_Y}/{DATE}/secret.txt", headers={"Authorization": f"Bearer {_token(team='team_y')}"}
    )
    assert yara.status_code == 200 and yara.text == SECRET


@pytest.mark.parametrize("dot", ["%2e", "%2E"])
def test_an_encoded_dot_dag_id_does_not_open_every_dags_folder(ana: TestClient, dot: str) -> None:
    for path in (f"{dot}/{DAG_Y}/{DATE}/secret.txt", f"{dot}/{DAG_Y}/{DATE}", dot):
        response = ana.get(f"/tpuflow/outputs/{path}")
        assert response.status_code in (400, 403, 404), (path, response.status_code)
        assert SECRET not in response.text and DAG_Y not in response.text


def test_a_literal_dot_dag_id_does_not_open_every_dags_folder(airflow_api: FastAPI, ana: TestClient) -> None:
    token = ana.cookies["_token"]
    for path in (f"/tpuflow/outputs/./{DAG_Y}/{DATE}/secret.txt", "/tpuflow/outputs/./"):
        status, body = _raw_get(airflow_api, path, token)
        assert status in (400, 403, 404), (path, status)
        assert SECRET.encode() not in body and DAG_Y.encode() not in body


@pytest.mark.parametrize("dag_id", ["not%20a%20dag", "semi;colon", "quote'd", "x" * 251])
def test_an_id_airflow_would_not_accept_is_refused_before_any_folder(
    ana: TestClient, output_root: Path, auth_calls: list, dag_id: str
) -> None:
    from urllib.parse import unquote

    folder = output_root / unquote(dag_id)
    if len(folder.name) < 250:  # a folder written under the root by anyone: no DAG's, so no DAG's access covers it
        (folder / DATE).mkdir(parents=True)
        (folder / DATE / "secret.txt").write_text(SECRET)
    response = ana.get(f"/tpuflow/outputs/{dag_id}/{DATE}/secret.txt")
    assert response.status_code == 400 and "dag_id" in response.json()["detail"]
    assert SECRET not in response.text
    assert auth_calls == []


def test_a_link_in_a_dags_folder_leads_nowhere_else(ana: TestClient, output_root: Path) -> None:
    """What a run's code writes into its own folder (a symlink) cannot expose another DAG's files."""
    run = output_root / DAG_X / DATE
    (run / "peek").symlink_to(output_root / DAG_Y)
    (run / "eval" / "stolen.txt").symlink_to(output_root / DAG_Y / DATE / "secret.txt")
    (run / "loop").symlink_to(run / "loop")
    for path in ("peek", f"peek/{DATE}/secret.txt", "eval/stolen.txt", "loop"):
        response = ana.get(f"/tpuflow/outputs/{DAG_X}/{DATE}/{path}")
        assert response.status_code == 404 and SECRET not in response.text, path
    for folder, link in ((DATE, "peek"), (f"{DATE}/eval", "stolen.txt")):
        listing = ana.get(f"/tpuflow/outputs/{DAG_X}/{folder}")
        assert listing.status_code == 200 and link not in listing.text, folder
    assert ana.get(f"/tpuflow/outputs/{DAG_X}/{DATE}/eval/%2e%2e/%2e%2e/{DATE}/report.json").status_code == 404


def test_the_ledger_lists_only_the_users_teams_runs(ana: TestClient, auth_calls: list) -> None:
    page = ana.get("/tpuflow/ledger")
    assert page.status_code == 200
    assert RUN_X in page.text
    assert RUN_Y not in page.text and DAG_Y not in page.text
    assert (DAG_X, "team_x") in auth_calls and (DAG_Y, "team_y") in auth_calls  # each DAG asked with its team
    assert (DAG_Y, None) not in auth_calls
    # team_y's viewer sees theirs
    assert RUN_Y in ana.get("/tpuflow/ledger", headers={"Authorization": f"Bearer {_token(team='team_y')}"}).text


def test_pages_need_a_login(airflow_api: FastAPI, auth_calls: list, output_root: Path) -> None:
    anonymous = TestClient(airflow_api)
    for path in ("/tpuflow/ledger", f"/tpuflow/outputs/{DAG_X}/{DATE}/report.json"):
        assert anonymous.get(path).status_code == 401, path
