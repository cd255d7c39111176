"""The "Outputs" extra link: where a task wrote this run's data, checkpoints or results.

gs:// folders open in the Cloud console's storage browser; local folders (the embedded
default) in the tpuflow plugin's outputs page, which also serves a gs:// output root. Under a GCS
emulator (STORAGE_EMULATOR_HOST) the console cannot show the objects, so gs:// links under the
output root point at the plugin's page too. Like every link here, the full URL is stored in XCom
when the task starts, so it works while the task is deferred and after it failed.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import quote

from tpuflow import paths
from tpuflow.links import StoredUrlLink
from tpuflow.storage import emulator_host

CONSOLE_STORAGE = "https://console.cloud.google.com/storage/browser"
# Served by the tpuflow plugin inside the Airflow UI (operators/ui/app.py). The UI shows only
# http(s) or same-origin extra links -- a file:// link would silently not appear.
LOCAL_OUTPUTS_ROUTE = "/tpuflow/outputs"


def output_root() -> Path:
    """The local output root (tpuflow.paths.output_root when it is a folder)."""
    return Path(paths.output_root())


def plugin_url(uri: str) -> str | None:
    """The plugin's outputs page for a folder or file under the output root (local or gs://), else None."""
    root = paths.output_root()
    if root.startswith("gs://"):
        uri = uri.strip().rstrip("/")
        if uri.startswith(root + "/"):
            return f"{LOCAL_OUTPUTS_ROUTE}/{quote(uri[len(root) + 1 :])}"
        return None
    if "://" in uri or not uri.strip():
        return None
    path = Path(uri.strip()).absolute()
    if path.is_relative_to(output_root()):
        return f"{LOCAL_OUTPUTS_ROUTE}/{quote(path.relative_to(output_root()).as_posix())}"
    return None


def outputs_url(uri: str) -> str:
    """Browser URL of an output folder: the Cloud console for gs:// (the plugin's page under an
    emulator), the plugin's page for a folder under the local output root, a file:// URL for any
    other local folder."""
    uri = uri.strip()
    if uri.startswith("gs://"):
        if emulator_host() and (page := plugin_url(uri)):
            return page
        path = uri[len("gs://") :].strip("/")
        return f"{CONSOLE_STORAGE}/{quote(path)}" + ("/" if "/" in path else "")
    if "://" in uri or not uri:
        return uri
    return plugin_url(uri) or Path(uri).absolute().as_uri()


def browse_url(uri: str) -> str:
    """Where a person opens a file: the Cloud console for gs:// (the tpuflow plugin's outputs page
    under an emulator, which the console cannot see); for a local file under the output root, the
    plugin's outputs page in the Airflow UI (which hides file:// links)."""
    if uri.startswith("gs://"):
        if emulator_host() and (page := plugin_url(uri)):
            return page
        return f"https://console.cloud.google.com/storage/browser/_details/{uri[len('gs://') :]}"
    return outputs_url(str(Path(uri).resolve()))


class OutputsLink(StoredUrlLink):
    name = "Outputs"
    key = "tpuflow_outputs"

    @classmethod
    def format_url(cls, *, uri: object = None, **params: object) -> str:
        return outputs_url(uri) if uri and isinstance(uri, str) else ""
