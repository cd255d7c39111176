"""Data-parallel JAX training of the addition model, for ray.train.v2.jax.JaxTrainer.

`train_loop_per_worker` runs on every worker. jax is imported inside functions only: the
driver imports this module to find the function and must not initialise a JAX backend
(on a TPU host that would take the chips away from the workers).

`train_local` runs the same step function in one process on in-memory tokens (tests,
quick experiments, no Ray).
"""

from __future__ import annotations

import os
import socket
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
from addition import checkpoint as ckpt
from addition.data import loss_mask
from addition.heldout import evaluation_at_the_end
from addition.model_jax import init_params, make_optimizer, make_train_step
from addition.training import (
    CachedEpochs,
    RunMetrics,
    checkpoint_checks,
    fingerprint,
    fit,
    model_config,
    preemption_notice,
    resolve_config,
    shuffle_seed,
)
from tpuflow_driver.goodput import StepClock


class DataParallelState:
    """Parameters and optimizer state replicated over a 1-D "data" mesh of every device in the job.

    The mesh uses mesh_utils' device order, the same order Ray Data's iter_jax_batches shards
    batches with, so batches need no resharding. ``optimizer``: the config's (`make_optimizer`) unless given.
    """

    def __init__(
        self,
        cfg: dict[str, Any],
        params: dict[str, np.ndarray],
        opt_leaves: list[np.ndarray] | None = None,
        optimizer: Any = None,
    ):
        import jax
        from jax.experimental import mesh_utils
        from jax.sharding import Mesh, NamedSharding
        from jax.sharding import PartitionSpec as P

        self.spec, self.model = model_config(cfg)
        self.mesh = Mesh(mesh_utils.create_device_mesh((jax.device_count(),)), ("data",))
        self._replicated = NamedSharding(self.mesh, P())
        self.batch_sharding = NamedSharding(self.mesh, P("data"))
        self.optimizer = make_optimizer(cfg) if optimizer is None else optimizer
        template = self.optimizer.init({k: np.asarray(v) for k, v in params.items()})
        leaves, self._opt_treedef = jax.tree_util.tree_flatten(template)
        if opt_leaves is not None:
            if len(opt_leaves) != len(leaves) or any(
                np.shape(a) != np.shape(b) for a, b in zip(opt_leaves, leaves, strict=True)
            ):
                raise ckpt.CheckpointError("optimizer state in the checkpoint does not match this optimizer config")
            leaves = opt_leaves
        # Placed on the mesh up front: arrays with another sharding would make the second
        # call of the step recompile.
        self.params = {k: self._replicate(v) for k, v in params.items()}
        self.opt_state = jax.tree_util.tree_unflatten(self._opt_treedef, [self._replicate(x) for x in leaves])
        self._step = make_train_step(self.model, self.optimizer, self.mesh, loss_mask(self.spec))

    def _replicate(self, value: Any) -> Any:
        import jax

        # every process passes identical values, so the replicated global array is well defined
        arr = np.asarray(value)
        return jax.make_array_from_callback(arr.shape, self._replicated, lambda idx: arr[idx])

    def global_batch(self, local_tokens: np.ndarray) -> Any:
        """This process's rows -> the global batch array (what iter_jax_batches yields)."""
        import jax

        global_shape = (local_tokens.shape[0] * jax.process_count(), *local_tokens.shape[1:])
        return jax.make_array_from_process_local_data(self.batch_sharding, local_tokens, global_shape)

    def step(self, tokens: Any) -> Any:
        self.params, self.opt_state, loss = self._step(self.params, self.opt_state, tokens)
        return loss

    @staticmethod
    def _local(x: Any) -> Any:
        # replicated: the local copy is the value, also when other processes hold devices
        return x if len(x.devices()) == 1 else x.addressable_data(0)

    @classmethod
    def fetch(cls, x: Any) -> np.ndarray:
        return np.asarray(cls._local(x))

    @classmethod
    def prefetch(cls, x: Any) -> Any:
        """Start copying a replicated value to the host; ``fetch`` of what this returns reads that copy."""
        local = cls._local(x)
        local.copy_to_host_async()
        return local

    def fetch_float(self, x: Any) -> float:
        return float(self.fetch(x))

    def params_numpy(self) -> dict[str, np.ndarray]:
        return {k: self.fetch(v) for k, v in self.params.items()}

    def opt_leaves_numpy(self) -> list[np.ndarray]:
        import jax

        return [self.fetch(x) for x in jax.tree_util.tree_leaves(self.opt_state)]

    def replicas_in_sync(self) -> bool | None:
        """Whether every process holds the same parameters (a collective: all processes must call it)."""
        import jax
        from jax.experimental.multihost_utils import process_allgather

        if jax.process_count() == 1:
            return None
        prints = np.asarray(process_allgather(fingerprint(self.params_numpy())))
        return bool((prints == prints[0]).all())

    def save(self, directory: str | Path, step: int, epoch: int) -> None:
        """Parameters and optimizer state, on disk when it returns (checkpoint.save fsyncs)."""
        meta = ckpt.Meta("jax", step, epoch, self.model, self.spec)
        ckpt.save(directory, meta, self.params_numpy(), self.opt_leaves_numpy())


def restore(directory: str | Path, cfg: dict[str, Any]) -> tuple[dict[str, np.ndarray], list[np.ndarray], ckpt.Meta]:
    _, model = model_config(cfg)
    meta = ckpt.load_resumable_meta(directory, "jax", model)
    return ckpt.load_params(directory, model), ckpt.load_leaves(Path(directory) / ckpt.OPT_STATE), meta


def train_local(
    tokens: np.ndarray, config: dict[str, Any] | None = None, log: Callable[[str], None] = print
) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Single-process training on in-memory token rows; returns (params, metrics)."""
    cfg = resolve_config(config)
    state = DataParallelState(cfg, init_params(model_config(cfg)[1], int(cfg["seed"])))
    bsz = int(cfg["global_batch_size"])
    if len(tokens) < bsz:
        raise ValueError(f"{len(tokens)} rows is less than one batch of {bsz}")

    def epoch_batches(epoch: int) -> Iterator[Any]:
        order = np.random.default_rng([int(cfg["seed"]), epoch]).permutation(len(tokens))
        for i in range(0, len(order) - bsz + 1, bsz):
            yield state.global_batch(np.ascontiguousarray(tokens[order[i : i + bsz]], dtype=np.int32))

    t0 = time.perf_counter()
    step, epoch, loss = fit(state.step, state.fetch_float, cfg, epoch_batches, log=log, prefetch=state.prefetch)
    return state.params_numpy(), {"step": step, "epoch": epoch, "loss": loss, "train_s": time.perf_counter() - t0}


# --- Ray Train ------------------------------------------------------------------------


def tokens_collate(on_batch: Callable[[np.ndarray], None] | None = None) -> Any:
    from ray.data.collate_fn import NumpyBatchCollateFn

    class TokensOnly(NumpyBatchCollateFn):
        """Keep the token matrix; the string columns (prompt, answer) cannot become JAX arrays."""

        def __call__(self, batch: dict[str, np.ndarray]) -> np.ndarray:
            tokens = np.ascontiguousarray(batch["tokens"], dtype=np.int32)
            if on_batch is not None:
                on_batch(tokens)
            return tokens

    return TokensOnly()


def sum_across_processes(values: np.ndarray) -> np.ndarray:
    """Every process's ``values`` summed, on every process (a collective)."""
    import jax
    from jax.experimental.multihost_utils import process_allgather

    if jax.process_count() == 1:
        return values
    return np.asarray(process_allgather(values)).reshape(-1, len(values)).sum(axis=0)


def min_across_processes(value: int) -> int:
    import jax
    from jax.experimental.multihost_utils import process_allgather

    if jax.process_count() == 1:
        return value
    return int(np.asarray(process_allgather(np.array([value], dtype=np.int64))).min())


_NAME_BYTES = 64


def worker_identity() -> dict[str, Any]:
    """This worker's slice (what GKE's TPU webhook, or the simulated host, set) and the multi-slice
    environment Ray Train set for it (ray.train.v2.jax: MEGASCALE_* when num_slices > 1)."""
    return {
        "slice_name": os.environ.get("TPU_NAME", ""),
        "tpu_worker_id": int(os.environ.get("TPU_WORKER_ID") or -1),
        "megascale_slice_id": int(os.environ.get("MEGASCALE_SLICE_ID") or -1),
        "megascale_num_slices": int(os.environ.get("MEGASCALE_NUM_SLICES") or 0),
        "megascale_coordinator": os.environ.get("MEGASCALE_COORDINATOR_ADDRESS", ""),
    }


def slice_layout(identity: dict[str, Any]) -> list[dict[str, Any]]:
    """Every worker's identity, by world rank (a collective: all processes must call it)."""
    import jax
    from jax.experimental.multihost_utils import process_allgather

    name = np.frombuffer(identity["slice_name"].encode()[:_NAME_BYTES].ljust(_NAME_BYTES, b"\0"), dtype=np.uint8)
    ints = np.array(
        [identity["tpu_worker_id"], identity["megascale_slice_id"], identity["megascale_num_slices"]], dtype=np.int64
    )
    if jax.process_count() == 1:
        names, numbers = name[None], ints[None]
    else:
        names, numbers = np.asarray(process_allgather(name)), np.asarray(process_allgather(ints))
    return [
        {
            "rank": r,
            "slice_name": bytes(names[r]).rstrip(b"\0").decode(),
            "tpu_worker_id": int(numbers[r][0]),
            "megascale_slice_id": int(numbers[r][1]),
            "megascale_num_slices": int(numbers[r][2]),
        }
        for r in range(len(names))
    ]


def check_slice_layout(layout: list[dict[str, Any]]) -> dict[str, list[int]]:
    """Ranks by slice name; raises when the workers of one slice are not one multi-slice group
    (a slice id shared by two slices, a slice split across ids, uneven slices, a wrong slice count)."""
    by_name: dict[str, list[int]] = {}
    ids_of: dict[str, set[int]] = {}
    for w in layout:
        by_name.setdefault(w["slice_name"], []).append(w["rank"])
        ids_of.setdefault(w["slice_name"], set()).add(w["megascale_slice_id"])
    declared = {w["megascale_num_slices"] for w in layout}
    if declared - {0, 1} or len(by_name) > 1:
        problems = []
        if declared != {len(by_name)}:
            problems.append(f"MEGASCALE_NUM_SLICES {sorted(declared)} for {len(by_name)} slice(s)")
        ids = [next(iter(v)) for v in ids_of.values() if len(v) == 1]
        if any(len(v) != 1 for v in ids_of.values()) or len(set(ids)) != len(ids):
            problems.append(f"MEGASCALE_SLICE_ID per slice: { {k: sorted(v) for k, v in ids_of.items()} }")
        if len({len(r) for r in by_name.values()}) != 1:
            problems.append(f"uneven slices: { {k: len(v) for k, v in by_name.items()} }")
        if problems:
            raise RuntimeError("the workers are not one multi-slice group: " + "; ".join(problems))
    return by_name


def ensure_jax_distributed(world: int, rank: int) -> bool:
    """Join all workers into one JAX job when JaxTrainer did not (it only does for TPU/GPU).

    Returns True when this call initialised it (so the caller shuts it down).
    """
    import jax

    if world <= 1 or jax.distributed.is_initialized():
        return False
    import ray
    from ray.train.collective import broadcast_from_rank_zero

    address = None
    if rank == 0:
        ip = ray.util.get_node_ip_address()
        with socket.socket() as sock:
            sock.bind((ip, 0))
            address = f"{ip}:{sock.getsockname()[1]}"
    address = broadcast_from_rank_zero(address)
    jax.distributed.initialize(address, world, rank)
    return True


def train_loop_per_worker(config: dict[str, Any]) -> None:
    import jax
    import ray.train
    from ray.train import Checkpoint

    clock = StepClock.for_worker()
    cfg = resolve_config(config)
    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    joined_here = ensure_jax_distributed(world, rank)

    def log(msg: str) -> None:
        if rank == 0:
            print(f"[train_jax] {msg}", flush=True)

    try:
        if jax.process_count() != world:
            raise RuntimeError(f"JAX sees {jax.process_count()} processes but Ray Train has {world} workers")
        bsz = int(cfg["global_batch_size"])
        if bsz % world or (bsz // world) % jax.local_device_count():
            raise ValueError(
                f"global_batch_size {bsz} must divide into {world} workers x {jax.local_device_count()} local devices"
            )
        per_host = bsz // world
        log(
            f"{world} worker(s), {jax.device_count()} JAX device(s) ({jax.devices()[0].platform}), "
            f"global batch {bsz} ({per_host} per worker)"
        )
        layout = slice_layout(worker_identity())
        slices = check_slice_layout(layout)
        if len(slices) > 1:
            log(f"data parallel across {len(slices)} slices, one mesh over all {jax.device_count()} devices:")
            for w in layout:
                log(
                    f"  rank {w['rank']}: slice {w['slice_name']} worker {w['tpu_worker_id']}, "
                    f"MEGASCALE_SLICE_ID={w['megascale_slice_id']} of {w['megascale_num_slices']}"
                )

        step = epoch = 0
        resumed_from: str | None = None
        checkpoint = ray.train.get_checkpoint()
        if checkpoint is not None:
            with checkpoint.as_directory() as d:
                params, leaves, meta = restore(d, cfg)
            step, epoch, resumed_from = meta.step, meta.epoch + 1, checkpoint.path
            log(f"resumed from checkpoint {checkpoint.path} at step {step}")
            state = DataParallelState(cfg, params, leaves)
        else:
            state = DataParallelState(cfg, init_params(model_config(cfg)[1], int(cfg["seed"])))
        if step >= int(cfg["num_steps"]):
            log(f"checkpoint is at step {step}, num_steps is {cfg['num_steps']}: nothing to train")
            return

        shard = ray.train.get_dataset_shard("train")

        def stream(ep: int) -> Iterator[Any]:
            return iter(
                shard.iter_jax_batches(
                    batch_size=per_host,
                    # every worker must run the same number of steps: drop a short last batch
                    # and stop when any worker runs out
                    drop_last=True,
                    synchronize_batches=world > 1,
                    collate_fn=tokens_collate(epochs.keep),
                    local_shuffle_buffer_size=int(cfg["shuffle_buffer"]) or None,
                    local_shuffle_seed=shuffle_seed(cfg, ep, world, rank),
                    prefetch_batches=4,
                )
            )

        epochs = CachedEpochs(
            stream, state.global_batch, per_host, int(cfg["cache_rows"]), int(cfg["seed"]), rank, min_across_processes
        )

        metrics = RunMetrics("jax", world, step, resumed_from)

        def evaluation(at_step: int, at_epoch: int) -> dict[str, Any]:
            """The held-out set, answered by every worker with the weights in memory (after the last step)."""
            from addition.inference import Predictor

            meta = ckpt.Meta("jax", at_step, at_epoch, state.model, state.spec)
            return evaluation_at_the_end(
                cfg, at_step, lambda: Predictor(state.params_numpy(), meta, backend="jax"), sum_across_processes, log
            )

        def on_checkpoint(at_step: int, at_epoch: int, loss: float) -> None:
            evaluated, in_sync = checkpoint_checks(
                evaluation, state.replicas_in_sync, clock, at_step, at_epoch, rank, "train_jax"
            )
            with tempfile.TemporaryDirectory(prefix="tpuflow-jax-ckpt-") as tmp:
                if rank == 0:
                    state.save(tmp, at_step, at_epoch)
                ray.train.report(
                    {
                        **metrics(at_step, at_epoch, loss, in_sync),
                        "num_slices": len(slices),
                        "workers": layout,
                        **evaluated,
                    },
                    checkpoint=Checkpoint.from_directory(tmp) if rank == 0 else None,
                )

        fit(
            state.step,
            state.fetch_float,
            cfg,
            epochs,
            step=step,
            epoch=epoch,
            on_checkpoint=on_checkpoint,
            notice=preemption_notice(cfg),
            clock=clock,
            log=log,
            prefetch=state.prefetch,
        )
    finally:
        if joined_here:
            jax.distributed.shutdown()
