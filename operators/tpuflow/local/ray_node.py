"""``ray start`` for one node of a local cluster, its head on loopback: ``python -m tpuflow.local.ray_node start ...``.

Ray binds a node's servers to 127.0.0.1 only when the node's address is exactly loopback (``is_localhost``:
127.0.0.1 / localhost / ::1). Its CLI turns a loopback ``--node-ip-address`` / ``--address`` into the machine's
network address (``services.resolve_ip_for_localhost``) unless RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0, and with
that setting ``ray start`` refuses a non-head node ("Multi-node Ray clusters are not supported on Windows and
OSX"). Every node of a local cluster runs on this one machine, so this entry point is Ray's own CLI with that one
refusal lifted: the CLI's ``ENABLE_RAY_CLUSTER`` check reads True, while address resolution (Ray's services
module, and every Ray process the node starts, which inherit RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0) keeps
loopback as loopback. Written by hand because Ray offers no setting for it; it reads one attribute of Ray's
CLI module (pinned Ray 2.60; tests/local/test_cluster_exposure.py starts a head and a host through it).
"""

from __future__ import annotations

import sys
from types import ModuleType
from typing import Any


class _ClusterCheckLifted(ModuleType):
    """Ray's ray_constants module as the CLI's ``start`` sees it: multi-node allowed, everything else Ray's."""

    ENABLE_RAY_CLUSTER = True

    def __init__(self, constants: ModuleType) -> None:
        super().__init__(constants.__name__)
        self._constants = constants

    def __getattr__(self, name: str) -> Any:
        return getattr(self._constants, name)


def main() -> None:
    from ray.scripts import scripts

    scripts.ray_constants = _ClusterCheckLifted(scripts.ray_constants)  # type: ignore[attr-defined]
    sys.exit(scripts.main())


if __name__ == "__main__":
    main()
