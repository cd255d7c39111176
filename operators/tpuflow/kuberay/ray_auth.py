"""Ray token authentication on every RayCluster and RayService tpuflow applies.

KubeRay (>= 1.5.1) turns Ray token authentication on with a RayCluster's ``spec.authOptions.mode: token``
(a RayService's ``spec.rayClusterConfig.authOptions``): it creates a Secret holding a random token and
sets RAY_AUTH_MODE / RAY_AUTH_TOKEN on every Ray container, so the dashboard, the Jobs API and Serve's
REST API refuse callers without the token. Without it any pod that reaches the head Service can submit
a Ray job that runs as the Ray pods' service account.

``with_cluster_auth`` is the one place that decides a cluster spec's authOptions, for the built templates,
user manifests, RayServices and the pipelines' own clusters alike:

- ``ray_auth="token"`` (the default): a spec without authOptions is completed with ``mode: token``; a spec
  that turns authentication off itself is refused (one line naming the field and both ways out).
- ``ray_auth="disabled"`` (or ``"none"``): the user opts out by name; a spec without authOptions gets
  ``mode: disabled`` (recorded, so the choice is visible in the applied object); a spec's own
  ``mode: token`` is kept (the stricter choice of the two).

Pure: no Kubernetes client, no I/O, no logging (callers log what was completed).
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping
from typing import Any

from tpuflow.errors import UserInputError

TOKEN, DISABLED = "token", "disabled"
# ray_auth values a user may write, and the authOptions mode each means.
RAY_AUTH_VALUES: Mapping[str, str] = {"token": TOKEN, "disabled": DISABLED, "none": DISABLED}
MIN_TOKEN_AUTH_RAY = (2, 52, 0)
_VERSION_RE = re.compile(r"^(\d+)\.(\d+)\.(\d+)")


def auth_mode(ray_auth: object) -> str:
    """The authOptions mode ``ray_auth`` names ("token" or "disabled"); anything else is the user's mistake."""
    mode = RAY_AUTH_VALUES.get(ray_auth) if isinstance(ray_auth, str) else None
    if mode is None:
        raise UserInputError(
            "ray_auth",
            ray_auth,
            "use 'token' (Ray token authentication, the default), or opt out by name with 'disabled' or 'none'",
        )
    return mode


def with_cluster_auth(
    cluster_spec: Mapping[str, Any], ray_auth: object, *, field: str = "spec"
) -> tuple[dict[str, Any], bool]:
    """A RayCluster spec (or a RayService's rayClusterConfig) carrying the authOptions ``ray_auth`` asks for.

    Returns the new spec (the argument is not changed) and whether authOptions had to be added. ``field``
    names the spec in error messages, e.g. ``manifest.spec``.
    """
    mode = auth_mode(ray_auth)
    spec = copy.deepcopy(dict(cluster_spec))
    given = spec.get("authOptions")
    if given is not None and not isinstance(given, Mapping):
        raise UserInputError(f"{field}.authOptions", given, "give a mapping such as {mode: token}, or leave it out")
    options = dict(given or {})
    own_mode = options.get("mode")
    if own_mode not in (None, TOKEN, DISABLED):
        raise UserInputError(f"{field}.authOptions.mode", own_mode, "KubeRay accepts 'token' or 'disabled'")
    if mode == TOKEN and own_mode == DISABLED:
        raise UserInputError(
            f"{field}.authOptions.mode",
            own_mode,
            "this turns Ray token authentication off while ray_auth='token': remove authOptions (tpuflow adds "
            "mode: token), or opt out by name with ray_auth='disabled'",
        )
    added = own_mode is None
    options["mode"] = own_mode or mode
    if options["mode"] == TOKEN:
        _check_ray_version(spec.get("rayVersion"), field)
    spec["authOptions"] = options
    return spec, added


def _check_ray_version(version: object, field: str) -> None:
    match = _VERSION_RE.match(str(version)) if version is not None else None
    if match and tuple(int(p) for p in match.groups()) < MIN_TOKEN_AUTH_RAY:
        raise UserInputError(
            f"{field}.rayVersion",
            version,
            "Ray token authentication needs Ray 2.52.0 or newer; use a newer image, or opt out with "
            "ray_auth='disabled'",
        )
