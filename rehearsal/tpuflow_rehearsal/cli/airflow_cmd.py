"""`tpuflow airflow up|status|down|env`: a real local Airflow (api-server, scheduler, dag-processor, triggerer)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from tpuflow.errors import UserInputError
from tpuflow.validation import check_count, check_folder, check_port
from tpuflow_rehearsal.supervise import Supervisor

if TYPE_CHECKING:
    from tpuflow_rehearsal.airflow_services import AirflowServices


def _work_dir(args: argparse.Namespace) -> Path:
    from tpuflow_rehearsal.airflow_services import DEFAULT_WORK_DIR

    check_folder("--work-dir", args.work_dir)
    return Path(args.work_dir).resolve() if args.work_dir else DEFAULT_WORK_DIR


def _load(args: argparse.Namespace) -> AirflowServices | None:
    from tpuflow_rehearsal.airflow_services import STATE_FILE, AirflowServices

    work = _work_dir(args)
    return AirflowServices.load(work) if (work / STATE_FILE).exists() else None


def _stop_if_ours(work: Path, before: str | None) -> list[str]:
    """Teardown of an interrupted `up`: stop the services of the deployment this `up` recorded (its state file
    changed), never one that was running before it."""
    from tpuflow_rehearsal.airflow_services import STATE_FILE, AirflowServices

    path = work / STATE_FILE
    if not path.exists() or path.read_text() == before:
        return []
    stopped = AirflowServices.load(work).stop()
    return [f"stopped the Airflow services it started ({', '.join(stopped)})"] if stopped else []


def _up(args: argparse.Namespace) -> int:
    from tpuflow_rehearsal.airflow_services import STATE_FILE

    work = _work_dir(args)
    before = (work / STATE_FILE).read_text() if (work / STATE_FILE).exists() else None
    with Supervisor("tpuflow airflow up") as sup:  # SIGINT/SIGTERM while starting: stop what started, exit 130/143
        sup.add_teardown(lambda: _stop_if_ours(work, before))
        return _start(args)


def _start(args: argparse.Namespace) -> int:
    from tpuflow_rehearsal.airflow_services import ADMIN_USER, DEFAULT_WORK_DIR, AirflowServices, AirflowServicesError

    if args.port is not None:
        check_port("--port", args.port)
    check_count("--parallelism", args.parallelism, minimum=1, maximum=256)
    if args.database_url is not None and "://" not in args.database_url:
        raise UserInputError(
            "--database-url", args.database_url, "give a SQLAlchemy URL, e.g. postgresql+psycopg2://USER:PASS@HOST/DB"
        )
    work = _work_dir(args)
    print(f"Starting a local Airflow in {work} (fresh AIRFLOW_HOME, LocalExecutor, 127.0.0.1 only)...", file=sys.stderr)
    try:
        services = AirflowServices.start(
            work,
            port=args.port,
            parallelism=args.parallelism,
            use_schedule=not args.no_schedule,
            unpause=args.unpause,
            database_url=args.database_url,
        )
    except AirflowServicesError as err:
        print(f"tpuflow airflow up: {err}", file=sys.stderr)
        return 1
    try:
        dags = services.wait_for_dags([])
    except AirflowServicesError as err:
        print(f"tpuflow airflow up: running, but {err}", file=sys.stderr)
        dags = []
    print(f"Airflow UI:   {services.url}   ({len(dags)} DAGs: {', '.join(sorted(d['dag_id'] for d in dags))})")
    print(f"login:        {ADMIN_USER} / {services.password}")
    print(f"outputs:      {services.output_root}")
    print(f"logs:         {work / 'logs'} (services), {services.home / 'logs'} (tasks)")
    where = "" if work == DEFAULT_WORK_DIR else f" --work-dir {work}"
    print(f'CLI:          eval "$(tpuflow airflow env{where})"; airflow dags list')
    print(f"stop:         tpuflow airflow down{where}")
    if not args.unpause:
        print("DAGs start paused: unpause one in the UI to let its schedule run; a manual trigger runs it once.")
    return 0


def _status(args: argparse.Namespace) -> int:
    from tpuflow_rehearsal.airflow_services import ADMIN_USER

    services = _load(args)
    if services is None:
        print(f"no local Airflow under {_work_dir(args)}")
        return 1
    alive = services.alive_services()
    if not alive:
        print(f"local Airflow in {services.work_dir}: stopped")
        return 1
    down = [s for s in services.pids if s not in alive]
    print(
        f"local Airflow at {services.url}: running {', '.join(alive)}" + (f"; DEAD: {', '.join(down)}" if down else "")
    )
    print(f"login: {ADMIN_USER} / {services.password}")
    return 0 if not down else 1


def _down(args: argparse.Namespace) -> int:
    services = _load(args)
    if services is None or not services.pids:
        print("nothing to stop")
        return 0
    stopped = services.stop()
    print(f"stopped {', '.join(stopped) or 'nothing (already gone)'} (process groups of {services.work_dir})")
    print(
        "Local Ray clusters a run kept (keep_endpoint) are not touched: `tpuflow local status` / `tpuflow local down`."
    )
    return 0


def _env(args: argparse.Namespace) -> int:
    services = _load(args)
    if services is None:
        print(f"no local Airflow under {_work_dir(args)}", file=sys.stderr)
        return 1
    print(services.shell_exports())
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser(
        "airflow", help="run a real local Airflow (scheduler, triggerer, UI) with the project's DAGs"
    )
    verbs = parser.add_subparsers(dest="verb", required=True)

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--work-dir", default=None, help="AIRFLOW_HOME, logs, outputs (default .tpuflow/airflow-services)"
        )

    up = verbs.add_parser("up", help="start api-server, scheduler, dag-processor and triggerer (a fresh AIRFLOW_HOME)")
    common(up)
    up.add_argument("--port", type=int, default=None, help="API server / UI port on 127.0.0.1 (default: a free one)")
    up.add_argument(
        "--parallelism", type=int, default=4, help="task slots of the LocalExecutor (default 4 for 2 cores)"
    )
    up.add_argument(
        "--no-schedule", action="store_true", help="scheduler ignores schedules: only manual runs and backfills"
    )
    up.add_argument("--unpause", action="store_true", help="DAGs start unpaused (scheduled runs begin at once)")
    up.add_argument("--database-url", default=None, help="SQLAlchemy URL of an existing PostgreSQL (default SQLite)")
    up.set_defaults(func=_up)
    status = verbs.add_parser("status", help="is it running, where, and the login")
    common(status)
    status.set_defaults(func=_status)
    down = verbs.add_parser("down", help="stop exactly the process groups `up` started")
    common(down)
    down.set_defaults(func=_down)
    env = verbs.add_parser("env", help="print exports to use the `airflow` CLI against it")
    common(env)
    env.set_defaults(func=_env)
