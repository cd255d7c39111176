"""One Serve replica spanning a whole multi-host TPU slice: the seeds' deferred placement group, by hand.

With ``accelerator_config.topology`` (Ray Serve LLM's TPUAccelerator with a topology), Serve creates
no placement group for the replica. The replica itself, requesting no TPU, reserves one whole slice
with ``ray.util.tpu.slice_placement_group`` when it starts, places one ``SliceHost`` actor per host in
it (each holding its host's TPU), joins them with ``jax.distributed`` into one mesh over the slice, and
answers each request with one SPMD program over that mesh. Without a topology (the straddling case,
kept only so tests can show it) Serve hands the replica per-chip bundles of its own placement group,
which may cover hosts of two slices.

``SlicePredictor`` is an ``addition.inference.Decoder``, as ``Predictor`` is, so the OpenAI routes call
either one. Every host runs the same decode loop (``addition.inference.LogitsDecoder`` over the mesh,
same prompts, same rng state), each step one SPMD
program over the mesh: ``complete`` runs a whole decode per call, ``stream`` one step per call on every
host, so a streamed token leaves the replica as soon as the step that wrote it returns. Calls are sent
to the hosts under one lock, so every host runs the requests' programs in the same order.
"""

from __future__ import annotations

import logging
import math
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import ray
from addition.inference import Batch, Completion, Decoder, LogitsDecoder, Step

logger = logging.getLogger("ray.serve")

SLICE_NAME_LABEL = "ray.io/tpu-slice-name"
WORKER_ID_LABEL = "ray.io/tpu-worker-id"
POD_TYPE_LABEL = "ray.io/tpu-pod-type"
ACCELERATOR_LABEL = "ray.io/accelerator-type"
# CPU each host's worker takes from its bundle: the replica itself (0.25 CPU, pinned to a TPU host)
# must still fit beside it on a simulated host with one CPU.
WORKER_CPUS = 0.5
# How long one reservation attempt waits for its slice before trying another intact slice.
ATTEMPT_TIMEOUT_S = 20.0
JOIN_TIMEOUT_S = 300.0
PING_TIMEOUT_S = 10.0


def chips_in(topology: str) -> int:
    return math.prod(int(d) for d in topology.lower().split("x"))


@dataclass(frozen=True)
class SliceShape:
    """What the replica reserves: from the Serve config's args (derived from tpuflow's TpuSlice)."""

    accelerator_type: str  # Ray's name, e.g. TPU-V6E
    topology: str | None  # None: no accelerator_config.topology (per-chip bundles from Serve)
    chips_per_host: int
    tpu_resource_per_chip: int = 1
    num_devices: int | None = None  # chips the model needs when there is no topology

    @property
    def accelerator_version(self) -> str:
        from ray.util.tpu import get_tpu_version_from_type

        return get_tpu_version_from_type(self.accelerator_type)

    @property
    def tpu_per_host(self) -> int:
        return self.chips_per_host * self.tpu_resource_per_chip

    @property
    def num_hosts(self) -> int:
        chips = chips_in(self.topology) if self.topology else int(self.num_devices or 0)
        return max(1, chips // self.chips_per_host)

    @property
    def pod_type(self) -> str | None:
        from ray._private.accelerators.tpu import infer_tpu_pod_type_from_topology

        return infer_tpu_pod_type_from_topology(self.topology, self.accelerator_type) if self.topology else None


@ray.remote
class SliceHost:
    """One TPU host's process of the slice-wide model: its own share of the batch, one process of the mesh."""

    def __init__(self, params: dict[str, np.ndarray], meta: Any):
        self.params_np, self.meta = params, meta
        self._decoder: LogitsDecoder | None = None  # once joined: the decode over the whole mesh
        self._joined = False
        self._streams: dict[str, Iterator[Step]] = {}  # decodes streamed one step per call, by request id

    def identity(self) -> dict[str, Any]:
        """Where this worker runs: its node and, on a TPU host, the slice and worker id Ray labelled it with."""
        ctx = ray.get_runtime_context()
        labels = ctx.get_node_labels() or {}
        return {
            "node_id": ctx.get_node_id(),
            "slice_name": labels.get(SLICE_NAME_LABEL, os.environ.get("TPU_NAME", "")),
            "worker_id": labels.get(WORKER_ID_LABEL, os.environ.get("TPU_WORKER_ID", "")),
            "pod_type": labels.get(POD_TYPE_LABEL, ""),
            "pid": os.getpid(),
            "ip": ray.util.get_node_ip_address(),
        }

    def coordinator_address(self) -> str:
        with socket.socket() as sock:
            sock.bind((ray.util.get_node_ip_address(), 0))
            port = sock.getsockname()[1]
        return f"{ray.util.get_node_ip_address()}:{port}"

    def join(self, coordinator: str, peers: list[dict[str, Any]], process_id: int, hosts_per_slice: int) -> int:
        """Join the slice's mesh; returns the number of devices in it.

        A multi-host TPU program must hold every host of one slice (libtpu waits at start-up for the
        slice's other workers, named by TPU_WORKER_HOSTNAMES, and never for hosts of another slice).
        The simulated host waits the same way when its peers are not exactly its own slice's hosts,
        which is how a straddling placement hangs.
        """
        me = peers[process_id]
        if me["slice_name"]:
            mine = sorted(str(p["worker_id"]) for p in peers if p["slice_name"] == me["slice_name"])
            want = sorted(str(i) for i in range(hosts_per_slice))
            if mine != want or len({p["slice_name"] for p in peers}) > 1:
                slices = sorted({f"{p['slice_name']}/w{p['worker_id']}" for p in peers})
                logger.warning(
                    "TPU worker %s/w%s waits for the rest of its slice (hosts %s of %s): this program spans %s",
                    me["slice_name"], me["worker_id"], want, me["slice_name"], slices,
                )  # fmt: skip
                while True:  # what libtpu does: no error, no progress
                    time.sleep(3600)
        import jax

        jax.distributed.initialize(coordinator, len(peers), process_id)
        self._joined = True
        self._decoder = LogitsDecoder(_mesh_logits(self.params_np, self.meta.model), self.meta.task)
        return jax.device_count()

    def complete(self, batch: Batch, temperature: float, rng: np.random.Generator | None) -> list[Completion]:
        """Every host runs the same decode (same prompts, same rng state): one SPMD program per step."""
        assert self._decoder is not None, "join the mesh first"
        return self._decoder.complete_batch(batch, temperature, rng)

    def start(self, request_id: str, batch: Batch, temperature: float, rng: np.random.Generator | None) -> None:
        """Set up a decode that `step` advances one step per call (the same on every host)."""
        assert self._decoder is not None, "join the mesh first"
        self._streams[request_id] = self._decoder.stream_batch(batch, temperature, rng)

    def step(self, request_id: str) -> Step | None:
        """The decode's next step; None once it is over (or was dropped)."""
        steps = self._streams.get(request_id)
        step = None if steps is None else next(steps, None)
        if step is None:
            self._streams.pop(request_id, None)
        return step

    def drop(self, request_id: str) -> None:
        """Forget a decode its request stopped reading (timed out, client gone)."""
        self._streams.pop(request_id, None)

    def ping(self) -> bool:
        return self._joined

    def leave(self) -> None:
        if self._joined:
            import jax

            self._joined = False
            jax.distributed.shutdown()


def _mesh_logits(params: dict[str, np.ndarray], cfg: Any) -> Any:
    """logits(ids) over a mesh of every process's devices; ids are the same on every process.

    Parameters are REPLICATED on every host, the batch is SHARDED over them: the model is about 100k
    parameters (under 1 MB), so sharding it would save no memory and would add a collective per layer
    per decode step over the hosts' network; each host instead computes its rows, and the logits are
    all-gathered (out_shardings replicated) so every host continues the same decode. A model too big
    for one host would shard its weights over the same mesh (tensor parallel) instead.
    """
    import jax
    import jax.numpy as jnp
    from addition.model_jax import forward
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = Mesh(np.array(jax.devices()), ("hosts",))
    replicated, by_row = NamedSharding(mesh, P()), NamedSharding(mesh, P("hosts"))
    jparams = {k: jax.make_array_from_callback(v.shape, replicated, lambda idx, v=v: v[idx]) for k, v in params.items()}
    fn = jax.jit(lambda p, ids: forward(p, ids, cfg, jnp), out_shardings=replicated)
    n = jax.device_count()

    def logits(ids: np.ndarray) -> np.ndarray:
        rows = ids.shape[0]
        padded = np.concatenate([ids, np.repeat(ids[-1:], (-rows) % n, axis=0)]) if rows % n else ids
        gids = jax.make_array_from_callback(padded.shape, by_row, lambda idx: padded[idx])
        out = fn(jparams, gids)
        return np.asarray(out.addressable_data(0))[:rows]

    return logits


class SlicePredictor(Decoder):
    """The replica's model: a whole slice reserved at start-up, one SliceHost per host, one mesh."""

    def __init__(self, params: dict[str, np.ndarray], meta: Any, shape: SliceShape, reserve_timeout_s: float = 900.0):
        self.meta, self.spec, self.shape, self.backend = meta, meta.task, shape, "jax-slice"
        self._slice: Any = None  # the SlicePlacementGroup this replica owns (released on shutdown)
        self.workers: list[Any] = []
        self._send = threading.Lock()  # calls reach every host in one order (requests run in threads)
        try:
            pg, bundles = self._placement(reserve_timeout_s)
            self._start_workers(pg, bundles, params, meta)
        except BaseException:
            self.shutdown()
            raise

    # --- placement ---------------------------------------------------------------
    def _placement(self, timeout_s: float) -> tuple[Any, list[int]]:
        """The placement group the workers go into, and the bundle index of each host's worker."""
        if not self.shape.topology:
            # Serve created the group from the per-chip bundles (bundle 0 holds the replica itself).
            pg = ray.util.get_current_placement_group()
            if pg is None:
                raise RuntimeError("a TPU replica without a topology needs Serve's placement_group_bundles")
            return pg, _one_bundle_per_node(pg)
        deadline = time.time() + timeout_s
        while True:
            for slice_name in self._intact_slices():
                handle = self._reserve(slice_name)
                ready, _ = ray.wait([handle.placement_group.ready()], timeout=ATTEMPT_TIMEOUT_S)
                if ready:
                    self._slice = handle
                    logger.info("Reserved TPU slice %s (%d hosts) for this replica", slice_name, self.shape.num_hosts)
                    return handle.placement_group, list(range(self.shape.num_hosts))
                handle.shutdown()  # busy or broken meanwhile: let another replica have it
            if time.time() > deadline:
                raise TimeoutError(
                    f"no intact, free {self.shape.accelerator_type} {self.shape.topology} slice within {timeout_s:.0f}s"
                )
            time.sleep(2.0)

    def _reserve(self, slice_name: str) -> Any:
        from ray.util.tpu import slice_placement_group

        shape = self.shape
        return slice_placement_group(
            shape.topology,
            shape.accelerator_version,
            resources_per_bundle={
                "TPU": shape.tpu_per_host,
                "CPU": WORKER_CPUS,
                f"accelerator_type:{shape.accelerator_type}": 0.001,
            },
            chips_per_vm=shape.chips_per_host,
            tpu_resource_per_chip=shape.tpu_resource_per_chip,
            bundle_label_selector=[{SLICE_NAME_LABEL: slice_name}] * shape.num_hosts,
        )

    def _intact_slices(self) -> list[str]:
        """Slices of our pod type whose every host is alive, idle ones first.

        slice_placement_group alone reserves the head of ANY slice of the shape, including one that
        lost a host (its worker bundles would then wait forever); naming an intact slice avoids that.
        """
        by_slice: dict[str, list[dict[str, Any]]] = {}
        for node in ray.nodes():
            labels = node.get("Labels") or {}
            if node.get("Alive") and labels.get(POD_TYPE_LABEL) == self.shape.pod_type:
                by_slice.setdefault(labels.get(SLICE_NAME_LABEL, ""), []).append(node)
        intact = {
            name: nodes
            for name, nodes in by_slice.items()
            if name
            and sum((n.get("Resources") or {}).get("TPU", 0) for n in nodes)
            == chips_in(self.shape.topology or "1") * self.shape.tpu_resource_per_chip
        }
        try:
            from ray._private.state import available_resources_per_node

            free = available_resources_per_node()

            def busy(name: str) -> bool:
                return any(
                    free.get(n["NodeID"], {}).get("TPU", 0) < (n.get("Resources") or {}).get("TPU", 0)
                    for n in intact[name]
                )
        except Exception:  # a private helper of ray.util.tpu: without it, try every intact slice

            def busy(name: str) -> bool:
                return False

        return sorted(intact, key=lambda name: (busy(name), name))

    def _start_workers(self, pg: Any, bundles: list[int], params: dict[str, np.ndarray], meta: Any) -> None:
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        tpu = self.shape.tpu_per_host if self.shape.topology else 1
        params_ref = ray.put(params)
        self.workers = [
            SliceHost.options(
                num_cpus=WORKER_CPUS if self.shape.topology else 0,
                resources={"TPU": tpu},
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    placement_group=pg, placement_group_bundle_index=i
                ),
            ).remote(params_ref, meta)
            for i in bundles
        ]
        self.hosts = ray.get([w.identity.remote() for w in self.workers])
        # Process 0 of the mesh is TPU worker 0 when there is one (JAX's coordinator on the slice's first host).
        order = sorted(
            range(len(self.hosts)), key=lambda i: (self.hosts[i]["slice_name"], str(self.hosts[i]["worker_id"]))
        )
        self.workers = [self.workers[i] for i in order]
        self.hosts = [self.hosts[i] for i in order]
        coordinator = ray.get(self.workers[0].coordinator_address.remote())
        logger.info(
            "Joining %d hosts into one mesh: %s",
            len(self.hosts),
            [f"{h['slice_name']}/w{h['worker_id']}" for h in self.hosts],
        )
        devices = ray.get(
            [w.join.remote(coordinator, self.hosts, i, self.shape.num_hosts) for i, w in enumerate(self.workers)],
            timeout=None,
        )
        self.num_devices = devices[0]

    # --- serving (Decoder's complete and stream tokenize the prompts) ---------------
    def complete_batch(self, batch: Batch, temperature: float, rng: np.random.Generator | None) -> list[Completion]:
        with self._send:
            refs = [w.complete.remote(batch, temperature, rng) for w in self.workers]
        return ray.get(refs)[0]  # every host decoded the same completions

    def stream_batch(self, batch: Batch, temperature: float, rng: np.random.Generator | None) -> Iterator[Step]:
        """Each decode step is one call on every host, so its tokens are here as soon as the mesh has
        computed them; the hosts start the decode at the first step."""
        return self._steps(uuid.uuid4().hex, batch, temperature, rng)

    def _steps(
        self, request_id: str, batch: Batch, temperature: float, rng: np.random.Generator | None
    ) -> Iterator[Step]:
        over = False
        try:
            with self._send:
                started = [w.start.remote(request_id, batch, temperature, rng) for w in self.workers]
            ray.get(started)
            while True:
                with self._send:
                    refs = [w.step.remote(request_id) for w in self.workers]
                step = ray.get(refs)[0]  # every host computed the same step
                if step is None:
                    over = True
                    return
                yield step
        finally:
            if not over:  # closed early: the hosts drop the decode (no SPMD program: any order will do)
                for w in self.workers:
                    w.drop.remote(request_id)

    def check_health(self) -> None:
        """Raise when a host's worker is gone: Serve then replaces the whole replica (and its slice)."""
        ray.get([w.ping.remote() for w in self.workers], timeout=PING_TIMEOUT_S)

    def shutdown(self) -> None:
        """Stop the workers and release the slice; idempotent."""
        for w in self.workers:
            try:
                ray.kill(w)
            except Exception:  # already dead with its host
                pass
        self.workers = []
        if self._slice is not None:
            self._slice.shutdown()
            self._slice = None


def _one_bundle_per_node(pg: Any) -> list[int]:
    """For per-chip bundles: one worker per host the bundles landed on (the first TPU bundle there)."""
    ray.get(pg.ready())
    table = ray.util.placement_group_table(pg)
    chosen: dict[str, int] = {}
    for index, node in sorted(table["bundles_to_node_id"].items()):
        if (table["bundles"][index] or {}).get("TPU", 0) > 0:
            chosen.setdefault(node, int(index))
    return sorted(chosen.values())
