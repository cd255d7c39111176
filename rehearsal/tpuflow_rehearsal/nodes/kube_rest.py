"""The node agent's Kubernetes client: JSON over HTTPS with a bearer token, as a kubelet speaks to the API.

The agent needs a handful of calls (lists, a status merge-patch, a zero-grace delete, node and lease writes);
this keeps the content types explicit, which the generated client chooses for itself.
"""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from typing import Any


class KubeError(RuntimeError):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status


class KubeRest:
    def __init__(self, server: str, token: str, ca_file: str) -> None:
        self.server, self.token = server.rstrip("/"), token
        self.context = ssl.create_default_context(cafile=ca_file)

    def request(
        self,
        method: str,
        path: str,
        body: Mapping[str, Any] | None = None,
        *,
        content_type: str = "application/json",
        query: Mapping[str, str] | None = None,
        timeout: float = 10.0,
    ) -> dict[str, Any]:
        url = f"{self.server}{path}" + (f"?{urllib.parse.urlencode(query)}" if query else "")
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Authorization": f"Bearer {self.token}", "Accept": "application/json"}
        if data is not None:
            headers["Content-Type"] = content_type
        request = urllib.request.Request(url, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=timeout, context=self.context) as response:
                raw = response.read()
        except urllib.error.HTTPError as err:
            detail = err.read().decode(errors="replace")
            try:
                detail = json.loads(detail).get("message", detail)
            except ValueError:
                pass
            raise KubeError(err.code, detail) from None
        return dict(json.loads(raw)) if raw else {}

    def items(self, path: str, **query: str) -> list[dict[str, Any]]:
        return list(self.request("GET", path, query=query or None).get("items") or [])

    def merge_patch(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        return self.request("PATCH", path, body, content_type="application/merge-patch+json")
