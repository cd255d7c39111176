"""Small artifacts (job logs, reports, slice leases) at a local path or gs://, on the Airflow side.

gs:// goes through the google provider's GCSHook (its connection's credentials), except when
STORAGE_EMULATOR_HOST names a GCS emulator: see `gcs_client`. What the Ray side needs for the same emulator
(any client library, with plain gs:// paths) is `emulator_env`.

Every request has a wall-clock deadline (`request_timeout()`, $TPUFLOW_GCS_REQUEST_TIMEOUT_S, default 60 s) on
the whole request, from sending it to the last byte of its answer (tpuflow.request_deadline, installed on every
client `gcs_client` returns): a server that accepts the connection and never answers, or answers a byte at a
time, fails the call with StorageTimeout naming the path, instead of holding the task (and its slice).
Transient errors (429, 5xx, resets) are retried; a request that got no complete answer in time is not, so the
task's own retries decide.
"""

from __future__ import annotations

import os
import re
import shutil
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, cast

from tpuflow.errors import UserInputError

EMULATOR_ENV = "STORAGE_EMULATOR_HOST"
# host:port of the GCE metadata stand-in that runs beside the emulator (tpuflow_rehearsal.metadata_server); exported
# with STORAGE_EMULATOR_HOST, read only here: this process's own clients never see a metadata server
METADATA_ENV = "TPUFLOW_GCE_METADATA_HOST"
# What plain client libraries read for an emulator, besides STORAGE_EMULATOR_HOST (google-cloud-storage, gcsfs):
# pyarrow's google-cloud-cpp takes the endpoint from CLOUD_STORAGE_EMULATOR_ENDPOINT (a URL with its scheme).
CPP_EMULATOR_ENV = "CLOUD_STORAGE_EMULATOR_ENDPOINT"
# gcsfs's default filesystem asks every bucket for its layout over gRPC, which an emulator never answers: with
# credentials (the metadata stand-in's) its first call hangs. Off, gcsfs uses the JSON API only.
GCSFS_HNS_ENV = "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT"
# Where Google's clients look for the metadata server: google-auth reads GCE_METADATA_HOST (GCE_METADATA_ROOT when
# it is unset) and pings GCE_METADATA_IP; google-cloud-cpp (pyarrow) reads GCE_METADATA_ROOT only.
METADATA_CLIENT_ENV = ("GCE_METADATA_HOST", "GCE_METADATA_IP", "GCE_METADATA_ROOT")
WRITER_ROLE = "roles/storage.objectUser"
REQUEST_TIMEOUT_ENV = "TPUFLOW_GCS_REQUEST_TIMEOUT_S"
DEFAULT_REQUEST_TIMEOUT_S = 60.0
# what the Ray side reads too (tpuflow_driver.storage and .deadline_fs): a value set here reaches the jobs
_SHARED_SETTINGS = (REQUEST_TIMEOUT_ENV, "TPUFLOW_GCS_RETRY_LIMIT_S")
# Bucket names: 3-63 lowercase letters, digits, '-', '_' and '.', starting and ending with a letter or digit.
_BUCKET = re.compile(r"[a-z0-9][a-z0-9._-]{1,61}[a-z0-9]")


class StorageTimeout(TimeoutError):
    """A storage request got no complete answer within its deadline (the message names the path and the server)."""


def request_timeout() -> float:
    """Seconds one storage request may take, whole (and wait for its next bytes): $TPUFLOW_GCS_REQUEST_TIMEOUT_S,
    default 60."""
    raw = os.environ.get(REQUEST_TIMEOUT_ENV, "").strip()
    if not raw:
        return DEFAULT_REQUEST_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise UserInputError(REQUEST_TIMEOUT_ENV, raw, "give a positive number of seconds, e.g. 60")
    return value


def emulator_host() -> str | None:
    """The GCS emulator gs:// means here ($STORAGE_EMULATOR_HOST), or None for Cloud Storage."""
    return os.environ.get(EMULATOR_ENV, "").strip() or None


def emulator_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The storage settings Ray jobs' and Serve replicas' runtime_env env_vars carry (and local Ray nodes get),
    from ``environ`` (default: this process's environment).

    With an emulator configured ($STORAGE_EMULATOR_HOST), what points plain client libraries at it, gs://
    paths as they are: STORAGE_EMULATOR_HOST (google-cloud-storage, gcsfs), CLOUD_STORAGE_EMULATOR_ENDPOINT
    (pyarrow, Ray Data), GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false, and with $TPUFLOW_GCE_METADATA_HOST the
    GCE_METADATA_* variables naming the metadata stand-in beside it, whose token the libraries that insist on
    credentials (pyarrow) get. TPUFLOW_GCS_REQUEST_TIMEOUT_S / TPUFLOW_GCS_RETRY_LIMIT_S where set. Without an
    emulator (Cloud Storage) none of the emulator's variables: {} or the two settings."""
    source = os.environ if environ is None else environ
    settings = {name: source[name].strip() for name in _SHARED_SETTINGS if source.get(name, "").strip()}
    host = source.get(EMULATOR_ENV, "").strip()
    if not host:
        return settings
    url = host.rstrip("/") if "://" in host else f"http://{host.rstrip('/')}"
    env = {EMULATOR_ENV: host, CPP_EMULATOR_ENV: url, GCSFS_HNS_ENV: "false"}
    metadata = source.get(METADATA_ENV, "").strip().rstrip("/")
    if metadata:
        address = metadata.split("://", 1)[-1]
        env |= {METADATA_ENV: address, **dict.fromkeys(METADATA_CLIENT_ENV, address)}
    return {**env, **settings}


def split_gs_uri(uri: str, field: str = "uri") -> tuple[str, str]:
    """("bucket", "object/name") of gs://bucket/object/name; a malformed URI is a UserInputError."""
    if not uri.startswith("gs://"):
        raise UserInputError(field, uri, "give gs://BUCKET/PREFIX")
    bucket, _, name = uri[len("gs://") :].partition("/")
    if not _BUCKET.fullmatch(bucket) or ".." in bucket:
        raise UserInputError(
            field, uri, f"{bucket!r} is not a bucket name (3-63 of a-z 0-9 - _ .); give gs://BUCKET/PREFIX"
        )
    return bucket, name.strip("/")


def gcs_client(gcp_conn_id: str = "google_cloud_default") -> Any:
    """The google-cloud-storage client for gs:// URIs.

    Cloud Storage: GCSHook(gcp_conn_id).get_conn(), the provider's client with the connection's
    credentials. With STORAGE_EMULATOR_HOST set, an anonymous client instead. google-cloud-storage
    points any client at the emulator by itself, but GCSHook.get_conn() always passes
    credentials=self.get_credentials(): measured with provider 22.8.0, that reaches the emulator
    only when the connection exists and is marked is_anonymous; with no such connection it raises
    AirflowNotFoundException, with a plain one google.auth.default() raises DefaultCredentialsError
    on a machine without Application Default Credentials (or would hand a user's real credentials
    to the emulator). So the client is built as the hook builds it (the provider's client_info),
    with AnonymousCredentials, whatever the connection says; the library takes the endpoint from
    the variable.

    Either way every request of the client has the wall-clock deadline request_timeout() on the whole request
    (tpuflow.request_deadline).
    """
    if emulator_host():
        from airflow.providers.google.common.consts import CLIENT_INFO
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import storage

        credentials = AnonymousCredentials()
        client = storage.Client(project="tpuflow-local", credentials=credentials, client_info=CLIENT_INFO)
    else:
        from airflow.providers.google.cloud.hooks.gcs import GCSHook

        client = GCSHook(gcp_conn_id=gcp_conn_id).get_conn()
    from tpuflow.request_deadline import bound_session

    bound_session(client._http, request_timeout)
    return client


def _stalled(err: BaseException | None) -> bool:
    """Whether `err` (or what it wraps) is a request that got no answer in time."""
    import requests
    import urllib3

    seen: set[int] = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, requests.exceptions.Timeout | urllib3.exceptions.TimeoutError | TimeoutError):
            return True
        wrapped = err.args[0] if err.args and isinstance(err.args[0], BaseException) else None
        err = err.__cause__ or wrapped
    return False


def _retry() -> Any:
    """The client's own retry for transient errors (429, 5xx, connection resets), with backoff.
    Overwriting an artifact with the same bytes is idempotent, so uploads may retry too. A request
    that got no answer within request_timeout() is not retried: it fails as StorageTimeout."""
    from google.cloud.storage.retry import DEFAULT_RETRY, _should_retry

    return DEFAULT_RETRY.with_predicate(lambda err: not _stalled(err) and _should_retry(err)).with_timeout(120.0)


@contextmanager
def deadline(uri: str, what: str) -> Iterator[float]:
    """Yields request_timeout() for the calls' timeout=; a request that got no complete answer in time (the
    client's wall-clock deadline, or no byte within the timeout) becomes StorageTimeout naming `what`, `uri` and
    the server."""
    seconds = request_timeout()
    try:
        yield seconds
    except Exception as err:
        if not _stalled(err):
            raise
        server = f"the GCS emulator at {emulator_host()}" if emulator_host() else "Cloud Storage"
        raise StorageTimeout(
            f"{what} {uri}: {server} sent no complete answer within {seconds:g} s ({REQUEST_TIMEOUT_ENV}); "
            "the server accepts connections but answers slowly or not at all (a broken connection or proxy)"
        ) from err


def write_text(uri: str, text: str, gcp_conn_id: str = "google_cloud_default") -> str:
    if uri.startswith("gs://"):
        bucket, name = split_gs_uri(uri)
        blob = gcs_client(gcp_conn_id).bucket(bucket).blob(name)
        content_type = "application/json" if name.endswith(".json") else "text/plain"
        with deadline(uri, "writing") as timeout:
            blob.upload_from_string(text, content_type=content_type, retry=_retry(), timeout=timeout)
    else:
        path = Path(uri)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return uri


def read_text(uri: str, gcp_conn_id: str = "google_cloud_default") -> str | None:
    """The file's text, or None when there is none."""
    if uri.startswith("gs://"):
        from google.api_core.exceptions import NotFound

        bucket, name = split_gs_uri(uri)
        try:
            with deadline(uri, "reading") as timeout:
                blob = gcs_client(gcp_conn_id).bucket(bucket).blob(name)
                return cast(str, blob.download_as_text(retry=_retry(), timeout=timeout))
        except NotFound:
            return None
    path = Path(uri)
    return path.read_text() if path.is_file() else None


def find_files(folder: str, name: str, gcp_conn_id: str = "google_cloud_default") -> list[str]:
    """The files called ``name`` one folder below ``folder`` (``<folder>/*/<name>``, a local path or gs://), sorted."""
    if not folder.startswith("gs://"):
        return sorted(str(p) for p in Path(folder).glob(f"*/{name}") if p.is_file())
    bucket, prefix = split_gs_uri(folder)
    prefix = f"{prefix.rstrip('/')}/" if prefix else ""
    with deadline(folder, "listing") as timeout:
        blobs = list(gcs_client(gcp_conn_id).list_blobs(bucket, prefix=prefix, retry=_retry(), timeout=timeout))
    found = (b.name for b in blobs if b.name.count("/") == prefix.count("/") + 1 and b.name.endswith(f"/{name}"))
    return sorted(f"gs://{bucket}/{found_name}" for found_name in found)


def check_writable(uri: str, field: str = "output_root", gcp_conn_id: str = "google_cloud_default") -> None:
    """Fail fast (before anything billable) when a gs:// output folder cannot be written: a malformed
    URI, a missing bucket, or credentials without write access. Writes and deletes one small object
    there: what the run itself needs (`roles/storage.objectUser`), no bucket-level permission."""
    if "://" not in uri and not uri.startswith("gs:"):
        return
    if not uri.startswith("gs://"):
        raise UserInputError(field, uri, "give a local folder or gs://BUCKET/PREFIX")
    from google.api_core.exceptions import Forbidden, NotFound, Unauthorized

    bucket, prefix = split_gs_uri(uri, field)
    probe = f"{prefix}/.tpuflow-write-check-{uuid.uuid4().hex[:12]}".lstrip("/")
    where = f"emulator {emulator_host()}" if emulator_host() else f"connection {gcp_conn_id!r}"
    try:
        with deadline(f"gs://{bucket}/{probe}", f"{field}: writing the probe object") as timeout:
            blob = gcs_client(gcp_conn_id).bucket(bucket).blob(probe)
            blob.upload_from_string(b"", if_generation_match=0, retry=_retry(), timeout=timeout)
            blob.delete(retry=_retry(), timeout=timeout)
    except NotFound:
        raise UserInputError(
            field,
            uri,
            f"bucket {bucket!r} does not exist ({where}); create it, or give a bucket "
            f"where the run's credentials have {WRITER_ROLE}",
        ) from None
    except (Forbidden, Unauthorized) as err:
        raise UserInputError(
            field,
            uri,
            f"the credentials ({where}) cannot write to bucket {bucket!r} "
            f"(HTTP {err.code}); grant them {WRITER_ROLE} on gs://{bucket}",
        ) from None


def remove_tree(uri: str, gcp_conn_id: str = "google_cloud_default") -> int:
    """Delete everything under the folder ``uri`` (a local path or gs://BUCKET/PREFIX); returns how many files
    went. A missing folder is nothing to delete."""
    if not uri.startswith("gs://"):
        path = Path(uri)
        count = sum(1 for p in path.rglob("*") if p.is_file()) if path.is_dir() else 0
        shutil.rmtree(path, ignore_errors=True)
        return count
    from google.api_core.exceptions import NotFound

    bucket, name = split_gs_uri(uri)
    client = gcs_client(gcp_conn_id)
    count = 0
    with deadline(uri, "deleting") as timeout:
        for blob in client.list_blobs(bucket, prefix=f"{name}/" if name else None, timeout=timeout):
            try:
                blob.delete(timeout=timeout)
            except NotFound:  # deleted meanwhile
                continue
            count += 1
    return count
