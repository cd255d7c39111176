"""Lease stores: N numbered slots, each claimed by one DAG run with an atomic create.

Why not an Airflow pool or max_active_runs alone: a slice is held from the cluster-start task
to the teardown, across many tasks, and a pool slot is held only while one task runs.
max_active_runs does not cover backfills either: in Airflow 3.3 a backfill has its own
max_active_runs (10 unless `--max-active-runs` is given) and its runs are counted apart
from scheduled and manual runs. A lease is taken before the cluster starts and given back
by a teardown, so every way of starting runs shares one limit.

A lease is one slice: a multi-slice run (num_slices: 2) holds two slots, taken together or not at
all (a run holding one of two slots while waiting for the other could deadlock with another).

Stores: a local folder (O_EXCL file create; the embedded default, one machine) or a gs://
prefix (object create with if_generation_match=0; Composer / Airflow on GKE with many workers).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from tpuflow.errors import UserInputError
from tpuflow.paths import tpuflow_home


@dataclass(frozen=True)
class Lease:
    slot: int
    holder: str
    acquired_at: float


class LeaseStore(Protocol):
    def holders(self, slots: int) -> dict[int, Lease]: ...

    def try_acquire(self, holder: str, slots: int, count: int = 1) -> Lease | None: ...

    def describe(self) -> str: ...

    def release(self, holder: str) -> list[int]: ...


def _record(holder: str) -> str:
    return json.dumps({"holder": holder, "acquired_at": time.time()})


def _parse(slot: int, text: str) -> Lease:
    data: dict[str, Any] = json.loads(text or "{}")
    return Lease(slot, str(data.get("holder", "")), float(data.get("acquired_at", 0.0)))


class LocalLeaseStore:
    """Slots as files `slot-<i>.json` in a folder; O_CREAT|O_EXCL makes the claim atomic."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)

    def _path(self, slot: int) -> Path:
        return self.root / f"slot-{slot}.json"

    def holders(self, slots: int) -> dict[int, Lease]:
        found = {}
        for slot in range(slots):
            try:
                found[slot] = _parse(slot, self._path(slot).read_text())
            except FileNotFoundError:
                continue
            except (OSError, ValueError):
                found[slot] = Lease(slot, "?", 0.0)  # half-written: taken
        return found

    def try_acquire(self, holder: str, slots: int, count: int = 1) -> Lease | None:
        """Have ``holder`` hold ``count`` of the ``slots`` slots; returns its first lease, or None
        (holding nothing new) when not enough are free. A retry of the same run keeps its slots."""
        self.root.mkdir(parents=True, exist_ok=True)
        held = self.holders(slots)
        mine = sorted(slot for slot, lease in held.items() if lease.holder == holder)
        free = [slot for slot in range(slots) if slot not in held]
        if len(mine) + len(free) < count:
            return None
        taken: list[int] = []
        for slot in free:
            if len(mine) + len(taken) >= count:
                break
            try:
                fd = os.open(self._path(slot), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                continue
            with os.fdopen(fd, "w") as f:
                f.write(_record(holder))
            taken.append(slot)
        if len(mine) + len(taken) < count:  # lost a race for one: give back what this call took
            for slot in taken:
                self._path(slot).unlink(missing_ok=True)
            return None
        return self.holders(slots).get(min(mine + taken))

    def release(self, holder: str) -> list[int]:
        """Free every slot this holder has, whatever the limit is now (it may have been lowered)."""
        freed = []
        for path in sorted(self.root.glob("slot-*.json")):
            slot = int(path.stem.split("-", 1)[1])
            try:
                lease = _parse(slot, path.read_text())
            except (OSError, ValueError):
                continue
            if lease.holder == holder:
                path.unlink(missing_ok=True)
                freed.append(slot)
        return freed

    def describe(self) -> str:
        return str(self.root)


class GcsLeaseStore:
    """Slots as objects `<prefix>/slot-<i>.json`; creating with if_generation_match=0 is atomic."""

    def __init__(self, uri: str, gcp_conn_id: str = "google_cloud_default") -> None:
        from tpuflow.storage import split_gs_uri

        bucket, prefix = split_gs_uri(uri, "lease_root")
        self.bucket_name, self.prefix, self.gcp_conn_id = bucket, prefix, gcp_conn_id

    def _bucket(self) -> Any:
        from tpuflow.storage import gcs_client  # GCSHook's client, or the emulator's (STORAGE_EMULATOR_HOST)

        return gcs_client(self.gcp_conn_id).bucket(self.bucket_name)

    def _name(self, slot: int) -> str:
        return f"{self.prefix}/slot-{slot}.json" if self.prefix else f"slot-{slot}.json"

    def holders(self, slots: int) -> dict[int, Lease]:
        from google.api_core.exceptions import NotFound

        bucket, found = self._bucket(), {}
        for slot in range(slots):
            try:
                found[slot] = _parse(slot, bucket.blob(self._name(slot)).download_as_text())
            except NotFound:
                continue
        return found

    def try_acquire(self, holder: str, slots: int, count: int = 1) -> Lease | None:
        """As LocalLeaseStore.try_acquire: ``count`` slots for ``holder``, all or none."""
        from google.api_core.exceptions import PreconditionFailed

        held = self.holders(slots)
        mine = sorted(slot for slot, lease in held.items() if lease.holder == holder)
        free = [slot for slot in range(slots) if slot not in held]
        if len(mine) + len(free) < count:
            return None
        bucket = self._bucket()
        taken: list[int] = []
        for slot in free:
            if len(mine) + len(taken) >= count:
                break
            try:
                # With a generation precondition the client retries transient errors by itself
                # (DEFAULT_RETRY_IF_GENERATION_SPECIFIED).
                bucket.blob(self._name(slot)).upload_from_string(
                    _record(holder), content_type="application/json", if_generation_match=0
                )
            except PreconditionFailed:
                # Taken -- possibly by this very call, when a retried create had already succeeded.
                again = self.holders(slot + 1).get(slot)
                if again is not None and again.holder == holder:
                    taken.append(slot)
                continue
            taken.append(slot)
        if len(mine) + len(taken) < count:
            for slot in taken:
                bucket.blob(self._name(slot)).delete()
            return None
        first = min(mine + taken)
        return held[first] if first in held else Lease(first, holder, time.time())

    def release(self, holder: str) -> list[int]:
        bucket, freed = self._bucket(), []
        for blob in bucket.client.list_blobs(self.bucket_name, prefix=self._name(0).rsplit("slot-", 1)[0] + "slot-"):
            slot = int(blob.name.rsplit("slot-", 1)[1].split(".", 1)[0])
            if _parse(slot, blob.download_as_text()).holder == holder:
                blob.delete()
                freed.append(slot)
        return freed

    def describe(self) -> str:
        return f"gs://{self.bucket_name}/{self.prefix}"


def default_lease_root() -> str:
    """$TPUFLOW_SLICE_LEASES, else slice-leases/ beside the local clusters under tpuflow_home()."""
    return os.environ.get("TPUFLOW_SLICE_LEASES") or str(tpuflow_home() / "slice-leases")


def check_lease_root(root: object) -> str | None:
    """A local folder or gs://bucket/prefix; None or empty: the default (default_lease_root)."""
    if root is None or root == "":
        return None
    if not isinstance(root, str) or ("://" in root and not root.startswith("gs://")):
        raise UserInputError("lease_root", root, "give a local folder or a gs://bucket/prefix")
    if root.startswith("gs://") and not root[len("gs://") :].split("/", 1)[0]:
        raise UserInputError("lease_root", root, "name the bucket: gs://BUCKET/PREFIX")
    if root.startswith("gs://"):
        from tpuflow.storage import split_gs_uri

        split_gs_uri(root, "lease_root")
    return root


def lease_store(root: str | None, gcp_conn_id: str = "google_cloud_default") -> LeaseStore:
    root = check_lease_root(root) or default_lease_root()
    if root.startswith("gs://"):
        return GcsLeaseStore(root, gcp_conn_id)
    return LocalLeaseStore(root)


def parse_count(value: int | str, slots: int) -> int:
    """How many slices one run needs (its num_slices): 1 to ``slots``; more can never be granted."""
    try:
        count = int(value)
    except (TypeError, ValueError):
        count = 0
    if count < 1:
        raise UserInputError("num_slices", value, "give a whole number of slices >= 1")
    if count > slots:
        raise UserInputError(
            "num_slices",
            value,
            f"the slice leases allow {slots} slice(s) at once (max_slices, e.g. the Variable tpuflow_max_slices); "
            f"ask for at most {slots} or raise the limit",
        )
    return count


def parse_slots(value: int | str) -> int:
    try:
        slots = int(value)
    except (TypeError, ValueError):
        slots = 0
    if slots < 1:
        raise UserInputError("max_slices", value, "give a whole number of slices >= 1")
    return slots
