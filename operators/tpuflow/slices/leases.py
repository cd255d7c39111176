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

A lease names its holder's liveness: the run (``DAG_ID/RUN_ID``), the record of the process that
supervises it (tpuflow.liveness: host, boot id, pid namespace, pid, start time; none under a scheduler, where
the run's state decides) and, in a gs:// store, ``expires_at`` (LEASE_TTL_S after the holder last took or
retried it, or a waiter or the reaper saw its run still running). A waiter takes over a lease whose supervisor
is provably dead, or which is past ``expires_at`` and whose run is not known to be running.

Slots are numbered 0 to MAX_LEASE_SLOTS - 1 (1024); a larger ``max_slices`` is refused before anything
starts. A file in the lease folder that is not a lease (another name, unparsable JSON) is ignored.
"""

from __future__ import annotations

import json
import os
import re
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from tpuflow import liveness
from tpuflow.errors import UserInputError
from tpuflow.paths import tpuflow_home
from tpuflow.storage import gcs_client, request_timeout, split_gs_uri

MAX_LEASE_SLOTS = 1024
# How long a gs:// lease lives unless its run takes it again (a retry, the next acquire): a run killed
# where no process can be checked (another host, a deleted pod) frees its slice after this at the latest.
LEASE_TTL_S = float(os.environ.get("TPUFLOW_LEASE_TTL_S", 24 * 3600))
UNREADABLE = "?"  # the holder of a slot file that is no lease record
_SLOT_RE = re.compile(r"^slot-(\d+)\.json$")


@dataclass(frozen=True)
class Lease:
    slot: int
    holder: str
    acquired_at: float
    supervisor: dict[str, Any] | None = None
    expires_at: float | None = None

    def holder_line(self) -> str:
        """``DAG/RUN (pid N on host H)``: the run and, when one supervises it, its process."""
        return f"{self.holder} ({liveness.describe(self.supervisor)})" if self.supervisor else self.holder

    def dead_reason(self, now: float | None = None) -> str | None:
        """Why this lease's holder can no longer use it (its supervisor provably dead, or past its expiry);
        None while it may."""
        reason = liveness.dead_reason(self.supervisor)
        if reason is not None:
            return f"its supervisor {reason}"
        now = time.time() if now is None else now
        if self.expires_at is not None and self.expires_at < now and self.holder == UNREADABLE:
            return "its file holds no lease record"
        if self.expires_at is not None and self.expires_at < now:
            stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(self.expires_at))
            return f"past its expiry ({stamp} UTC; not renewed)"
        return None


class LeaseStore(Protocol):
    def holders(self, slots: int) -> dict[int, Lease]: ...

    def all_holders(self) -> dict[int, Lease]: ...

    def try_acquire(self, holder: str, slots: int, count: int = 1) -> Lease | None: ...

    def take_over_dead(self, slots: int, holder: str) -> list[tuple[Lease, str]]: ...

    def describe(self) -> str: ...

    def release(self, holder: str) -> list[int]: ...

    def renew(self, holder: str, slots: int) -> list[int]: ...


def slot_of(name: str) -> int | None:
    """The slot a lease file's name holds (``slot-<i>.json``, i < MAX_LEASE_SLOTS), else None: not a lease."""
    match = _SLOT_RE.match(name.rsplit("/", 1)[-1])
    slot = int(match.group(1)) if match else None
    return slot if slot is not None and slot < MAX_LEASE_SLOTS else None


_THIS_PROCESS = object()  # _record's default supervisor: the process writing the record


def _record(
    holder: str,
    expires_at: float | None = None,
    acquired_at: float | None = None,
    supervisor: dict[str, Any] | None | object = _THIS_PROCESS,
) -> str:
    """A lease file's text; ``supervisor``: the holder's (kept on a renewal), default this process's."""
    record: dict[str, Any] = {
        "holder": holder,
        "acquired_at": time.time() if acquired_at is None else acquired_at,
        "supervisor": liveness.supervisor_record() if supervisor is _THIS_PROCESS else supervisor,
    }
    if expires_at is not None:
        record["expires_at"] = expires_at
    return json.dumps(record)


def _parse(slot: int, text: str) -> Lease:
    """The lease a file holds; ValueError when it is no lease record (an empty text: one being written)."""
    data: Any = json.loads(text or "{}")
    if not isinstance(data, dict):
        raise ValueError(f"slot {slot}: not a lease record")
    supervisor = data.get("supervisor")
    expires = data.get("expires_at")
    return Lease(
        slot,
        str(data.get("holder", "")),
        float(data.get("acquired_at", 0.0)),
        supervisor if isinstance(supervisor, dict) else None,
        float(expires) if isinstance(expires, (int, float)) and not isinstance(expires, bool) else None,
    )


def _unreadable(slot: int, path: Path) -> Lease:
    """A slot file that holds no lease record: taken, and free to take over a minute after its last write
    (a claim writes its record right after creating the file)."""
    try:
        written = path.stat().st_mtime
    except OSError:
        written = time.time()
    return Lease(slot, UNREADABLE, written, expires_at=written + 60.0)


def _dead(held: dict[int, Lease], holder: str, now: float) -> dict[int, str]:
    """The slots of ``held`` (not ``holder``'s) whose holder can no longer use them, with why."""
    out = {}
    for slot, lease in held.items():
        reason = None if lease.holder == holder else lease.dead_reason(now)
        if reason is not None:
            out[slot] = reason
    return out


class LocalLeaseStore:
    """Slots as files `slot-<i>.json` in a folder; O_CREAT|O_EXCL makes the claim atomic."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)

    def _path(self, slot: int) -> Path:
        return self.root / f"slot-{slot}.json"

    def _read(self, slot: int) -> Lease | None:
        try:
            text = self._path(slot).read_text()
        except FileNotFoundError:
            return None
        except OSError:
            return _unreadable(slot, self._path(slot))
        try:
            # empty: being written right now, or left so by a claim killed half-way (taken over after a minute)
            return _parse(slot, text) if text.strip() else _unreadable(slot, self._path(slot))
        except ValueError:
            return _unreadable(slot, self._path(slot))

    def holders(self, slots: int) -> dict[int, Lease]:
        found = {}
        for slot in range(min(slots, MAX_LEASE_SLOTS)):
            lease = self._read(slot)
            if lease is not None:
                found[slot] = lease
        return found

    def all_holders(self) -> dict[int, Lease]:
        """Every lease in the folder, whatever the limit is now (it may have been lowered)."""
        found = {}
        for path in self.root.glob("slot-*.json"):
            slot = slot_of(path.name)
            lease = None if slot is None else self._read(slot)
            if lease is not None:
                found[lease.slot] = lease
        return dict(sorted(found.items()))

    def renew(self, holder: str, slots: int) -> list[int]:
        """Nothing to renew: a local lease has no expiry (its supervisor's liveness decides)."""
        return []

    def take_over_dead(self, slots: int, holder: str) -> list[tuple[Lease, str]]:
        """Free the slots (of the first ``slots``) whose holder is provably dead or expired, for ``holder``
        to claim; returns what was freed and why. A lease taken meanwhile by a live run is put back."""
        taken = []
        for slot, reason in _dead(self.holders(slots), holder, time.time()).items():
            lease = self._read(slot)
            if lease is None or lease.dead_reason() is None:
                continue
            if self._remove_if(slot, lease):
                taken.append((lease, reason))
        return taken

    def _remove_if(self, slot: int, lease: Lease) -> bool:
        """Remove the slot's file if it still holds ``lease``: moved aside first (atomic), so a lease
        another waiter created in between is never deleted but put back."""
        aside = self.root / f".takeover-{slot}-{uuid.uuid4().hex}"
        try:
            os.rename(self._path(slot), aside)
        except FileNotFoundError:
            return False
        try:
            same = _parse(slot, aside.read_text()) == lease
        except (OSError, ValueError):
            same = False
        if not same:
            try:
                os.link(aside, self._path(slot))  # fails if the slot was claimed again meanwhile
            except FileExistsError:
                pass
        aside.unlink(missing_ok=True)
        return same

    def try_acquire(self, holder: str, slots: int, count: int = 1) -> Lease | None:
        """Have ``holder`` hold ``count`` of the ``slots`` slots; returns its first lease, or None
        (holding nothing new) when not enough are free. A retry of the same run keeps its slots."""
        self.root.mkdir(parents=True, exist_ok=True)
        held = self.holders(slots)
        mine = sorted(slot for slot, lease in held.items() if lease.holder == holder)
        free = [slot for slot in range(min(slots, MAX_LEASE_SLOTS)) if slot not in held]
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
        for slot, lease in self.all_holders().items():
            if lease.holder == holder:
                self._path(slot).unlink(missing_ok=True)
                freed.append(slot)
        return freed

    def describe(self) -> str:
        return str(self.root)


class GcsLeaseStore:
    """Slots as objects `<prefix>/slot-<i>.json`; creating with if_generation_match=0 is atomic. Each lease
    expires LEASE_TTL_S after its run last took it (a retry or a new acquire renews it)."""

    def __init__(self, uri: str, gcp_conn_id: str = "google_cloud_default") -> None:

        bucket, prefix = split_gs_uri(uri, "lease_root")
        self.bucket_name, self.prefix, self.gcp_conn_id = bucket, prefix, gcp_conn_id

    def _bucket(self) -> Any:

        return gcs_client(self.gcp_conn_id).bucket(self.bucket_name)

    def _name(self, slot: int) -> str:
        return f"{self.prefix}/slot-{slot}.json" if self.prefix else f"slot-{slot}.json"

    def _read(self, bucket: Any, slot: int) -> tuple[Lease, int] | None:
        """The slot's lease and its object generation; None when the slot is free."""
        blob = bucket.get_blob(self._name(slot), timeout=request_timeout())
        if blob is None:
            return None
        try:
            return _parse(slot, blob.download_as_text(timeout=request_timeout())), int(blob.generation or 0)
        except ValueError:
            return Lease(slot, "?", 0.0), int(blob.generation or 0)

    def holders(self, slots: int) -> dict[int, Lease]:
        from google.api_core.exceptions import NotFound

        bucket, found = self._bucket(), {}
        for slot in range(min(slots, MAX_LEASE_SLOTS)):
            try:
                found[slot] = _parse(slot, bucket.blob(self._name(slot)).download_as_text(timeout=request_timeout()))
            except NotFound:
                continue
            except ValueError:
                found[slot] = Lease(slot, "?", 0.0)
        return found

    def _listed(self, bucket: Any) -> list[tuple[int, Any]]:
        """(slot, blob) of every lease object under the prefix; other objects are not leases."""
        prefix = self._name(0).rsplit("slot-", 1)[0]
        found = []
        for blob in bucket.client.list_blobs(self.bucket_name, prefix=prefix + "slot-", timeout=request_timeout()):
            slot = slot_of(blob.name)
            if slot is not None and "/" not in blob.name[len(prefix) :]:
                found.append((slot, blob))
        return found

    def all_holders(self) -> dict[int, Lease]:
        from google.api_core.exceptions import NotFound

        found = {}
        for slot, blob in self._listed(self._bucket()):
            try:
                found[slot] = _parse(slot, blob.download_as_text(timeout=request_timeout()))
            except NotFound:
                continue
            except ValueError:
                found[slot] = Lease(slot, "?", 0.0)
        return dict(sorted(found.items()))

    def take_over_dead(self, slots: int, holder: str) -> list[tuple[Lease, str]]:
        """As LocalLeaseStore.take_over_dead; the delete is conditional on the generation that was judged."""
        from google.api_core.exceptions import NotFound, PreconditionFailed

        bucket, taken = self._bucket(), []
        for slot in _dead(self.holders(slots), holder, time.time()):
            read = self._read(bucket, slot)
            if read is None or read[0].holder == holder or (reason := read[0].dead_reason()) is None:
                continue
            try:
                bucket.blob(self._name(slot)).delete(if_generation_match=read[1], timeout=request_timeout())
            except (NotFound, PreconditionFailed):
                continue  # freed or taken again meanwhile
            taken.append((read[0], reason))
        return taken

    def renew(self, holder: str, slots: int) -> list[int]:
        """Push the expiry of ``holder``'s leases (of the first ``slots``) out again: its run is known to live
        (it takes them again, or a waiter read its state as running). Returns the slots renewed."""
        mine = sorted(slot for slot, lease in self.holders(slots).items() if lease.holder == holder)
        return self._renew(self._bucket(), mine, holder)

    def _renew(self, bucket: Any, slots: list[int], holder: str) -> list[int]:
        """Push the expiry of ``holder``'s ``slots`` out again; returns those renewed."""
        from google.api_core.exceptions import NotFound, PreconditionFailed

        renewed = []
        for slot in slots:
            read = self._read(bucket, slot)
            if read is None or read[0].holder != holder:
                continue
            record = _record(holder, time.time() + LEASE_TTL_S, read[0].acquired_at, read[0].supervisor)
            try:
                bucket.blob(self._name(slot)).upload_from_string(
                    record, content_type="application/json", if_generation_match=read[1], timeout=request_timeout()
                )
            except (NotFound, PreconditionFailed):
                continue
            renewed.append(slot)
        return renewed

    def try_acquire(self, holder: str, slots: int, count: int = 1) -> Lease | None:
        """As LocalLeaseStore.try_acquire: ``count`` slots for ``holder``, all or none."""
        from google.api_core.exceptions import PreconditionFailed

        held = self.holders(slots)
        mine = sorted(slot for slot, lease in held.items() if lease.holder == holder)
        free = [slot for slot in range(min(slots, MAX_LEASE_SLOTS)) if slot not in held]
        if len(mine) + len(free) < count:
            return None
        bucket = self._bucket()
        self._renew(bucket, mine, holder)
        taken: list[int] = []
        for slot in free:
            if len(mine) + len(taken) >= count:
                break
            try:
                # With a generation precondition the client retries transient errors by itself
                # (DEFAULT_RETRY_IF_GENERATION_SPECIFIED).
                bucket.blob(self._name(slot)).upload_from_string(
                    _record(holder, time.time() + LEASE_TTL_S),
                    content_type="application/json",
                    if_generation_match=0,
                    timeout=request_timeout(),
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
                bucket.blob(self._name(slot)).delete(timeout=request_timeout())
            return None
        first = min(mine + taken)
        return held[first] if first in held else Lease(first, holder, time.time())

    def release(self, holder: str) -> list[int]:
        from google.api_core.exceptions import NotFound

        bucket, freed = self._bucket(), []
        for slot, blob in self._listed(bucket):
            try:
                lease = _parse(slot, blob.download_as_text(timeout=request_timeout()))
            except (NotFound, ValueError):
                continue  # gone meanwhile, or not a lease record: not this holder's
            if lease.holder == holder:
                try:
                    blob.delete(timeout=request_timeout())
                except NotFound:
                    continue
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
        split_gs_uri(root, "lease_root")
    return root


def lease_store(root: str | None, gcp_conn_id: str = "google_cloud_default") -> LeaseStore:
    root = check_lease_root(root) or default_lease_root()
    if root.startswith("gs://"):
        return GcsLeaseStore(root, gcp_conn_id)
    return LocalLeaseStore(root)


def parse_count(value: int | str, slots: int, field: str = "num_slices") -> int:
    """How many slices one run needs (its num_slices): 1 to ``slots``; more can never be granted."""
    try:
        count = int(value)
    except (TypeError, ValueError):
        count = 0
    if count < 1:
        raise UserInputError(field, value, "give a whole number of slices >= 1")
    if count > slots:
        raise UserInputError(
            field,
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
    if slots > MAX_LEASE_SLOTS:
        raise UserInputError(
            "max_slices", value, f"give at most {MAX_LEASE_SLOTS} (the number of lease slots tpuflow keeps)"
        )
    return slots
