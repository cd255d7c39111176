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
    """Why a deployment that is not HEALTHY cannot be placed, as far as its application's args show it.

    A model of several TPU chips whose args carry ``accelerator_type`` but no
    ``accelerator_config.topology`` gets Ray Serve LLM's fallback, one per-chip TPU bundle each: the
    bundles can cover hosts of two slices and the replica waits forever for the rest of a slice.
    (Serve's status reports no placement_group_bundles: the args the application was deployed with
    are what tells.)
    """
    causes = []
    apps = (payload or {}).get("applications") or {}
    for name in app_names:
        app = apps.get(name) or {}
        args = (app.get("deployed_app_config") or {}).get("args") or {}
        chips = max((_per_chip_bundles(llm or {}) for llm in args.get("llm_configs") or [args]), default=0)
        if chips < 2:
            continue
        for dep_name, dep in (app.get("deployments") or {}).items():
            if dep.get("status") != "HEALTHY":
                causes.append(
                    f"deployment {dep_name} of application {name}: {chips} per-chip TPU bundles and no "
                    "accelerator_config.topology in its args, so its bundles can straddle two slices and the "
                    "replica waits forever for the rest of a slice; give args accelerator_type and "
                    "accelerator_config {kind: tpu, topology: <the slice's shape>} (tpuflow.serve.config.serve_tpu_args)"
                )
    return causes


def _per_chip_bundles(args: dict[str, Any]) -> int:
    """TPU chips a replica asks for one bundle each (0: a topology is declared, or no TPU model)."""
    if not args.get("accelerator_type") or ((args.get("accelerator_config") or {}).get("topology")):
        return 0
    engine = args.get("engine_kwargs") or {}
    chips = args.get("num_devices") or int(engine.get("tensor_parallel_size", 1) or 1) * int(
        engine.get("pipeline_parallel_size", 1) or 1
    )
    return int(chips or 0) if int(chips or 0) > int(args.get("chips_per_host") or 1) else 0


def deletable_on_kill(payload: dict[str, Any], created: list[str] | None) -> bool:
    """Whether a killed deploy task may DELETE /api/serve/applications/ (which removes every app).

    Only when every application on the cluster is one this task created (absent before its PUT):
    an app it merely updated, or another deploy's app, keeps running.
    """
    present = set(((payload or {}).get("applications") or {}).keys())
    if not created or not present:
        return False
    return present <= set(created)


def app_statuses(payload: dict[str, Any], app_names: list[str]) -> dict[str, str]:
    """Each named application's status (RUNNING, DEPLOYING, DEPLOY_FAILED, ...; NOT_DEPLOYED if absent)."""
    apps = (payload or {}).get("applications") or {}
    return {name: str((apps.get(name) or {}).get("status", "NOT_DEPLOYED")) for name in app_names}
