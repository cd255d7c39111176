"""A stand-in for the Cloud Quotas API's quota reads (``cloudquotas.googleapis.com/v1`` QuotaInfo).

Served by the GKE stand-in's HTTP server (``tpuflow_rehearsal.standins.gke_api``) under ``/v1/projects/P/
locations/global/services/S/quotaInfos``, so the real ``google.cloud.cloudquotas_v1.CloudQuotasClient``
(REST transport, anonymous credentials, ``api_endpoint`` = the stand-in's URL) talks to it unchanged:

- ``GET .../quotaInfos/QUOTA_ID``: one QuotaInfo (404 NOT_FOUND for an id the service does not have)
- ``GET .../quotaInfos``: all of a service's QuotaInfos

TPU quotas of GKE slices are Compute Engine quotas that the regional quota view
(``compute regions describe``) no longer lists for current generations: v6e's is
``PREEMPTIBLE-TPU-V6E-per-project-region`` (spot, flex-start, queued) and, for on-demand, the family
quota ``TPUS-PER-TPU-FAMILY-per-project-region`` (dimensions ``region`` and ``tpu_family``); v5e keeps
its own pair. Values are chips. A QuotaInfo's ``dimensionsInfos`` carry one entry per override and
one without dimensions: the value of every region (and family) that has no entry of its own.

The stand-in's project holds ``default_chips`` of every quota below in every region until a test sets
another value (``set``). Usage is not part of QuotaInfo (Cloud Quotas reports limits only).
"""

from __future__ import annotations

import re
import threading
from collections.abc import Mapping
from typing import Any

QUOTAS_PREFIX = re.compile(
    r"^/v1/projects/(?P<p>[^/]+)/locations/global/services/(?P<s>[^/]+)/quotaInfos(?:/(?P<q>[^/]+))?$"
)
COMPUTE_SERVICE = "compute.googleapis.com"

# quota id -> (dimensions, display name) of the TPU quotas the stand-in's Compute service has.
TPU_QUOTAS: dict[str, tuple[tuple[str, ...], str]] = {
    "TPUS-PER-TPU-FAMILY-per-project-region": (("region", "tpu_family"), "TPU chips per TPU family per region"),
    "PREEMPTIBLE-TPU-V6E-per-project-region": (("region",), "Preemptible TPU v6e chips per region"),
    "TPU-LITE-PODSLICE-V5-per-project-region": (("region",), "TPU v5 Lite PodSlice chips per region"),
    "PREEMPTIBLE-TPU-LITE-PODSLICE-V5-per-project-region": (
        ("region",),
        "Preemptible TPU v5 Lite PodSlice chips per region",
    ),
}


class QuotaNotFound(Exception):
    pass


class CloudQuotas:
    """The TPU QuotaInfos of the stand-in's projects; thread-safe."""

    def __init__(self, default_chips: int = 4096) -> None:
        self.default_chips = int(default_chips)
        self._lock = threading.Lock()
        # quota id -> {frozen dimensions: value}; the empty dimensions hold the default.
        self._values: dict[str, dict[tuple[tuple[str, str], ...], int]] = {}
        self.reset()

    def reset(self) -> None:
        with self._lock:
            self._values = {quota_id: {(): self.default_chips} for quota_id in TPU_QUOTAS}

    def set(self, quota_id: str, value: int, **dimensions: str) -> None:
        """Set a quota's value for these dimensions (none: the default of every region)."""
        if quota_id not in TPU_QUOTAS:
            raise ValueError(f"the stand-in has no quota {quota_id!r}; it has {sorted(TPU_QUOTAS)}")
        allowed = TPU_QUOTAS[quota_id][0]
        unknown = set(dimensions) - set(allowed)
        if unknown:
            raise ValueError(f"quota {quota_id} has dimensions {list(allowed)}, not {sorted(unknown)}")
        with self._lock:
            self._values[quota_id][tuple(sorted(dimensions.items()))] = int(value)

    def info(self, project: str, service: str, quota_id: str) -> dict[str, Any]:
        if service != COMPUTE_SERVICE or quota_id not in TPU_QUOTAS:
            raise QuotaNotFound(
                f"QuotaInfo projects/{project}/locations/global/services/{service}/quotaInfos/{quota_id} not found."
            )
        dims, display = TPU_QUOTAS[quota_id]
        with self._lock:
            values = dict(self._values[quota_id])
        infos = []
        for key, value in sorted(values.items(), key=lambda kv: (len(kv[0]), kv[0])):
            entry: dict[str, Any] = {"dimensions": dict(key), "details": {"value": str(value)}}
            if "region" in dict(key):
                entry["applicableLocations"] = [dict(key)["region"]]
            infos.append(entry)
        return {
            "name": f"projects/{project}/locations/global/services/{service}/quotaInfos/{quota_id}",
            "quotaId": quota_id,
            "metric": f"{service}/{quota_id.removesuffix('-per-project-region').lower().replace('-', '_')}",
            "service": service,
            "isPrecise": True,
            "containerType": "PROJECT",
            "dimensions": list(dims),
            "quotaDisplayName": display,
            "metricUnit": "1",
            "dimensionsInfos": infos,
        }

    def handle(self, method: str, path: str) -> tuple[int, Any] | None:
        """Answer a Cloud Quotas request: (HTTP status, JSON body); None for a path that is not one."""
        m = QUOTAS_PREFIX.match(path)
        if not m:
            return None
        if method != "GET":
            return 405, _error(405, "METHOD_NOT_ALLOWED", f"{method} is not supported on {path}.")
        project, service, quota_id = m.group("p"), m.group("s"), m.group("q")
        try:
            if quota_id:
                return 200, self.info(project, service, quota_id)
            ids = sorted(TPU_QUOTAS) if service == COMPUTE_SERVICE else []
            return 200, {"quotaInfos": [self.info(project, service, q) for q in ids]}
        except QuotaNotFound as err:
            return 404, _error(404, "NOT_FOUND", str(err))


def _error(code: int, status: str, message: str) -> Mapping[str, Any]:
    return {"error": {"code": code, "message": message, "status": status}}
