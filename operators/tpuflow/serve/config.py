"""One Ray Serve config object for both backends.

Locally it is PUT to the dashboard's /api/serve/applications/; on GKE the same dict becomes
a KubeRay RayService's serveConfigV2 (the RayService controller PUTs it the same way).
"""

from __future__ import annotations

from typing import Any

from tpuflow.errors import UserInputError
from tpuflow.tpu import TpuSlice

# Serve silently drops unknown fields; check the ones we set so a typo fails here instead.
_APP_KEYS = frozenset({"name", "import_path", "route_prefix", "args", "runtime_env", "deployments"})


def serve_application(
    name: str,
    import_path: str,
    *,
    route_prefix: str = "/",
    args: dict[str, Any] | None = None,
    runtime_env: dict[str, Any] | None = None,
    deployments: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    if ":" not in import_path and "." not in import_path:
        raise UserInputError("import_path", import_path, 'give "module:attribute", e.g. "my_pkg.app:build_app"')
    if not route_prefix.startswith("/"):
        raise UserInputError("route_prefix", route_prefix, 'start it with "/", e.g. "/my_app"')
    app: dict[str, Any] = {"name": name, "import_path": import_path, "route_prefix": route_prefix}
    if args:
        app["args"] = args
    if runtime_env:
        app["runtime_env"] = runtime_env
    if deployments:
        app["deployments"] = deployments
    return app


def serve_config(
    applications: list[dict[str, Any]],
    *,
    http_port: int | None = None,
    proxy_location: str = "HeadOnly",
) -> dict[str, Any]:
    """The body of PUT /api/serve/applications/ (Serve's ServeDeploySchema).

    `http_port` is set only for the local backend (one machine, a free port); KubeRay serves
    on the head pod's port 8000 and the RayService manifest builder drops http_options.
    proxy_location HeadOnly: simulated TPU hosts share one machine and one port namespace.
    """
    if not applications:
        raise UserInputError("applications", applications, "deploy at least one application")
    names = [a.get("name") for a in applications]
    if len(set(names)) != len(names):
        raise UserInputError("applications", names, "application names must be unique")
    for app in applications:
        unknown = set(app) - _APP_KEYS
        if unknown:
            raise UserInputError(
                f"applications[{app.get('name')}]", sorted(unknown), f"Serve knows only {sorted(_APP_KEYS)}"
            )
    config: dict[str, Any] = {"proxy_location": proxy_location, "applications": applications}
    if http_port is not None:
        config["http_options"] = {"host": "127.0.0.1", "port": int(http_port)}
    return config


def serve_tpu_args(tpu: TpuSlice) -> dict[str, Any]:
    """A Serve app's placement args for a replica on ``tpu``: what the app builder is given.

    ``accelerator_type`` (Ray's name, e.g. "TPU-V6E") and ``accelerator_config`` ({"kind": "tpu",
    "topology"}) name the slice; ``chips_per_host`` is the TPU a replica holds on each host it uses;
    ``tpu_resource_per_chip`` (only where a chip has more than one logical device) scales it to Ray's
    TPU resource. Single-host: the replica holds its host's TPU. Multi-host: it reserves one whole
    slice itself, one bundle of ``chips_per_host`` TPU per host (Ray Serve LLM's deferred placement);
    ``accelerator_type`` + ``accelerator_config.topology`` are what ``check_tpu_placement`` requires.
    """
    args: dict[str, Any] = {**tpu.serve_accelerator_config(), "chips_per_host": tpu.chips_per_host}
    if tpu.generation.logical_devices_per_chip > 1:
        args["tpu_resource_per_chip"] = tpu.generation.logical_devices_per_chip
    return args


def _place_args(args: dict[str, Any], derived: dict[str, Any], field: str, tpu: TpuSlice) -> dict[str, Any]:
    """``args`` with the keys of ``derived`` it lacks (nested ones too); a declared value the slice
    contradicts is refused."""
    out = dict(args)
    for key, want in derived.items():
        have = out.get(key)
        if isinstance(want, dict) and (have is None or isinstance(have, dict)):
            out[key] = _place_args(have or {}, want, f"{field}.{key}", tpu)
        elif have is not None and have != want:
            raise UserInputError(
                f"{field}.{key}",
                have,
                f"the serve slice is {tpu.generation.name} {tpu.topology} ({tpu.num_hosts} hosts of "
                f"{tpu.chips_per_host} chips): give {want!r} or leave it out to have it derived from the slice",
            )
        else:
            out[key] = want
    return out


def _place_app(app: dict[str, Any], tpu: TpuSlice) -> dict[str, Any]:
    field = f"applications[{app.get('name')}].args"
    args = app.get("args") or {}
    if not isinstance(args, dict):
        raise UserInputError(field, args, "Serve passes args to the app builder as a mapping; give a dict")
    if "llm_configs" not in args:
        return {**app, "args": _place_args(args, serve_tpu_args(tpu), field, tpu)}
    llms = args["llm_configs"]
    if not isinstance(llms, list) or not all(isinstance(llm, dict) for llm in llms):
        # A file path cannot be checked or completed here; Serve would read it only on the cluster.
        raise UserInputError(
            f"{field}.llm_configs",
            llms,
            "on a multi-host slice give each LLM config inline (a dict), so its accelerator_config.topology "
            "can be derived from the slice and checked",
        )
    # LLMConfig forbids unknown fields: only its own accelerator_type / accelerator_config are derived.
    derived = tpu.serve_accelerator_config()
    placed = [_place_args(llm, derived, f"{field}.llm_configs[{i}]", tpu) for i, llm in enumerate(llms)]
    return {**app, "args": {**args, "llm_configs": placed}}


def place_on_slice(config: dict[str, Any], tpu: TpuSlice | None) -> dict[str, Any]:
    """``config`` with each application's multi-host TPU placement derived from ``tpu``, never rewritten.

    On a multi-host slice a replica reserves a whole slice itself, which it can do only when its args
    name the slice (``serve_tpu_args``: accelerator_type, accelerator_config.topology, chips_per_host;
    for Ray Serve LLM, each LLMConfig's accelerator_type / accelerator_config). What an application
    left out is filled in from the slice; a declared value the slice contradicts is refused, naming the
    field. Single-host slices (and no slice) return the config as given: a replica there fits one host.
    """
    if tpu is None or not tpu.multi_host:
        return config
    return {**config, "applications": [_place_app(dict(app), tpu) for app in config.get("applications", [])]}


def _added(before: Any, after: Any, path: str) -> list[str]:
    """``path=value`` for each value of ``after`` that ``before`` lacks (mappings and lists walked)."""
    if isinstance(after, dict) and isinstance(before, dict | None):
        return [x for key, value in after.items() for x in _added((before or {}).get(key), value, f"{path}.{key}")]
    if isinstance(after, list) and isinstance(before, list) and len(before) == len(after):
        return [
            x for i, (old, new) in enumerate(zip(before, after, strict=True)) for x in _added(old, new, f"{path}[{i}]")
        ]
    return [] if before == after else [f"{path.lstrip('.')}={after}"]


def derived_placement(before: dict[str, Any], after: dict[str, Any], tpu: TpuSlice | None) -> list[str]:
    """One line per application whose args ``place_on_slice`` completed, naming each value it derived."""
    if tpu is None or after is before:
        return []
    lines = []
    for old, new in zip(before.get("applications", []), after.get("applications", []), strict=True):
        added = _added(old.get("args") or {}, new.get("args") or {}, "")
        if added:
            lines.append(
                f"derived {', '.join(added)} for app {new.get('name')} from the {tpu.generation.name} "
                f"{tpu.topology} slice"
            )
    return lines


def _replica_tpu(app: dict[str, Any], args: dict[str, Any]) -> tuple[float, int]:
    """(TPU one replica holds on one host, replicas) as the app's args and deployment overrides ask."""
    tpu = 0.0
    if args.get("accelerator_type") and args.get("chips_per_host"):
        # What an app given serve_tpu_args asks of each host (the replica's host, or each host of its slice).
        tpu = float(args["chips_per_host"]) * float(args.get("tpu_resource_per_chip", 1))
    replicas = int(args.get("num_replicas", 1) or 1)
    for dep in app.get("deployments") or []:
        tpu = max(tpu, float(((dep.get("ray_actor_options") or {}).get("resources") or {}).get("TPU", 0) or 0))
        replicas = max(replicas, int(dep.get("num_replicas", 1) or 1) if dep.get("num_replicas") != "auto" else 1)
    return tpu, replicas


def check_tpu_placement(config: dict[str, Any], tpu: TpuSlice | None) -> None:
    """Fail fast where Serve would hang or never place a replica, before anything is deployed.

    Without `accelerator_config.topology`, Serve falls back to per-chip bundles that can straddle
    two slices; the replica never finishes its first collective and the app sits in DEPLOYING
    forever with no error. Ray Serve LLM reads the topology from each LLMConfig. A replica asking
    for more TPU than one host has, or more replicas than the slices (multi-host) or hosts
    (single-host) can hold, would sit in DEPLOYING as well.
    """
    if tpu is None:
        return
    for app in config.get("applications", []):
        field = f"applications[{app.get('name')}].args"
        args = app.get("args") or {}
        llm_configs = args.get("llm_configs") or [args]
        for llm in llm_configs:
            if not isinstance(llm, dict):
                if tpu.multi_host:
                    raise UserInputError(
                        f"{field}.llm_configs", llm, "give the LLM config inline so its topology can be checked"
                    )
                continue
            accel = llm.get("accelerator_config") or {}
            if tpu.multi_host and (
                accel.get("topology") != tpu.topology
                or llm.get("accelerator_type") != tpu.generation.ray_accelerator_type
            ):
                want = tpu.serve_accelerator_config()
                raise UserInputError(
                    field,
                    {k: llm.get(k) for k in ("accelerator_type", "accelerator_config")},
                    f"a model on a multi-host {tpu.generation.name} {tpu.topology} slice must declare {want}; "
                    "without a topology Serve's replicas can straddle two slices and hang in DEPLOYING",
                )
        per_replica, replicas = _replica_tpu(app, args)
        host = tpu.logical_devices_per_host
        if per_replica > host:
            raise UserInputError(
                f"{field}.chips_per_host",
                per_replica,
                f"a {tpu.machine_type} host has {host} TPU; ask for at most {host} per replica "
                "(a model needing more spans a multi-host slice: give accelerator_config.topology)",
            )
        if tpu.multi_host:
            capacity, unit = tpu.num_slices, f"{tpu.topology} slice(s)"
        elif per_replica:
            capacity, unit = tpu.total_hosts * int(host // per_replica), f"replica(s) of {per_replica:g} TPU"
        else:
            continue
        if replicas > capacity:
            raise UserInputError(
                f"{field}.num_replicas",
                replicas,
                f"the serve slice holds {capacity} {unit} (each multi-host replica takes one whole slice); "
                f"lower num_replicas to {capacity} or serve on more slices",
            )


def application_names(config: dict[str, Any]) -> list[str]:
    return [str(a["name"]) for a in config.get("applications", [])]
