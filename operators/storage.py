"""Write small artifacts (job logs, reports) to a local path or gs:// through Airflow's GCSHook."""

from __future__ import annotations

from pathlib import Path


def write_text(uri: str, text: str, gcp_conn_id: str = "google_cloud_default") -> str:
    if uri.startswith("gs://"):
        from airflow.providers.google.cloud.hooks.gcs import GCSHook

        bucket, _, name = uri[len("gs://") :].partition("/")
        GCSHook(gcp_conn_id=gcp_conn_id).upload(bucket_name=bucket, object_name=name, data=text)
    else:
        path = Path(uri)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return uri


def browse_url(uri: str) -> str:
    """Where a person opens a file: the Cloud console for gs://; for a local file under the output
    root, the tpuflow plugin's outputs page in the Airflow UI (which hides file:// links)."""
    if uri.startswith("gs://"):
        return f"https://console.cloud.google.com/storage/browser/_details/{uri[len('gs://'):]}"
    from tpuflow.output_links import outputs_url

    return outputs_url(str(Path(uri).resolve()))
