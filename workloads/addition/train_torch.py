"""Data-parallel torch training of the addition model, for ray.train.torch.TorchTrainer (gloo, DDP).

Same model, objective, schedule, checkpoint layout and resume semantics as train_jax.
torch is imported inside functions: the driver imports this module to find the function.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
from addition import checkpoint as ckpt
from addition.heldout import evaluation_at_the_end
from addition.model_jax import init_params
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


def _threads(cfg: dict[str, Any], local_world: int) -> int:
    """Configured, else the CPUs Ray gave this worker, else the node's cores shared by its workers."""
    if int(cfg["torch_threads"]) > 0:
        return int(cfg["torch_threads"])
    import ray

    assigned = ray.get_runtime_context().get_assigned_resources().get("CPU", 0)
    if assigned >= 1:
        return int(assigned)
    return max(1, (os.cpu_count() or 1) // max(local_world, 1))


def train_loop_per_worker(config: dict[str, Any]) -> None:
    import ray.train
    import ray.train.torch
    import torch
    from addition.model_torch import AdditionTransformer, make_optimizer, make_train_step, mean_loss
    from ray.train import Checkpoint

    clock = StepClock.for_worker()
    cfg = resolve_config(config)
    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    torch.set_num_threads(_threads(cfg, ctx.get_local_world_size()))
    torch.manual_seed(int(cfg["seed"]))

    def log(msg: str) -> None:
        if rank == 0:
            print(f"[train_torch] {msg}", flush=True)

    bsz = int(cfg["global_batch_size"])
    if bsz % world:
        raise ValueError(f"global_batch_size {bsz} must divide by the {world} workers")
    per_worker = bsz // world
    spec, model_cfg = model_config(cfg)
    log(f"{world} worker(s), {torch.get_num_threads()} thread(s) each, global batch {bsz} ({per_worker} per worker)")

    module = AdditionTransformer(model_cfg)
    step = epoch = 0
    resumed_from: str | None = None
    opt_state: dict[str, Any] | None = None
    checkpoint = ray.train.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as d:
            meta = ckpt.load_resumable_meta(d, "torch", model_cfg)
            module.load_canonical(ckpt.load_params(d, model_cfg))
            opt_state = torch.load(Path(d) / ckpt.TORCH_OPT, weights_only=True)
        step, epoch, resumed_from = meta.step, meta.epoch + 1, checkpoint.path
        log(f"resumed from checkpoint {checkpoint.path} at step {step}")
    else:
        module.load_canonical(init_params(model_cfg, int(cfg["seed"])))
    if step >= int(cfg["num_steps"]):
        log(f"checkpoint is at step {step}, num_steps is {cfg['num_steps']}: nothing to train")
        return

    # DDP when world > 1: gradients averaged in backward. The batches are host tensors, so the model stays on
    # the CPU even where Ray's device is a TPU (use_tpu=True: torch.device("tpu"), on the simulated slice too).
    model = ray.train.torch.prepare_model(module, move_to_device=torch.device("cpu"))
    optimizer, scheduler = make_optimizer(model, cfg)
    if opt_state is not None:
        optimizer.load_state_dict(opt_state["optimizer"])
        scheduler.load_state_dict(opt_state["scheduler"])
    train_step, fetch = make_train_step(model, optimizer, scheduler, cfg, spec), mean_loss(world)

    shard = ray.train.get_dataset_shard("train")
    shuffle = int(cfg["shuffle_buffer"])

    def to_batch(rows: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(rows, dtype=np.int64))

    def stream(ep: int) -> Iterator[torch.Tensor]:
        for batch in shard.iter_batches(
            batch_size=per_worker,
            batch_format="numpy",
            drop_last=True,  # equal shards (streaming_split equal=True) give every worker the same count
            local_shuffle_buffer_size=shuffle or None,
            local_shuffle_seed=shuffle_seed(cfg, ep, world, rank),
            prefetch_batches=4,
        ):
            epochs.keep(batch["tokens"])
            yield to_batch(batch["tokens"])

    def min_across_workers(value: int) -> int:
        if world == 1:
            return value
        t = torch.tensor([value], dtype=torch.int64)
        torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MIN)
        return int(t.item())

    epochs = CachedEpochs(
        stream, to_batch, per_worker, int(cfg["cache_rows"]), int(cfg["seed"]), rank, min_across_workers
    )

    metrics = RunMetrics("torch", world, step, resumed_from)

    def replicas_in_sync() -> bool | None:
        if world == 1:
            return None
        mine = torch.from_numpy(fingerprint(module.canonical()))
        prints = [torch.zeros_like(mine) for _ in range(world)]
        torch.distributed.all_gather(prints, mine)
        return all(bool(torch.equal(p, prints[0])) for p in prints)

    def sum_across_workers(values: np.ndarray) -> np.ndarray:
        if world == 1:
            return values
        t = torch.from_numpy(values.astype(np.int64))
        torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.SUM)
        return t.numpy()

    def evaluation(at_step: int, at_epoch: int) -> dict[str, Any]:
        """The held-out set, answered by every worker with the weights in memory (after the last step)."""
        from addition.inference import Predictor

        meta = ckpt.Meta("torch", at_step, at_epoch, model_cfg, spec)
        return evaluation_at_the_end(
            cfg, at_step, lambda: Predictor(module.canonical(), meta, backend="torch"), sum_across_workers, log
        )

    def on_checkpoint(at_step: int, at_epoch: int, loss: float) -> None:
        evaluated, in_sync = checkpoint_checks(
            evaluation, replicas_in_sync, clock, at_step, at_epoch, rank, "train_torch"
        )
        with tempfile.TemporaryDirectory(prefix="tpuflow-torch-ckpt-") as tmp:
            if rank == 0:
                ckpt.save(tmp, ckpt.Meta("torch", at_step, at_epoch, model_cfg, spec), module.canonical())
                torch.save(
                    {"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict()},
                    Path(tmp) / ckpt.TORCH_OPT,
                )
            ray.train.report(
                {**metrics(at_step, at_epoch, loss, in_sync), **evaluated},
                checkpoint=Checkpoint.from_directory(tmp) if rank == 0 else None,
            )

    fit(
        train_step,
        fetch,
        cfg,
        epochs,
        step=step,
        epoch=epoch,
        on_checkpoint=on_checkpoint,
        notice=preemption_notice(cfg),
        clock=clock,
        log=log,
    )
