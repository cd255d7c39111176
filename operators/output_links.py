"""The "Outputs" extra link: where a task wrote this run's data, checkpoints or results.

gs:// folders open in the Cloud console's storage browser; local folders (the embedded
default) as file:// URLs. Like every link here, the full URL is stored in XCom when the task
starts, so it works while the task is deferred and after it failed.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import quote

from operators.links import StoredUrlLink

if TYPE_CHECKING:
    from airflow.sdk import Context

CONSOLE_STORAGE = "https://console.cloud.google.com/storage/browser"


def outputs_url(uri: str) -> str:
    """Browser URL of an output folder: Cloud console for gs://, file:// for a local path, else as is."""
    uri = uri.strip()
    if uri.startswith("gs://"):
        path = uri[len("gs://") :].strip("/")
        return f"{CONSOLE_STORAGE}/{quote(path)}" + ("/" if "/" in path else "")
    if "://" in uri or not uri:
        return uri
    return Path(uri).absolute().as_uri()


class OutputsLink(StoredUrlLink):
    name = "Outputs"
    key = "tpuflow_outputs"

    @classmethod
    def persist(cls, context: Context, uri: str | None) -> str:
        if not uri or not isinstance(uri, str):
            return ""
        return cls.persist_url(context, outputs_url(uri))
