"""Slice preflight: reserve the slice(s), one actor per host, one all-reduce, within a deadline.

    python -m tpuflow_driver.preflight --spec-json '<json>'

Spec keys: the ray.util.tpu.slice_placement_group arguments (topology, accelerator_version,
num_slices, chips_per_vm, tpu_resource_per_chip?) plus
    deadline_s   seconds for each step: the reservation, the roll call and the all-reduce (default 20)
    collective   "jax": jax.distributed + a jitted sum over every device of every host (what training
                 runs first); "tcp": the roll call's gather-sum alone (no JAX)

Seed 004's ray_core_collectives.py by hand, as a job: after the slices are reserved every host's
actor checks in with rank 0 over TCP (the roll call names the hosts that did not answer), then
all of them run one all-reduce of (rank + 1) per device; every rank must see the expected sum.
A slice whose hosts cannot reach each other fails here in seconds, instead of hanging the
training job's first collective while the chips bill.

Prints `TPUFLOW_RESULT {json}` on success; on failure one line `TPUFLOW_PREFLIGHT_FAILED <why>`
naming the hosts, and exits 1.

A simulated host (tpuflow.local.cluster) is made unreachable for collectives by the file its
TPUFLOW_SIM_UNREACHABLE_FLAG names: while it exists, that host's actor answers Ray but never
joins a collective, as a host whose data network is down.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tpuflow_driver.result import emit_result

FAILED_MARKER = "TPUFLOW_PREFLIGHT_FAILED"
UNREACHABLE_FLAG_ENV = "TPUFLOW_SIM_UNREACHABLE_FLAG"
COLLECTIVES = ("jax", "tcp")
_PG_KEYS = ("topology", "accelerator_version", "num_slices", "chips_per_vm", "tpu_resource_per_chip")

ACTOR_START_S = 120.0  # how long the probe actors may take to start (at least the per-step deadline)


class PreflightFailed(RuntimeError):
    """The slice failed its preflight; the message names the hosts."""


@dataclass(frozen=True)
class PreflightSpec:
    placement: dict[str, Any]
    deadline_s: float = 20.0
    collective: str = "jax"

    @classmethod
    def from_dict(cls, data: Any) -> PreflightSpec:
        if not isinstance(data, dict):
            raise ValueError("the preflight spec must be a JSON object")
        unknown = sorted(set(data) - {*_PG_KEYS, "deadline_s", "collective"})
        if unknown:
            raise ValueError(f"unknown preflight spec keys {unknown}")
        for key in ("topology", "accelerator_version"):
            if not isinstance(data.get(key), str) or not data[key]:
                raise ValueError(f"preflight spec key {key} must be a non-empty string")
        deadline = float(data.get("deadline_s", 20.0))
        if not 1 <= deadline <= 600:
            raise ValueError(f"deadline_s must be between 1 and 600 seconds, got {deadline}")
        collective = data.get("collective", "jax")
        if collective not in COLLECTIVES:
            raise ValueError(f"collective must be one of {COLLECTIVES}, got {collective!r}")
        placement = {k: data[k] for k in _PG_KEYS if data.get(k) is not None}
        return cls(placement, deadline, collective)


def _unreachable() -> bool:
    flag = os.environ.get(UNREACHABLE_FLAG_ENV)
    return bool(flag) and Path(flag).exists()


def _partitioned() -> None:
    """What a host whose data network is down does in a collective: never answers."""
    while True:
        time.sleep(3600)


def _recv_line(conn: socket.socket, deadline: float) -> dict[str, Any]:
    buf = b""
    while not buf.endswith(b"\n"):
        conn.settimeout(max(0.05, deadline - time.time()))
        chunk = conn.recv(4096)
        if not chunk:
            raise ConnectionError("peer closed the connection")
        buf += chunk
    return dict(json.loads(buf))


def _send_line(conn: socket.socket, data: dict[str, Any]) -> None:
    conn.sendall(json.dumps(data).encode() + b"\n")


class HostProbe:
    """One per host of the reserved slices (the Ray actor class is made in `run`)."""

    def __init__(self, rank: int, world: int, slice_index: int, num_slices: int) -> None:
        import ray

        self.rank, self.world = rank, world
        self.slice_index, self.num_slices = slice_index, num_slices
        self.ip = ray.util.get_node_ip_address()
        self.name = f"{os.environ.get('TPU_NAME', '?')}/worker-{os.environ.get('TPU_WORKER_ID', '?')}"
        self._server: socket.socket | None = None
        if rank == 0:  # the roll call's rendezvous, bound before anyone is told where it is
            self._server = socket.socket()
            self._server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self._server.bind((self.ip, 0))
            self._server.listen(world)

    def identity(self) -> dict[str, Any]:
        addr = f"{self.ip}:{self._server.getsockname()[1]}" if self._server else None
        return {"rank": self.rank, "host": self.name, "ip": self.ip, "slice_index": self.slice_index, "addr": addr}

    def free_port(self) -> int:
        """A free port on this host: JAX's coordinator is rank 0's, and only rank 0's host can pick one (the
        driver runs on the head, which cannot bind a TPU host's address on a real cluster)."""
        return _free_port(self.ip)

    def roll_call(self, addr: str, deadline: float) -> dict[str, Any]:
        """Rank 0 collects every rank's (rank + 1) and answers each with the sum; others check in."""
        if _unreachable():
            _partitioned()
        value = self.rank + 1
        if self.rank == 0:
            assert self._server is not None
            peers: dict[int, socket.socket] = {}
            while len(peers) < self.world - 1 and time.time() < deadline:
                self._server.settimeout(max(0.05, deadline - time.time()))
                try:
                    conn, _ = self._server.accept()
                    peers[int(_recv_line(conn, deadline)["rank"])] = conn
                except (TimeoutError, OSError, ValueError, KeyError):
                    continue
            missing = sorted(set(range(1, self.world)) - set(peers))
            total = value + sum(r + 1 for r in peers)
            for conn in peers.values():
                try:
                    _send_line(conn, {"sum": None if missing else total, "missing": missing})
                finally:
                    conn.close()
            return {"rank": 0, "sum": None if missing else total, "missing": missing}
        host, port = addr.rsplit(":", 1)
        while True:
            try:
                with socket.create_connection((host, int(port)), timeout=max(0.05, deadline - time.time())) as conn:
                    _send_line(conn, {"rank": self.rank, "value": value})
                    reply = _recv_line(conn, deadline + 5)
                return {"rank": self.rank, "sum": reply.get("sum"), "missing": reply.get("missing", [])}
            except OSError as err:
                if time.time() >= deadline:
                    return {"rank": self.rank, "sum": None, "missing": [], "error": f"cannot reach rank 0: {err}"}
                time.sleep(0.2)

    def all_reduce(self, coordinator: str, timeout_s: float) -> dict[str, Any]:
        """jax.distributed over every host, then one jitted sum of (rank + 1) on every device."""
        if _unreachable():
            _partitioned()
        if self.num_slices > 1:
            # What JaxTrainer sets on each worker of a multi-slice group (ray.train.v2.jax.config).
            from ray.util.tpu import get_tpu_coordinator_env_vars

            os.environ.update(
                get_tpu_coordinator_env_vars(coordinator.rsplit(":", 1)[0], self.num_slices, self.slice_index)
            )
        t0 = time.perf_counter()
        import jax
        import numpy as np
        from jax.sharding import Mesh, NamedSharding
        from jax.sharding import PartitionSpec as P

        jax.distributed.initialize(coordinator, self.world, self.rank, initialization_timeout=max(1, int(timeout_s)))
        try:
            init_s = time.perf_counter() - t0
            mesh = Mesh(np.array(jax.devices()), ("d",))
            local = np.full((jax.local_device_count(),), float(self.rank + 1), dtype=np.float32)
            arr = jax.make_array_from_process_local_data(NamedSharding(mesh, P("d")), local, (jax.device_count(),))
            total = jax.jit(lambda x: x.sum(), out_shardings=NamedSharding(mesh, P()))(arr)
            value = float(np.asarray(total.addressable_data(0)))
            return {
                "rank": self.rank,
                "sum": value,
                "devices": jax.device_count(),
                "local_devices": jax.local_device_count(),
                "platform": jax.devices()[0].platform,
                "init_s": round(init_s, 2),
                "megascale_slice_id": os.environ.get("MEGASCALE_SLICE_ID"),
            }
        finally:
            jax.distributed.shutdown()


def _free_port(ip: str) -> int:
    with socket.socket() as sock:
        sock.bind((ip, 0))
        return int(sock.getsockname()[1])


def _wait(refs: list[Any], timeout: float) -> tuple[dict[int, Any], list[int]]:
    """Results by position, and the positions that did not answer within `timeout` (or raised)."""
    import ray

    ready, _ = ray.wait(refs, num_returns=len(refs), timeout=max(0.1, timeout))
    got: dict[int, Any] = {}
    for i, ref in enumerate(refs):
        if ref in ready:
            try:
                got[i] = ray.get(ref)
            except Exception as err:  # the actor raised: it answered, with an error
                got[i] = {"error": f"{type(err).__name__}: {str(err).splitlines()[0][:200]}"}
    return got, [i for i in range(len(refs)) if i not in got]


def run(spec: PreflightSpec) -> dict[str, Any]:
    import ray
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
    from ray.util.tpu import slice_placement_group

    t_start = time.perf_counter()
    ray.init(logging_level="WARNING")
    where = (
        f"{spec.placement.get('num_slices', 1)} x {spec.placement['accelerator_version']} {spec.placement['topology']}"
    )
    deadline = spec.deadline_s
    try:
        handle = slice_placement_group(**spec.placement, head_reservation_timeout_s=deadline)
    except Exception as err:
        raise PreflightFailed(f"could not reserve {where} within {deadline:.0f}s: {err}") from None
    actors: list[Any] = []
    try:
        try:
            ray.get(handle.placement_group.ready(), timeout=deadline)
        except Exception:
            raise PreflightFailed(
                f"the hosts of {where} were not all free within {deadline:.0f}s (a host missing or busy)"
            ) from None
        reserve_s = time.perf_counter() - t_start
        world, per_slice = handle.num_bundles, handle.num_bundles // handle.num_slices
        probe = ray.remote(num_cpus=0)(HostProbe)
        actors = [
            probe.options(
                # the host's TPU devices, so on a real slice the actor's JAX sees that host's chips
                resources={"TPU": handle.devices_per_host},
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    placement_group=handle.placement_group, placement_group_bundle_index=i
                ),
            ).remote(i, world, i // per_slice, handle.num_slices)
            for i in range(world)
        ]
        # Starting an actor is a worker-process spawn (slow on a busy host), not a test of the interconnect:
        # it gets its own allowance, so the per-step deadline measures the roll call and the all-reduce.
        start_s = max(deadline, ACTOR_START_S)
        ids, silent = _wait([a.identity.remote() for a in actors], start_s)
        if silent:
            raise PreflightFailed(f"bundles {silent} of {where} never started their actor within {start_s:.0f}s")
        hosts = [ids[i]["host"] for i in range(world)]
        print(
            f"[preflight] reserved {where} in {reserve_s:.1f}s: "
            + ", ".join(f"rank {i} {h}" for i, h in enumerate(hosts)),
            flush=True,
        )

        t0 = time.perf_counter()
        calls = time.time() + deadline
        answers, silent = _wait([a.roll_call.remote(ids[0]["addr"], calls) for a in actors], deadline + 10)
        missing = set(silent) | set(answers.get(0, {}).get("missing", []))
        if missing:
            named = ", ".join(f"{hosts[i]} ({ids[i]['ip']})" for i in sorted(missing))
            raise PreflightFailed(
                f"{len(missing)} of {world} host(s) did not answer the roll call within {deadline:.0f}s: {named}"
            )
        roll_call_s = time.perf_counter() - t0
        expected_sum = world * (world + 1) / 2
        sums = {i: a.get("sum") for i, a in answers.items()}

        result: dict[str, Any] = {
            "ok": True,
            "hosts": hosts,
            "num_slices": handle.num_slices,
            "collective": spec.collective,
            "reserve_s": round(reserve_s, 2),
            "roll_call_s": round(roll_call_s, 2),
        }
        if spec.collective == "jax":
            t0 = time.perf_counter()
            port, silent = _wait([actors[0].free_port.remote()], deadline)
            if silent:
                raise PreflightFailed(f"{hosts[0]} did not name a free port within {deadline:.0f}s")
            coordinator = f"{ids[0]['ip']}:{port[0]}"
            answers, silent = _wait([a.all_reduce.remote(coordinator, deadline) for a in actors], deadline + 10)
            failed = {i: a["error"] for i, a in answers.items() if "error" in a}
            if silent or failed:
                named = ", ".join(f"{hosts[i]}" for i in sorted(silent))
                detail = "; ".join(f"{hosts[i]}: {e}" for i, e in sorted(failed.items()))
                raise PreflightFailed(
                    f"the all-reduce over {world} host(s) did not finish within {deadline:.0f}s"
                    + (f"; no answer from {named}" if named else "")
                    + (f"; {detail}" if detail else "")
                )
            devices = answers[0]["devices"]
            expected_sum = float(sum((i + 1) * answers[i]["local_devices"] for i in range(world)))
            sums = {i: a["sum"] for i, a in answers.items()}
            result.update(
                {
                    "devices": devices,
                    "platform": answers[0]["platform"],
                    "all_reduce_s": round(time.perf_counter() - t0, 2),
                    "jax_init_s": max(a["init_s"] for a in answers.values()),
                    "megascale_slice_ids": [answers[i]["megascale_slice_id"] for i in range(world)],
                }
            )
        wrong = {i: s for i, s in sums.items() if s != expected_sum}
        if wrong:
            raise PreflightFailed(
                f"the all-reduce gave wrong sums (expected {expected_sum}): "
                + ", ".join(f"{hosts[i]} saw {s}" for i, s in sorted(wrong.items()))
            )
        result.update({"expected_sum": expected_sum, "seconds": round(time.perf_counter() - t_start, 2)})
        print(f"[preflight] all {world} rank(s) saw the sum {expected_sum} ({spec.collective})", flush=True)
        return result
    finally:
        for actor in actors:
            ray.kill(actor)
        handle.shutdown()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m tpuflow_driver.preflight", description=__doc__.split("\n")[0])
    p.add_argument("--spec-json", required=True, help="the spec as a JSON string")
    args = p.parse_args(argv)
    try:
        spec = PreflightSpec.from_dict(json.loads(args.spec_json))
    except (ValueError, TypeError) as err:
        print(f"{FAILED_MARKER} bad spec: {err}", flush=True)
        sys.exit(2)
    try:
        emit_result(run(spec))
    except PreflightFailed as err:
        print(f"{FAILED_MARKER} {err}", flush=True)
        sys.exit(1)


if __name__ == "__main__":
    main()
