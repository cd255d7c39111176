"""The "Outputs" extra link: where a task wrote this run's data, checkpoints or results.

gs:// folders open in the Cloud console's storage browser; local folders (the embedded
default) in the tpuflow plugin's outputs page. Like every link here, the full URL is stored in XCom when the task
starts, so it works while the task is deferred and after it failed.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import quote

from tpuflow import paths
from tpuflow.links import StoredUrlLink

CONSOLE_STORAGE = "https://console.cloud.google.com/storage/browser"
# Served by the tpuflow plugin inside the Airflow UI (operators/ui/app.py). The UI shows only
# http(s) or same-origin extra links -- a file:// link would silently not appear.
LOCAL_OUTPUTS_ROUTE = "/tpuflow/outputs"


def output_root() -> Path:
    """The local output root (tpuflow.paths.output_root when it is a folder)."""
    return Path(paths.output_root())


def outputs_url(uri: str) -> str:
    """Browser URL of an output folder: the Cloud console for gs://, the plugin's page for a folder
    under the local output root, a file:// URL for any other local folder."""
    uri = uri.strip()
    if uri.startswith("gs://"):
        path = uri[len("gs://") :].strip("/")
        return f"{CONSOLE_STORAGE}/{quote(path)}" + ("/" if "/" in path else "")
    if "://" in uri or not uri:
        return uri
    path = Path(uri).absolute()
    if path.is_relative_to(output_root()):
        return f"{LOCAL_OUTPUTS_ROUTE}/{quote(path.relative_to(output_root()).as_posix())}"
    return path.as_uri()


class OutputsLink(StoredUrlLink):
    name = "Outputs"
    key = "tpuflow_outputs"

    @classmethod
    def format_url(cls, *, uri: object = None, **params: object) -> str:
        return outputs_url(uri) if uri and isinstance(uri, str) else ""
