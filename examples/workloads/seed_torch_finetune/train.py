"""Seed 004's Ray Train FSDP2 fine-tune (``ray_train_llm_finetune.py``) with only the model and the data
replaced: nothing is downloaded at run time, so a tiny causal LM (``TinyCausalLM``, shaped as the seed
shards Gemma: ``model.layers[i].mlp`` then the whole) learns generated token sequences instead of
``google/gemma-4-E2B-it`` on ``databricks/databricks-dolly-15k``.

The rest is the seed's: ``TorchConfig(backend="tpu_dist")``, ``ScalingConfig(use_tpu=True, topology,
accelerator_type, resources_per_worker={"TPU": 1})``, one worker per TPU chip, ``import torch_tpu``,
the model and every batch on ``ray.train.torch.get_device()`` (``tpu``), ``init_device_mesh("tpu")``,
FSDP2 ``fully_shard`` per ``layer.mlp`` then the model with the seed's ``MixedPrecisionPolicy``, AdamW,
``all_reduce(running_loss, op=ReduceOp.AVG)``, a full state dict checkpoint per epoch on rank 0.
On tpuflow's simulated slice ``torch_tpu`` is the CPU stand-in (workloads/simulated_tpu), whose
``tpu`` device holds tensors in host memory.

What differs from the seed, and why:
- ``TinyCausalLM``/``generate_sequences``/``create_dataloader``: no ``transformers``/``datasets``
  downloads; the batches are the same ``{"input_ids", "labels"}`` dicts through
  ``ray.train.torch.prepare_data_loader`` (which moves them to the ``tpu`` device);
- ``model(...)`` returns the loss itself rather than an output with ``.loss``, and there are no frozen
  per-layer embeddings, hence no ``ignored_params``/``ignore_frozen_params``;
- arguments for the tiny model and data (``--num-samples``, ``--seq-len``, ``--vocab-size``, ``--dim``,
  ``--num-layers``, ``--lr``, ``--run-name``) instead of ``--model-id``/``--dataset-split``;
- the metrics also carry ``world_size`` and the device the loss was on, and the driver prints one
  ``TPUFLOW_RESULT`` line, for tests and tpuflow's operators to read (through ``tpuflow_driver.result`` when the
  operators shipped it, so the line carries the job's nonce).

Submitted as ``ray job submit`` would, from this folder:

    python train.py --topology 2x2 --accelerator-type TPU-V6E --num-workers 4 --storage-path /tmp/runs
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

import ray
import ray.train
import torch
import torch_tpu  # noqa: F401
from ray.train import Checkpoint, CheckpointConfig, RunConfig, ScalingConfig
from ray.train.torch import TorchConfig, TorchTrainer
from torch import nn
from torch.distributed import ReduceOp, all_reduce
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.utils.data import DataLoader, TensorDataset


class Block(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.mlp(self.norm(x))  # out of place: FSDP2's hooks see the view


class TinyCausalLM(nn.Module):
    """Next-token model with the shape the seed shards: ``model.layers[i].mlp`` then the whole."""

    def __init__(self, vocab_size: int, dim: int, num_layers: int) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(vocab_size, dim)
        self.layers = nn.ModuleList(Block(dim) for _ in range(num_layers))
        self.lm_head = nn.Linear(dim, vocab_size)

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        x = self.embed_tokens(input_ids)
        for layer in self.layers:
            x = layer(x)
        logits = self.lm_head(x).float()
        return nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.size(-1)), labels[:, 1:].reshape(-1))


def generate_sequences(num_samples: int, seq_len: int, vocab_size: int, seed: int = 0) -> torch.Tensor:
    """Arithmetic progressions mod vocab_size with a random start and step: learnable from context."""
    gen = torch.Generator().manual_seed(seed)
    start = torch.randint(0, vocab_size, (num_samples, 1), generator=gen)
    step = torch.randint(1, 4, (num_samples, 1), generator=gen)
    return (start + step * torch.arange(seq_len)) % vocab_size


def create_dataloader(batch_size: int, num_samples: int, seq_len: int, vocab_size: int) -> DataLoader:
    tokens = generate_sequences(num_samples, seq_len, vocab_size)
    dataloader = DataLoader(
        TensorDataset(tokens),
        batch_size=batch_size,
        shuffle=True,
        drop_last=True,
        collate_fn=lambda rows: {
            "input_ids": torch.stack([r[0] for r in rows]),
            "labels": torch.stack([r[0] for r in rows]),
        },
    )
    return ray.train.torch.prepare_data_loader(dataloader)


def train_func(config: dict) -> None:
    """Per-worker distributed FSDP2 training loop, one worker per TPU chip."""
    ctx = ray.train.get_context()
    world_rank = ctx.get_world_rank()
    world_size = ctx.get_world_size()
    device = ray.train.torch.get_device()

    batch_size = config["batch_size_per_device"]
    num_epochs = config["num_epochs"]
    seq_len, vocab_size = config["seq_len"], config["vocab_size"]
    dataloader = create_dataloader(batch_size, config["num_samples"], seq_len, vocab_size)

    torch.manual_seed(42)
    model = TinyCausalLM(vocab_size, config["dim"], config["num_layers"]).to(device)

    mesh = init_device_mesh("tpu", (world_size,))
    mp_policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for layer in model.layers:
        fully_shard(layer.mlp, mesh=mesh, mp_policy=mp_policy)
    fully_shard(model, mesh=mesh, mp_policy=mp_policy)

    optimizer = torch.optim.AdamW(model.parameters(), lr=config["lr"], weight_decay=0.01)
    global_batch_size = batch_size * world_size

    for epoch in range(num_epochs):
        dataloader.sampler.set_epoch(epoch)
        model.train()
        epoch_start = time.perf_counter()
        running_loss = torch.zeros(1, device=device, dtype=torch.float32)

        for batch in dataloader:
            optimizer.zero_grad()
            loss = model(input_ids=batch["input_ids"], labels=batch["labels"])
            loss.backward()
            optimizer.step()
            running_loss += loss.detach().float()

        all_reduce(running_loss, op=ReduceOp.AVG)
        avg_loss = running_loss.item() / len(dataloader)
        epoch_time = time.perf_counter() - epoch_start
        tokens_per_sec = (len(dataloader) * global_batch_size * seq_len) / epoch_time

        metrics = {
            "epoch": epoch + 1,
            "loss": round(avg_loss, 4),
            "epoch_time_s": round(epoch_time, 2),
            "tokens_per_s": round(tokens_per_sec, 1),
            "world_size": world_size,
            "loss_device": running_loss.device.type,
        }
        if world_rank == 0:
            print(
                f"Epoch {epoch + 1}/{num_epochs} | loss={metrics['loss']:.4f} | "
                f"epoch_time={metrics['epoch_time_s']:.2f}s | tokens/s={metrics['tokens_per_s']:.1f}"
            )

        full_state_dict = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if world_rank == 0:
            with tempfile.TemporaryDirectory() as tmpdir:
                torch.save(full_state_dict, os.path.join(tmpdir, "model.pt"))
                ray.train.report(metrics, checkpoint=Checkpoint.from_directory(tmpdir))
        else:
            ray.train.report(metrics)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Fine-tune a tiny causal LM on TPU hosts with Ray Train and FSDP2.")
    parser.add_argument("--topology", default="4x4", help="TPU slice topology.")
    parser.add_argument("--accelerator-type", default="TPU-V6E", help="Ray TPU accelerator type (TPU-V6E, ...).")
    parser.add_argument("--num-workers", type=int, default=16, help="Total TPU worker processes (one per chip).")
    parser.add_argument("--num-epochs", type=int, default=3, help="Number of fine-tuning epochs.")
    parser.add_argument("--batch-size-per-device", type=int, default=8, help="Per-device training batch size.")
    parser.add_argument("--num-samples", type=int, default=512, help="Generated sequences in the data set.")
    parser.add_argument("--seq-len", type=int, default=16, help="Tokens per sequence.")
    parser.add_argument("--vocab-size", type=int, default=32, help="Vocabulary of the generated sequences.")
    parser.add_argument("--dim", type=int, default=64, help="Model width.")
    parser.add_argument("--num-layers", type=int, default=2, help="Model depth.")
    parser.add_argument("--lr", type=float, default=3e-3, help="AdamW learning rate.")
    parser.add_argument("--run-name", default=None, help="Ray Train run name (default: one per start time).")
    parser.add_argument(
        "--storage-path",
        default=os.environ.get("STORAGE_PATH"),
        required="STORAGE_PATH" not in os.environ,
        help="Cloud Storage or shared file system path for checkpoints.",
    )
    return parser.parse_args(argv)


def build_trainer(args: argparse.Namespace) -> TorchTrainer:
    return TorchTrainer(
        train_loop_per_worker=train_func,
        train_loop_config={
            "num_epochs": args.num_epochs,
            "batch_size_per_device": args.batch_size_per_device,
            "num_samples": args.num_samples,
            "seq_len": args.seq_len,
            "vocab_size": args.vocab_size,
            "dim": args.dim,
            "num_layers": args.num_layers,
            "lr": args.lr,
        },
        torch_config=TorchConfig(backend="tpu_dist"),
        scaling_config=ScalingConfig(
            use_tpu=True,
            num_workers=args.num_workers,
            topology=args.topology,
            accelerator_type=args.accelerator_type,
            resources_per_worker={"TPU": 1},
        ),
        run_config=RunConfig(
            name=args.run_name or f"torchtpu_tiny_fsdp2_{int(time.time())}",
            storage_path=args.storage_path,
            checkpoint_config=CheckpointConfig(
                num_to_keep=1,
                checkpoint_score_attribute="loss",
                checkpoint_score_order="min",
            ),
        ),
    )


def main() -> None:
    args = parse_args()
    ray.init()
    print(
        f"Starting Ray Train FSDP2 job: topology={args.topology}, accelerator_type={args.accelerator_type}, "
        f"num_workers={args.num_workers}"
    )
    result = build_trainer(args).fit()
    print(f"Training completed! Final metrics: {result.metrics}")
    print(f"Saved checkpoint: {result.checkpoint}")
    checkpoint = result.checkpoint.path if result.checkpoint else None
    emit_result({"metrics": result.metrics, "checkpoint": checkpoint})


def emit_result(result: dict) -> None:
    """The driver's result line: tpuflow's own (with the job's nonce) when its operators shipped tpuflow_driver
    beside this code, else the plain line ``ray job submit`` users read."""
    try:
        from tpuflow_driver.result import emit_result as emit
    except ImportError:
        print("TPUFLOW_RESULT " + json.dumps(result, default=str), flush=True)
    else:
        emit(result)


if __name__ == "__main__":
    main()
