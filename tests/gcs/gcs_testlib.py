"""Helpers of the gs:// tests (a module of its own: `conftest` names another folder's file when the
whole suite is collected)."""

from __future__ import annotations


def list_bucket(bucket: str, prefix: str = "") -> list[str]:
    """Object names in a bucket of the emulator STORAGE_EMULATOR_HOST names, through the Airflow-side client."""
    from tpuflow.storage import gcs_client

    return sorted(blob.name for blob in gcs_client().list_blobs(bucket, prefix=prefix))
