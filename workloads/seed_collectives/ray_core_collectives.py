"""Seed 004's Ray Core collectives (``ray_core_collectives.py``) as a slice check, adapted for CPU only
where the device and the backend are concerned: ``--device cpu`` and ``--backend gloo`` by default.

The rest is the seed's: ``slice_placement_group`` reserves the slice intact with one bundle per TPU
chip, one ``TorchTPUSliceWorker`` actor per chip (``PlacementGroupSchedulingStrategy``), the global rank
from ``TPU_WORKER_ID`` and the chip Ray assigned, ``MASTER_ADDR`` from the webhook's
``TPU_WORKER_HOSTNAMES``; each rank checks a DTensor tensor-parallel feed-forward against a
single-device reference, then all-reduces ``rank + 1`` over the slice. The driver checks every rank's
sum and exits non-zero when one differs. On tpuflow's simulated slice ``torch_tpu`` is the CPU
stand-in (workloads/simulated_tpu); no tensor can live on its ``tpu`` device, hence ``--device cpu``.

Submitted as ``ray job submit`` would, from this folder:

    python ray_core_collectives.py --topology 2x2 --accelerator-type TPU-V6E

On a real slice: ``--device tpu --backend tpu_dist``. A v6e 2x4 of two 4-chip hosts (ct6e-standard-4t)
needs ``--chips-per-vm 4``: Ray 2.60 reads that shape as one 8-chip host, on GKE as here
(``tpuflow.tpu.TpuSlice.ray_caveats``; ``tpuflow local up`` prints it).
"""

from __future__ import annotations

import argparse
import os

import ray
import torch
import torch.distributed as dist
import torch.nn as nn
import torch_tpu  # noqa: F401
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
from ray.util.tpu import get_tpu_version_from_type, slice_placement_group
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

RANDOM_SEED = 42


class FeedForward(nn.Module):
    """Two-layer feed-forward block for tensor-parallel sharding across a TPU slice."""

    def __init__(self, hidden_dim: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(hidden_dim, 4 * hidden_dim, bias=False)
        self.act = nn.SiLU()
        self.w2 = nn.Linear(4 * hidden_dim, hidden_dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.w2(self.act(self.w1(x)))


@ray.remote
class TorchTPUSliceWorker:
    """Ray actor bound to a single logical TPU device within a slice placement group."""

    def __init__(self, devices_per_host: int, master_port: int) -> None:
        self.node_ip = ray.util.get_node_ip_address()
        hosts = os.environ["TPU_WORKER_HOSTNAMES"].split(",")
        self.worker_id = int(os.environ.get("TPU_WORKER_ID", "0"))
        self.local_rank = int(ray.get_runtime_context().get_accelerator_ids()["TPU"][0])
        self.rank = self.worker_id * devices_per_host + self.local_rank
        # Per-process PyTorch env:// variables from the webhook's host-level TPU metadata and Ray's
        # assigned local device ID.
        os.environ.update(
            {
                "MASTER_ADDR": hosts[0],
                "MASTER_PORT": str(master_port),
                "WORLD_SIZE": str(len(hosts) * devices_per_host),
                "RANK": str(self.rank),
                "LOCAL_RANK": str(self.local_rank),
                "LOCAL_WORLD_SIZE": str(devices_per_host),
            }
        )

    def run_tensor_parallel_step(
        self, backend: str, device_type: str, batch_size: int = 64, hidden_dim: int = 128
    ) -> dict:
        dist.init_process_group(backend=backend)
        world_size = dist.get_world_size()
        device = torch.device(device_type)

        # 1. Compute single-device reference output on CPU with identical seed.
        torch.manual_seed(RANDOM_SEED)
        ref_model = FeedForward(hidden_dim).eval()
        inputs_cpu = torch.randn(batch_size, hidden_dim)
        with torch.no_grad():
            ref_output = ref_model(inputs_cpu)

        # 2. Shard the model across all TPU devices in the slice with DTensor TP.
        torch.manual_seed(RANDOM_SEED)
        tp_model = FeedForward(hidden_dim).to(device).eval()
        mesh = init_device_mesh(device_type, (world_size,))
        tp_model = parallelize_module(tp_model, mesh, {"w1": ColwiseParallel(), "w2": RowwiseParallel()})

        with torch.no_grad():
            tp_output = tp_model(inputs_cpu.to(device)).cpu()

        torch.testing.assert_close(tp_output, ref_output, rtol=1e-3, atol=1e-2)
        max_abs_diff = float((tp_output - ref_output).abs().max().item())

        # 3. Verify a direct all_reduce across all ranks in the slice (ICI on a real slice).
        rank_tensor = torch.full((4,), float(self.rank + 1), dtype=torch.float32, device=device)
        dist.all_reduce(rank_tensor, op=dist.ReduceOp.SUM)
        all_reduce_sum = rank_tensor.cpu().tolist()

        dist.destroy_process_group()
        return {
            "rank": self.rank,
            "local_rank": self.local_rank,
            "worker_id": self.worker_id,
            "node_ip": self.node_ip,
            "all_reduce_sum": all_reduce_sum,
            "max_abs_diff": max_abs_diff,
        }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Run distributed TorchTPU tensor parallelism across a Ray TPU slice.")
    parser.add_argument("--topology", type=str, default="4x4", help="TPU physical topology.")
    parser.add_argument(
        "--accelerator-type",
        type=str,
        default="TPU-V6E",
        help="Ray TPU accelerator type (TPU-V6E, TPU-V7X, etc.).",
    )
    parser.add_argument(
        "--chips-per-vm", type=int, default=None, help="Chips per TPU VM where Ray cannot tell (v6e 2x4: 4)."
    )
    parser.add_argument("--device", default="cpu", choices=("cpu", "tpu"), help="Where tensors live.")
    parser.add_argument("--backend", default="gloo", choices=("gloo", "tpu_dist"), help="Process group backend.")
    parser.add_argument("--master-port", type=int, default=29500, help="Rank 0's TCP store port.")
    return parser.parse_args(argv)


def main() -> None:
    args = parse_args()
    ray.init()

    slice_handle = slice_placement_group(
        topology=args.topology,
        accelerator_version=get_tpu_version_from_type(args.accelerator_type),
        num_slices=1,
        resources_per_bundle={"TPU": 1},
        chips_per_vm=args.chips_per_vm,
    )
    ray.get(slice_handle.placement_group.ready())

    devices_per_host = slice_handle.num_bundles // slice_handle.num_hosts
    workers = [
        TorchTPUSliceWorker.options(
            resources={"TPU": 1},
            scheduling_strategy=PlacementGroupSchedulingStrategy(
                placement_group=slice_handle.placement_group,
                placement_group_bundle_index=bundle_idx,
            ),
        ).remote(devices_per_host, args.master_port)
        for bundle_idx in range(slice_handle.num_bundles)
    ]
    results = sorted(
        ray.get([w.run_tensor_parallel_step.remote(args.backend, args.device) for w in workers]),
        key=lambda r: r["rank"],
    )

    expected_sum = sum(range(1, slice_handle.num_bundles + 1))
    for r in results:
        print(
            f"Rank {r['rank']:2d} (worker_id={r['worker_id']}, "
            f"local_rank={r['local_rank']}, ip={r['node_ip']}): "
            f"all_reduce_sum={r['all_reduce_sum']}"
        )
        assert r["all_reduce_sum"] == [float(expected_sum)] * 4, f"rank {r['rank']}: expected {expected_sum}"
    assert [r["rank"] for r in results] == list(range(slice_handle.num_bundles)), "ranks are not 0..N-1"

    print(
        f"All {len(results)} TorchTPU ranks verified DTensor TP parity "
        f"(max_abs_diff={results[0]['max_abs_diff']:.6f}) and "
        f"all_reduce sum = {expected_sum:.1f}"
    )
    for w in workers:
        ray.kill(w)
    slice_handle.shutdown()


if __name__ == "__main__":
    main()
