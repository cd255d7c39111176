"""Serve config (Ray Serve's REST/`serve deploy` shape) -> a RayService's serveConfigV2.

The local deploy PUTs `{"applications": [...], "http_options": {...}, ...}` to the dashboard's
/api/serve/applications/; KubeRay's RayService controller does the same with the YAML in
`spec.serveConfigV2`. Both therefore start from one dict. Differences that are about *where* Serve
runs, not *what* it serves, are normalised here: in a KubeRay pod the proxy must listen on 0.0.0.0 at
the container's `serve` port (8000), which the serve Service targets, whatever the local run used.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import yaml

from tpuflow.errors import UserInputError

SERVE_PORT = 8000
_LOCAL_ONLY_HTTP_KEYS = ("host", "port")


def serve_config_dict(serve_config: object) -> dict[str, Any]:
    """Accept a mapping, or an object with to_dict()/as_dict()/model_dump(), and validate its shape."""
    raw: object = serve_config
    for method in ("to_dict", "as_dict", "model_dump", "dict"):
        if not isinstance(raw, Mapping) and callable(getattr(raw, method, None)):
            raw = getattr(raw, method)()
    if isinstance(raw, str):
        try:
            raw = yaml.safe_load(raw)
        except yaml.YAMLError as err:
            problem = " ".join(str(err).split())  # one line: YAML errors span several
            raise UserInputError("serve_config", str(serve_config)[:80], f"not valid YAML/JSON: {problem}") from err
    if not isinstance(raw, Mapping):
        raise UserInputError("serve_config", serve_config, 'give a Serve config dict {"applications": [...]}')
    config = copy.deepcopy(dict(raw))
    apps = config.get("applications")
    if not isinstance(apps, list) or not apps:
        raise UserInputError(
            "serve_config.applications",
            apps,
            'list at least one application ({"name": ..., "import_path": "module:app", "route_prefix": "/..."})',
        )
    names: set[str] = set()
    routes: set[str] = set()
    for i, app in enumerate(apps):
        field = f"serve_config.applications[{i}]"
        if not isinstance(app, Mapping):
            raise UserInputError(field, app, "each application is a mapping")
        import_path = app.get("import_path")
        if not isinstance(import_path, str) or ":" not in import_path and "." not in import_path:
            raise UserInputError(f"{field}.import_path", import_path, "give 'module.sub:app' importable on the cluster")
        name = app.get("name", "default")
        if name in names:
            raise UserInputError(f"{field}.name", name, "application names must be unique")
        names.add(name)
        route = app.get("route_prefix")
        if route is not None:
            if not isinstance(route, str) or not route.startswith("/"):
                raise UserInputError(f"{field}.route_prefix", route, "a route prefix starts with '/'")
            if route in routes:
                raise UserInputError(f"{field}.route_prefix", route, "two applications share this route prefix")
            routes.add(route)
    return config


def for_kuberay(serve_config: object, *, serve_port: int = SERVE_PORT) -> dict[str, Any]:
    """The config as KubeRay should deploy it: proxy on 0.0.0.0 at the head's serve container port."""
    config = serve_config_dict(serve_config)
    http = dict(config.get("http_options") or {})
    for key in _LOCAL_ONLY_HTTP_KEYS:
        http.pop(key, None)
    config["http_options"] = {"host": "0.0.0.0", "port": serve_port, **http}
    return config


def serve_config_v2(serve_config: object, *, serve_port: int = SERVE_PORT) -> str:
    """The YAML string for RayService.spec.serveConfigV2."""
    return yaml.safe_dump(for_kuberay(serve_config, serve_port=serve_port), sort_keys=False, default_flow_style=False)


def parse_serve_config_v2(text: str) -> dict[str, Any]:
    """serveConfigV2 back to the REST dict (what the RayService controller PUTs to the dashboard)."""
    data = yaml.safe_load(text or "")
    if not isinstance(data, dict):
        raise UserInputError("spec.serveConfigV2", text, "must be a YAML mapping with an applications list")
    return data
