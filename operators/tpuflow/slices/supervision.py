"""Which process supervises each run: one record per run, beside the slice leases.

A run's node pools, RayClusters and RayServices record their owner (its exact dag and run); whether the run is
over is then asked of the metadata DB. A run that one process drives whole (`airflow dags test`, `tpuflow demo`,
`tpuflow run`) can be killed with SIGKILL, and its DagRun then stays "running" in the DB (or there is no DB to
ask, from a plain shell): its resources keep training and billing. So the acquire task of every run records
``{"dag_id", "run_id", "date", "supervisor", "recorded_at"}`` here (tpuflow.liveness: host, boot id, pid
namespace, pid, start time), and the reaper takes every resource of a run whose recorded supervisor is provably dead, whatever the DB
says and whatever its age.

One record per run, named by its exact owner digest (tpuflow.naming.owner_run_digest), rewritten by every try:
a rerun of the same run (a new `dags test` of the date, adopting what the killed one left) re-stamps its own
process in one write, where labels on the resources would need one GKE update per node pool. A run no process
supervises (a scheduler and workers) records ``supervisor: null``: its DAG is still known to the hourly reaper,
which judges such runs by their state.

Stores: ``<lease_root>/supervisors/<digest>.json`` in a local folder or under a gs:// prefix (the leases' root:
every Airflow worker and the reaper reach it). A record says which run and which process, never where anything is.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tpuflow import liveness
from tpuflow.naming import owner_run_digest
from tpuflow.storage import gcs_client, read_text, request_timeout, split_gs_uri, write_text

FOLDER = "supervisors"
# what a record's dag_id and date may be, as Airflow's dag ids and the pipeline's date folders are: they name the
# run's folder the reaper books a killed run's chip time in, so a record naming "../x" is no record
_DAG_ID = re.compile(r"(?!\.+$)[\w.-]{1,250}")
_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")


@dataclass(frozen=True)
class RunSupervision:
    """One run's record: its exact ids, its date folder (RUN = ROOT/dag_id/date) and who supervises it."""

    dag_id: str
    run_id: str
    date: str | None
    supervisor: dict[str, Any] | None
    recorded_at: float

    @property
    def digest(self) -> str:
        return owner_run_digest(self.dag_id, self.run_id)

    def dead_reason(self) -> str | None:
        """Why its supervising process is provably dead; None while it lives, or with no supervisor."""
        return liveness.dead_reason(self.supervisor)

    def to_json(self) -> str:
        return json.dumps(
            {
                "dag_id": self.dag_id,
                "run_id": self.run_id,
                "date": self.date,
                "supervisor": self.supervisor,
                "recorded_at": self.recorded_at,
            },
            sort_keys=True,
        )


def _parse(text: str | None) -> RunSupervision | None:
    """The record a file holds; None for anything else (a file that is not a record is never acted on)."""
    try:
        raw = json.loads(text or "")
    except ValueError:
        return None
    if not isinstance(raw, dict):
        return None
    dag_id, run_id, date = raw.get("dag_id"), raw.get("run_id"), raw.get("date")
    supervisor, at = raw.get("supervisor"), raw.get("recorded_at")
    if not (isinstance(dag_id, str) and _DAG_ID.fullmatch(dag_id) and isinstance(run_id, str) and run_id):
        return None
    if date is not None and not (isinstance(date, str) and _DATE.fullmatch(date)):
        return None  # the date names the run's folder (the reaper writes there): nothing but a date is taken
    return RunSupervision(
        dag_id,
        run_id,
        date,
        supervisor if isinstance(supervisor, dict) else None,
        float(at) if isinstance(at, int | float) and not isinstance(at, bool) else 0.0,
    )


class SupervisionStore:
    """The records under ``root`` (a local folder or gs://BUCKET/PREFIX: the slice leases' root)."""

    def __init__(self, root: str, gcp_conn_id: str = "google_cloud_default") -> None:
        self.root = root.rstrip("/")
        self.gcp_conn_id = gcp_conn_id

    def describe(self) -> str:
        return f"{self.root}/{FOLDER}"

    def _uri(self, digest: str) -> str:
        return f"{self.root}/{FOLDER}/{digest}.json"

    def record(self, dag_id: str, run_id: str, date: str | None, supervisor: dict[str, Any] | None) -> RunSupervision:
        """Write (or rewrite: the newest try's process counts) the run's record."""
        entry = RunSupervision(dag_id, run_id, date, supervisor, time.time())
        write_text(self._uri(entry.digest), entry.to_json(), self.gcp_conn_id)
        return entry

    def get(self, digest: str) -> RunSupervision | None:
        entry = _parse(read_text(self._uri(digest), self.gcp_conn_id))
        return entry if entry is not None and entry.digest == digest else None

    def all(self) -> dict[str, RunSupervision]:
        """Every readable record, by run digest (a file whose name is not its record's digest is skipped)."""
        found: dict[str, RunSupervision] = {}
        for name, text in self._files():
            entry = _parse(text)
            if entry is not None and name == f"{entry.digest}.json":
                found[entry.digest] = entry
        return found

    def forget(self, digest: str) -> None:
        if self.root.startswith("gs://"):
            from google.api_core.exceptions import NotFound

            bucket, name = split_gs_uri(self._uri(digest), "lease_root")
            try:
                gcs_client(self.gcp_conn_id).bucket(bucket).blob(name).delete(timeout=request_timeout())
            except NotFound:
                pass
            return
        Path(self._uri(digest)).unlink(missing_ok=True)

    def _files(self) -> list[tuple[str, str]]:
        """(file name, text) of every file in the folder."""
        if not self.root.startswith("gs://"):
            local = Path(self.describe())
            return [(p.name, p.read_text()) for p in sorted(local.glob("*.json")) if p.is_file()]
        bucket, folder = split_gs_uri(self.describe(), "lease_root")
        prefix = f"{folder}/"
        client = gcs_client(self.gcp_conn_id)
        out = []
        for blob in client.list_blobs(bucket, prefix=prefix, timeout=request_timeout()):
            name = blob.name[len(prefix) :]
            if name.endswith(".json") and "/" not in name:
                out.append((name, blob.download_as_text(timeout=request_timeout())))
        return out


def dead_runs(store: SupervisionStore) -> dict[str, tuple[RunSupervision, str]]:
    """The runs (by digest) whose recorded supervisor is provably dead, with why."""
    out = {}
    for digest, entry in store.all().items():
        reason = entry.dead_reason()
        if reason is not None:
            out[digest] = (entry, reason)
    return out
