"""Service addresses, as kube-proxy makes them work: each ClusterIP Service's address and ports forward to its
ready endpoints (EndpointSlices written by the real endpointslice controller).

The address is put on the pod bridge as a /32, so pods (through their default route) and the host reach it;
a ``TcpForwarder`` per Service port picks the next ready endpoint per connection (round robin). Headless
Services (clusterIP None) get no address: their names resolve to the pods (network.write_hosts).
"""

from __future__ import annotations

import contextlib
import itertools
import threading
from collections.abc import Iterable, Mapping
from typing import Any

from tpuflow_rehearsal.nodes.network import NetworkError, _ip
from tpuflow_rehearsal.nodes.tcp_forward import TcpForwarder


def _key(service: Mapping[str, Any]) -> str:
    meta = service.get("metadata") or {}
    return f"{meta.get('namespace', 'default')}/{meta.get('name', '')}"


class ServiceProxy:
    def __init__(self, bridge: str) -> None:
        self.bridge = bridge
        self._lock = threading.Lock()
        self._addresses: set[str] = set()
        self._forwarders: dict[tuple[str, int], TcpForwarder] = {}
        self._endpoints: dict[tuple[str, str], list[tuple[str, int]]] = {}  # (service key, port name) -> targets
        self._turns: dict[tuple[str, str], itertools.count[int]] = {}

    def sync(self, services: Iterable[Mapping[str, Any]], slices: Iterable[Mapping[str, Any]]) -> None:
        endpoints: dict[tuple[str, str], list[tuple[str, int]]] = {}
        for piece in slices:
            meta = piece.get("metadata") or {}
            owner = (meta.get("labels") or {}).get("kubernetes.io/service-name")
            if not owner:
                continue
            key = f"{meta.get('namespace', 'default')}/{owner}"
            ready = [
                address
                for ep in piece.get("endpoints") or []
                if ((ep.get("conditions") or {}).get("ready") is not False)
                for address in ep.get("addresses") or []
            ]
            for port in piece.get("ports") or []:
                if port.get("port"):
                    endpoints.setdefault((key, str(port.get("name") or "")), []).extend(
                        (address, int(port["port"])) for address in ready
                    )
        wanted: dict[tuple[str, int], tuple[str, str]] = {}
        for service in services:
            spec = service.get("spec") or {}
            ip = spec.get("clusterIP")
            if not ip or ip == "None" or spec.get("type") not in (None, "ClusterIP", "NodePort", "LoadBalancer"):
                continue
            for port in spec.get("ports") or []:
                wanted[(ip, int(port["port"]))] = (_key(service), str(port.get("name") or ""))
        with self._lock:
            self._endpoints = endpoints
        for address in {ip for ip, _ in wanted} - self._addresses:
            with contextlib.suppress(NetworkError):
                _ip("addr", "add", f"{address}/32", "dev", self.bridge)
                self._addresses.add(address)
        for listen, target in wanted.items():
            if listen not in self._forwarders and listen[0] in self._addresses:
                with contextlib.suppress(OSError):
                    self._forwarders[listen] = TcpForwarder(listen, self._picker(*target)).start()
        for listen in set(self._forwarders) - set(wanted):
            self._forwarders.pop(listen).stop()
        for address in self._addresses - {ip for ip, _ in wanted}:
            _ip("addr", "del", f"{address}/32", "dev", self.bridge, check=False)
            self._addresses.discard(address)

    def _picker(self, service: str, port_name: str) -> Any:
        def pick() -> tuple[str, int] | None:
            with self._lock:
                targets = self._endpoints.get((service, port_name)) or []
                turn = self._turns.setdefault((service, port_name), itertools.count())
                return targets[next(turn) % len(targets)] if targets else None

        return pick

    def stop(self) -> None:
        for forwarder in self._forwarders.values():
            forwarder.stop()
        self._forwarders.clear()
        for address in self._addresses:
            _ip("addr", "del", f"{address}/32", "dev", self.bridge, check=False)
        self._addresses.clear()
