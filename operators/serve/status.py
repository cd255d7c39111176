"""Interpret Ray Serve's application status (GET /api/serve/applications/), shared by trigger and operator."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

FAILED_APP_STATES = frozenset({"DEPLOY_FAILED", "UNHEALTHY"})
STUCK_HINT = (
    "A replica that never becomes ready usually lacks resources: check the cluster has the CPUs/TPUs "
    "the deployment asks for. A multi-host TPU model without accelerator_config.topology can sit in "
    "DEPLOYING forever (its per-chip bundles straddle slices); declare the slice topology."
)


@dataclass(frozen=True)
class ServeVerdict:
    state: str  # "running" | "failed" | "waiting"
    detail: str


def _deployment_lines(app: dict[str, Any]) -> list[str]:
    lines = []
    for name, dep in (app.get("deployments") or {}).items():
        status = dep.get("status", "?")
        if status != "HEALTHY":
            message = (dep.get("message") or "").strip()
            lines.append(f"  deployment {name}: {status}" + (f" — {message}" if message else ""))
    return lines


def judge(payload: dict[str, Any], app_names: list[str]) -> ServeVerdict:
    apps = (payload or {}).get("applications") or {}
    failed, waiting = [], []
    for name in app_names:
        app = apps.get(name)
        if app is None:
            waiting.append(f"application {name}: not deployed yet")
            continue
        status = app.get("status", "?")
        line = f"application {name}: {status}" + (f" — {app['message'].strip()}" if app.get("message") else "")
        if status in FAILED_APP_STATES:
            failed.append("\n".join([line, *_deployment_lines(app)]))
        elif status != "RUNNING":
            waiting.append("\n".join([line, *_deployment_lines(app)]))
    if failed:
        return ServeVerdict("failed", "\n".join(failed))
    if waiting:
        return ServeVerdict("waiting", "\n".join(waiting))
    return ServeVerdict("running", ", ".join(f"{n}: RUNNING" for n in app_names))


def placement_causes(payload: dict[str, Any], app_names: list[str]) -> list[str]:
    """Why a deployment that is not HEALTHY cannot be placed, as far as Serve's own config shows it.

    A deployment whose replica gets several per-chip TPU bundles while its application's args carry
    no ``accelerator_config.topology`` is Ray Serve LLM's no-topology fallback: the bundles can cover
    hosts of two slices and the replica waits forever for the rest of a slice.
    """
    causes = []
    apps = (payload or {}).get("applications") or {}
    for name in app_names:
        app = apps.get(name) or {}
        args = (app.get("deployed_app_config") or {}).get("args") or {}
        topology = (args.get("accelerator_config") or {}).get("topology")
        for dep_name, dep in (app.get("deployments") or {}).items():
            if dep.get("status") == "HEALTHY":
                continue
            bundles = (dep.get("deployment_config") or {}).get("placement_group_bundles") or []
            chips = [b for b in bundles if float((b or {}).get("TPU", 0) or 0) > 0]
            if len(chips) > 1 and not topology:
                causes.append(
                    f"deployment {dep_name} of application {name}: {len(chips)} per-chip TPU bundles and no "
                    "accelerator_config.topology in its args, so its bundles can straddle two slices and the "
                    "replica waits forever for the rest of a slice; give args accelerator_type and "
                    "accelerator_config {kind: tpu, topology: <the slice's shape>} (tpuflow.serve.config.serve_tpu_args)"
                )
    return causes


def deletable_on_kill(payload: dict[str, Any], created: list[str] | None) -> bool:
    """Whether a killed deploy task may DELETE /api/serve/applications/ (which removes every app).

    Only when every application on the cluster is one this task created (absent before its PUT):
    an app it merely updated, or another deploy's app, keeps running.
    """
    present = set(((payload or {}).get("applications") or {}).keys())
    return bool(created) and bool(present) and present <= set(created)


def app_statuses(payload: dict[str, Any], app_names: list[str]) -> dict[str, str]:
    """Each named application's status (RUNNING, DEPLOYING, DEPLOY_FAILED, ...; NOT_DEPLOYED if absent)."""
    apps = (payload or {}).get("applications") or {}
    return {name: str((apps.get(name) or {}).get("status", "NOT_DEPLOYED")) for name in app_names}
