"""Helpers of the gs:// tests: what a bucket of the GCS emulator holds."""

from __future__ import annotations


def list_bucket(bucket: str, prefix: str = "") -> list[str]:
    """Object names in a bucket of the emulator STORAGE_EMULATOR_HOST names, through the Airflow-side client."""
    from tpuflow.storage import gcs_client

    return sorted(blob.name for blob in gcs_client().list_blobs(bucket, prefix=prefix))
