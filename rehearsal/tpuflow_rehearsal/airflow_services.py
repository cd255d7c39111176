"""A real local Airflow for this project: api-server, scheduler, dag-processor and triggerer.

Unlike `airflow dags test` (which runs triggers inside its own process), these are the four
separate services of a deployment: deferred tasks really go to the triggerer, which imports
their triggers from the installed package, and task workers talk to the API server's
execution API. Everything lives in a throw-away AIRFLOW_HOME under `work_dir`, binds
127.0.0.1 only, and each service runs in its own process group so `stop` signals exactly
the processes it started (never `pkill airflow`).

Database: SQLite. Airflow 3.3 runs LocalExecutor on SQLite with real parallelism (task
processes report through the API server, so only four services write to the DB; Airflow
retries SQLITE_BUSY) -- the SequentialExecutor restriction of Airflow 2 is gone. A
deployment uses PostgreSQL (Cloud Composer, the Helm chart); `database_url` takes one.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import requests

from tpuflow import liveness
from tpuflow.local.cluster import (  # one process-group logic for all local services
    _has_env,
    _owned_alive,
    _owned_targets,
    _signal_owned,
    free_port,
)
from tpuflow.paths import output_root
from tpuflow.secret_files import write_secret_file

REPO = Path(__file__).resolve().parents[2]
DEFAULT_WORK_DIR = REPO / ".tpuflow" / "airflow-services"
STATE_FILE = "services.json"
SERVICES = ("api-server", "scheduler", "dag-processor", "triggerer")
# The scheduler and triggerer would each start a log server on [::]:8793 / [::]:8794 (every
# interface, fixed ports). Everything runs on this machine, so the API server reads task and
# trigger logs from the files directly: no log servers, nothing listening beyond the API port.
SERVICE_ARGS = {"scheduler": ["--skip-serve-logs"], "triggerer": ["--skip-serve-logs"]}
ADMIN_USER = "admin"
# Plain users (Airflow's "user" role: trigger runs, answer approvals, write XComs; no Variables or Connections), as
# a shared Airflow has them: who triggers a run is not who wrote the DAG or may approve its budget.
PLAIN_USERS = ("requester", "approver")
# 2 cores: a few task slots is plenty -- the pipeline's tasks mostly defer to the triggerer
# while Ray does the work in its own processes.
DEFAULT_PARALLELISM = 4
logger = logging.getLogger(__name__)


# SQLite allows one writer at a time (Airflow turns on WAL, so readers never wait). Python's
# default busy timeout is 5 s: on a loaded 2-core machine a scheduler transaction can hold the
# write lock longer, and `airflow backfill create` then failed with "database is locked".
SQLITE_CONNECT_ARGS: dict[str, Any] = {"timeout": 60}
SQLITE_CONNECT_ARGS_ASYNC: dict[str, Any] = {"timeout": 60}


class AirflowServicesError(RuntimeError):
    """The local Airflow could not be started, reached or stopped."""


@dataclass
class AirflowServices:
    """A started (or stopped) local Airflow; its state lives in `work_dir/services.json`."""

    work_dir: str
    port: int
    password: str
    env: dict[str, str]
    users: dict[str, str] = field(default_factory=dict)  # plain user -> password
    pids: dict[str, int] = field(default_factory=dict)  # service -> process group id
    # service -> tpuflow.liveness record of its leader (pid + start time): what proves a recorded pid still the
    # service's own; the environment cannot, Airflow's setproctitle overwrites /proc/<pid>/environ
    started: dict[str, dict[str, Any]] = field(default_factory=dict)

    # --- paths and addresses -----------------------------------------------------
    @property
    def home(self) -> Path:
        return Path(self.work_dir) / "home"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def output_root(self) -> str:
        """Where the services' runs write outputs (tpuflow.paths.output_root in their environment)."""

        return output_root(self.process_env())

    def log_path(self, service: str) -> Path:
        return Path(self.work_dir) / "logs" / f"{service}.log"

    # --- lifecycle -----------------------------------------------------------------
    @classmethod
    def start(
        cls,
        work_dir: Path | str | None = None,
        *,
        port: int | None = None,
        parallelism: int = DEFAULT_PARALLELISM,
        use_schedule: bool = True,
        unpause: bool = False,
        database_url: str | None = None,
        extra_env: dict[str, str] | None = None,
        timeout: float = 240.0,
    ) -> AirflowServices:
        """Create a fresh AIRFLOW_HOME, migrate its DB, start the four services, wait for health."""
        work = Path(work_dir or DEFAULT_WORK_DIR).resolve()
        if (work / STATE_FILE).exists():
            old = cls.load(work)
            if old.alive_services():
                raise AirflowServicesError(
                    f"a local Airflow from {work} is still running at {old.url}; stop it first (`tpuflow airflow down`)"
                )
        # A fresh Airflow home and logs every time; outputs (when kept under work_dir) survive.
        for stale in ("home", "logs"):
            shutil.rmtree(work / stale, ignore_errors=True)
        (work / "logs").mkdir(parents=True)
        services = cls(
            work_dir=str(work),
            port=port or free_port(),
            password=secrets.token_urlsafe(12),
            env={},
            users={name: secrets.token_urlsafe(12) for name in PLAIN_USERS},
        )
        services.home.mkdir()
        passwords = {ADMIN_USER: services.password, **services.users}
        write_secret_file(services.home / "passwords.json", json.dumps(passwords) + "\n")
        services.env = services.build_env(parallelism, use_schedule, unpause, database_url, extra_env or {})
        services.save()
        services.airflow("db", "migrate", timeout=timeout)
        try:
            for name in SERVICES:
                services.pids[name] = services._spawn(name)
                services.started[name] = liveness.process_record(services.pids[name])
                services.save()
            services.wait_healthy(timeout)
        except BaseException:
            services.stop()
            raise
        return services

    def build_env(
        self,
        parallelism: int,
        use_schedule: bool,
        unpause: bool,
        database_url: str | None,
        extra: dict[str, str],
    ) -> dict[str, str]:
        """The AIRFLOW__* settings every service (and a user's `airflow` CLI) shares."""
        home = self.home
        venv_bin = str(Path(sys.executable).parent)
        env = {
            "AIRFLOW_HOME": str(home),
            "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags"),
            "AIRFLOW__CORE__PLUGINS_FOLDER": str(REPO / "plugins"),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
            "AIRFLOW__CORE__PARALLELISM": str(parallelism),
            "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False" if unpause else "True",
            "AIRFLOW__CORE__FERNET_KEY": _fernet_key(),
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": ",".join(
                [f"{ADMIN_USER}:admin", *(f"{name}:user" for name in PLAIN_USERS)]
            ),
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(home / "passwords.json"),
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{self.url}/execution/",
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": database_url or f"sqlite:///{home}/airflow.db",
            "AIRFLOW__API__HOST": "127.0.0.1",
            "AIRFLOW__API__PORT": str(self.port),
            "AIRFLOW__API__BASE_URL": self.url,
            "AIRFLOW__API__WORKERS": "1",
            # Every service must sign and verify task tokens with the same secret.
            "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_urlsafe(32),
            "AIRFLOW__DAG_PROCESSOR__PARSING_PROCESSES": "1",
            "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "30",
            "AIRFLOW__SCHEDULER__USE_JOB_SCHEDULE": str(use_schedule),
            "AIRFLOW__LOGGING__BASE_LOG_FOLDER": str(home / "logs"),
            # Children run `airflow ...` (task supervisors, LocalExecutor workers): the venv first.
            "PATH": f"{venv_bin}{os.pathsep}{os.environ.get('PATH', '')}",
        }
        if env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"].startswith("sqlite"):
            env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONNECT_ARGS"] = f"{__name__}.SQLITE_CONNECT_ARGS"
            env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONNECT_ARGS_ASYNC"] = f"{__name__}.SQLITE_CONNECT_ARGS_ASYNC"
        env.update(extra)
        return env

    def process_env(self) -> dict[str, str]:
        return {**os.environ, **self.env}

    def airflow(self, *args: str, timeout: float = 300.0, check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run an `airflow` CLI command against this deployment's home and database."""
        proc = subprocess.run(
            [_airflow_bin(), *args], env=self.process_env(), capture_output=True, text=True, timeout=timeout
        )
        if check and proc.returncode != 0:
            raise AirflowServicesError(f"`airflow {' '.join(args)}` failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
        return proc

    def _spawn(self, service: str) -> int:
        log = open(self.log_path(service), "ab")  # noqa: SIM115 -- handed to the child
        try:
            proc = subprocess.Popen(
                [_airflow_bin(), service, *SERVICE_ARGS.get(service, [])],
                env=self.process_env(),
                cwd=self.work_dir,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: stop() signals exactly it
            )
        finally:
            log.close()
        return proc.pid

    def wait_healthy(self, timeout: float) -> dict[str, Any]:
        """Until /api/v2/monitor/health reports scheduler, triggerer and dag processor healthy."""
        deadline = time.time() + timeout
        last: Any = "no answer"
        while time.time() < deadline:
            dead = [s for s, pid in self.pids.items() if not _owned_alive([pid], self._owned)]
            if dead:
                raise AirflowServicesError(f"airflow {dead[0]} exited while starting:\n{_tail(self.log_path(dead[0]))}")
            try:
                resp = requests.get(f"{self.url}/api/v2/monitor/health", timeout=5)
                last = resp.json() if resp.ok else f"{resp.status_code} {resp.text[:200]}"
                if isinstance(last, dict) and all(
                    (last.get(part) or {}).get("status") == "healthy"
                    for part in ("metadatabase", "scheduler", "triggerer", "dag_processor")
                ):
                    return last
            except (requests.RequestException, ValueError) as err:
                last = str(err)
            time.sleep(1)
        raise AirflowServicesError(f"local Airflow not healthy after {timeout:.0f}s: {last}")

    def wait_for_dags(self, dag_ids: list[str], timeout: float = 180.0) -> list[dict[str, Any]]:
        """Until the dag-processor has parsed these DAGs (health comes first); an import error fails at once."""
        api = self.api()
        deadline = time.time() + timeout
        while True:
            errors = api.get("/importErrors").json().get("import_errors", [])
            if errors:
                raise AirflowServicesError(
                    "DAG import errors:\n"
                    + "\n".join(f"{e.get('filename')}: {str(e.get('stack_trace', ''))[-1500:]}" for e in errors)
                )
            dags = api.get("/dags", params={"limit": 1000}).json().get("dags", [])
            if set(dag_ids) <= {d["dag_id"] for d in dags} and (dag_ids or dags):
                return list(dags)
            if time.time() > deadline:
                raise AirflowServicesError(f"DAGs {dag_ids or '(any)'} not parsed after {timeout:.0f}s")
            time.sleep(2)

    def alive_services(self) -> list[str]:
        return [name for name, pid in self.pids.items() if _owned_alive([pid], self._owned)]

    def _owned(self, pid: int) -> bool:
        """Whether `pid` is one of this deployment's processes (a pid from services.json may be anyone's after a
        reboot or pid wrap): a service leader is the process recorded at its spawn (same pid and start time);
        anything else must carry this deployment's AIRFLOW_HOME, which every service passes to what it starts."""
        record = next((r for r in self.started.values() if r.get("pid") == pid), None)
        if record is not None:
            return liveness.same_process(record, liveness.process_record(pid))
        return _has_env(pid, "AIRFLOW_HOME", self.env.get("AIRFLOW_HOME") or str(self.home))

    def stop(self, timeout: float = 30.0) -> list[str]:
        """SIGTERM each service's process group, SIGKILL what is left after `timeout`; only processes of this
        deployment (_owned) are signalled, a recorded pid that is now another process's counts as gone."""
        stopped = _stop_groups(self.pids, self._owned, timeout)
        self.pids, self.started = {}, {}
        self.save()
        return stopped

    def restart(self, service: str, timeout: float = 240.0) -> None:
        """Stop one service and start it again (what a pod or VM restart does to it); waits for health."""
        if service not in SERVICES:
            raise AirflowServicesError(f"unknown service {service!r}; one of {', '.join(SERVICES)}")
        _stop_groups({service: self.pids.pop(service)} if service in self.pids else {}, self._owned, 30.0)
        self.pids[service] = self._spawn(service)
        self.started[service] = liveness.process_record(self.pids[service])
        self.save()
        self.wait_healthy(timeout)

    # --- state ---------------------------------------------------------------------
    def save(self) -> None:
        # Holds the admin password and the services' secrets: 0600 from its first byte, replaced atomically.
        write_secret_file(Path(self.work_dir) / STATE_FILE, json.dumps(asdict(self), indent=2))

    @classmethod
    def load(cls, work_dir: Path | str | None = None) -> AirflowServices:
        path = Path(work_dir or DEFAULT_WORK_DIR) / STATE_FILE
        return cls(**json.loads(path.read_text()))

    # --- REST API ------------------------------------------------------------------
    def token(self, user: str = ADMIN_USER) -> str:
        """A JWT for ``user``: the admin, or one of the plain users (PLAIN_USERS)."""
        password = self.password if user == ADMIN_USER else self.users[user]
        resp = requests.post(f"{self.url}/auth/token", json={"username": user, "password": password}, timeout=30)
        resp.raise_for_status()
        return str(resp.json()["access_token"])

    def api(self, user: str = ADMIN_USER) -> requests.Session:
        """A requests session authenticated as ``user`` (default the admin); paths are relative to /api/v2."""
        session = _BaseUrlSession(f"{self.url}/api/v2")
        session.headers["Authorization"] = f"Bearer {self.token(user)}"
        return session

    def shell_exports(self) -> str:
        keys = [k for k in self.env if k.startswith(("AIRFLOW", "TPUFLOW"))]
        return "\n".join(f"export {k}={_shell_quote(self.env[k])}" for k in sorted(keys))


class _BaseUrlSession(requests.Session):
    def __init__(self, base: str) -> None:
        super().__init__()
        self.base = base.rstrip("/")

    def request(self, method: str, url: str | bytes, *args: Any, **kwargs: Any) -> requests.Response:
        url = url.decode() if isinstance(url, bytes) else url
        if url.startswith("/"):
            url = self.base + url
        kwargs.setdefault("timeout", 30)
        return super().request(method, url, *args, **kwargs)


def _stop_groups(pids: dict[str, int], owned: Callable[[int], bool], timeout: float) -> list[str]:
    """SIGTERM the process groups, SIGKILL what is left after `timeout`; returns the names signalled.
    Only what `owned` proves ours is signalled (tpuflow.local.cluster._signal_owned)."""
    groups = list(pids.values())
    for pid in _owned_targets(groups, owned)[2]:
        logger.info(
            "pid %d of services.json is no longer this Airflow's (not its AIRFLOW_HOME): not signalling it", pid
        )
    stopped = [name for name, pgid in pids.items() if _signal_owned([pgid], owned, signal.SIGTERM)]
    deadline = time.time() + timeout
    while time.time() < deadline and _owned_alive(groups, owned):
        time.sleep(0.5)
    _signal_owned(groups, owned, signal.SIGKILL)
    return stopped


def _airflow_bin() -> str:
    candidate = Path(sys.executable).with_name("airflow")
    return str(candidate) if candidate.exists() else "airflow"


def _fernet_key() -> str:

    return base64.urlsafe_b64encode(secrets.token_bytes(32)).decode()


def _tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return f"(no log at {path})"


def _shell_quote(value: str) -> str:

    return shlex.quote(value)
