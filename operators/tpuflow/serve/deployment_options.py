"""Ray Serve deployment settings, checked before anything is deployed.

One `DeploymentOptions` becomes, for a Serve config:
- a `deployments:` entry (`deployment_entry`): replicas or autoscaling_config, max_ongoing_requests,
  max_queued_requests, health checks, graceful shutdown, and the deployment's `user_config`: the app's
  own settings (request limits, batching, ...), passed through as given; which keys an app reads, and
  its defaults, are the app's (a pipeline Workload's ``serve_user_config`` / ``check_serve_user_config``);
- `http_options.request_timeout_s` (`http_options`): the proxy's deadline for every request;
- an LLMConfig `deployment_config` (`llm_deployment_config`) for Ray Serve LLM.

Serve drops unknown fields silently and reports bad values only once the app deploys, so every field
is checked here and a mistake names the field and the fix.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

from tpuflow.errors import UserInputError

FIELD = "deployment_options"
# ray.serve.config.AutoscalingConfig's plain fields (a custom policy is out of scope here).
AUTOSCALING_KEYS = frozenset(
    {
        "min_replicas",
        "initial_replicas",
        "max_replicas",
        "target_ongoing_requests",
        "metrics_interval_s",
        "look_back_period_s",
        "smoothing_factor",
        "upscale_smoothing_factor",
        "downscale_smoothing_factor",
        "upscaling_factor",
        "downscaling_factor",
        "downscale_delay_s",
        "downscale_to_zero_delay_s",
        "upscale_delay_s",
    }
)
_REPLICA_COUNTS = ("min_replicas", "initial_replicas", "max_replicas")
_SERVE_KEYS = (
    "max_ongoing_requests",
    "max_queued_requests",
    "health_check_period_s",
    "health_check_timeout_s",
    "graceful_shutdown_timeout_s",
)


def _is_number(value: object) -> bool:
    """A finite real number (NaN and infinity pass every comparison Serve's checks make)."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _positive_int(name: str, value: object, *, minimum: int = 1, fix: str = "") -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise UserInputError(f"{FIELD}.{name}", value, fix or f"give a whole number >= {minimum}")


def _positive_seconds(name: str, value: object) -> None:
    if value is not None and (not _is_number(value) or value <= 0):  # type: ignore[operator]
        raise UserInputError(f"{FIELD}.{name}", value, "give a positive, finite number of seconds")


@dataclass(frozen=True)
class DeploymentOptions:
    """Serve settings of one deployment (each None: Serve's or the app's default).

    :param num_replicas: fixed replica count (on TPU: one replica per slice).
    :param autoscaling_config: ray.serve AutoscalingConfig fields, e.g. {"min_replicas": 1, "max_replicas": 4,
        "target_ongoing_requests": 8}; replaces num_replicas (Serve's num_replicas="auto").
    :param max_ongoing_requests: requests a replica handles at once (Serve's default of 5 collapses under
        concurrent load); the rest queue in the proxy.
    :param max_queued_requests: requests queued per caller before Serve answers 503 (-1: unbounded).
    :param request_timeout_s: the proxy's deadline (http_options: a plain-text 408 past it); an app with
        a deadline of its own takes it in its user_config.
    :param health_check_period_s: / health_check_timeout_s / graceful_shutdown_timeout_s: Serve's.
    :param user_config: the deployment's user_config, passed to the replicas' ``reconfigure`` as given
        (JSON; Serve applies a change without restarting them): the app's own settings, e.g. its request
        limits or batching. Its keys are the app's; a workload may check them before deploying.
    """

    num_replicas: int | None = None
    autoscaling_config: Mapping[str, Any] | None = None
    max_ongoing_requests: int | None = None
    max_queued_requests: int | None = None
    request_timeout_s: float | None = None
    health_check_period_s: float | None = None
    health_check_timeout_s: float | None = None
    graceful_shutdown_timeout_s: float | None = None
    user_config: Mapping[str, Any] | None = None

    @classmethod
    def from_value(cls, value: DeploymentOptions | Mapping[str, Any] | None) -> DeploymentOptions:
        """Accept the options, a dict of their fields (e.g. rendered from a template), or None."""
        if value is None:
            return cls()
        if isinstance(value, DeploymentOptions):
            return value.validated()
        if not isinstance(value, Mapping):
            raise UserInputError(FIELD, value, "give a dict of Serve deployment settings, e.g. {'num_replicas': 2}")
        known = [f.name for f in fields(cls)]
        unknown = sorted(set(value) - set(known))
        if unknown:
            raise UserInputError(
                FIELD,
                unknown,
                f"unknown setting(s); known: {', '.join(known)} (the app's own settings go in user_config)",
            )
        return cls(**dict(value)).validated()

    def validated(self) -> DeploymentOptions:
        _positive_int("num_replicas", self.num_replicas)
        if self.autoscaling_config is not None:
            self._check_autoscaling()
            if self.num_replicas is not None:
                raise UserInputError(
                    f"{FIELD}.num_replicas", self.num_replicas, "give num_replicas or autoscaling_config, not both"
                )
        _positive_int("max_ongoing_requests", self.max_ongoing_requests)
        if self.max_queued_requests is not None and self.max_queued_requests != -1:
            _positive_int("max_queued_requests", self.max_queued_requests, fix="give a whole number >= 1, or -1")
        for name in (
            "request_timeout_s",
            "health_check_period_s",
            "health_check_timeout_s",
            "graceful_shutdown_timeout_s",
        ):
            _positive_seconds(name, getattr(self, name))
        check_user_config(f"{FIELD}.user_config", self.user_config)
        return self

    def _check_autoscaling(self) -> None:
        cfg = self.autoscaling_config
        where = f"{FIELD}.autoscaling_config"
        if not isinstance(cfg, Mapping) or not cfg:
            raise UserInputError(where, cfg, "give e.g. {'min_replicas': 1, 'max_replicas': 4}")
        unknown = sorted(set(cfg) - AUTOSCALING_KEYS)
        if unknown:
            raise UserInputError(
                where, unknown, f"Serve's autoscaling_config knows {', '.join(sorted(AUTOSCALING_KEYS))}"
            )
        for key, value in cfg.items():
            if key in _REPLICA_COUNTS:
                _positive_int(f"autoscaling_config.{key}", value, minimum=0 if key != "max_replicas" else 1)
            elif not _is_number(value) or value < 0 or (value == 0 and not key.endswith("delay_s")):
                raise UserInputError(f"{where}.{key}", value, "give a positive number")
        low, high = cfg.get("min_replicas", 1), cfg.get("max_replicas", 1)
        if low > high:
            raise UserInputError(f"{where}.min_replicas", low, f"must not exceed max_replicas ({high})")
        initial = cfg.get("initial_replicas")
        if initial is not None and not low <= initial <= high:
            raise UserInputError(f"{where}.initial_replicas", initial, f"give a count between {low} and {high}")

    # --- what goes into a Serve config ---
    def _serve_settings(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.autoscaling_config is not None:
            out["num_replicas"] = "auto"
            out["autoscaling_config"] = dict(self.autoscaling_config)
        elif self.num_replicas is not None:
            out["num_replicas"] = self.num_replicas
        for key in _SERVE_KEYS:
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        return out

    def deployment_entry(self, name: str, *, user_config_defaults: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """One item of an application's `deployments:` list (Serve overrides the code's options with it).

        ``user_config_defaults``: the app's own defaults (e.g. its workload's), under this user_config's keys."""
        entry: dict[str, Any] = {"name": name, **self._serve_settings()}
        user_config = {**(user_config_defaults or {}), **(self.user_config or {})}
        if user_config:
            entry["user_config"] = user_config
        return entry

    def http_options(self) -> dict[str, Any]:
        return {} if self.request_timeout_s is None else {"request_timeout_s": self.request_timeout_s}

    def llm_deployment_config(self) -> dict[str, Any]:
        """LLMConfig.deployment_config (Ray Serve LLM's server deployment; it reads no user_config)."""
        if self.user_config:
            raise UserInputError(
                f"{FIELD}.user_config",
                dict(self.user_config),
                "Ray Serve LLM's server reads no user_config; use max_ongoing_requests / max_queued_requests",
            )
        return self._serve_settings()

    def is_empty(self) -> bool:
        return all(v is None for v in asdict(self).values())


def check_user_config(field: str, value: object) -> dict[str, Any] | None:
    """A deployment's user_config as Serve takes it: a mapping with text keys that JSON can carry
    (it travels in the Serve config and the RayService manifest); None: none."""
    if value is None:
        return None
    if not isinstance(value, Mapping) or not all(isinstance(k, str) and k for k in value):
        raise UserInputError(
            field, value, "give the app's settings as a dict with text keys, e.g. {'max_batch_size': 8}"
        )
    try:
        json.dumps(dict(value), allow_nan=False)
    except (TypeError, ValueError):
        raise UserInputError(field, value, "give JSON values (text, finite numbers, booleans, lists, dicts)") from None
    return dict(value)
