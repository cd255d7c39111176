"""The product's training step without Ray: N processes joined by jax.distributed (or torch.distributed
with gloo and DDP), the same model, optimizer, config and global batch, on preloaded arrays.

    python plain_train.py jax|torch WORKERS STEPS LOG_EVERY          (launcher: starts the ranks)
Each rank runs `addition.training.fit`, so rank 0 logs the same "step S/N ... (X ms/step)" lines.
Run with workloads/ on PYTHONPATH.
"""

import os
import socket
import subprocess
import sys

import numpy as np


def rank_main(framework: str, world: int, steps: int, log_every: int, rank: int, port: int) -> None:
    from addition import data
    from addition.model_jax import init_params
    from addition.training import fit, model_config, resolve_config

    cfg = resolve_config({"num_steps": steps, "log_every": log_every})
    spec, model_cfg = model_config(cfg)
    bsz = int(cfg["global_batch_size"])
    per = bsz // world
    tokens = data.generate("2026-01-01", "train", data.default_num_train(spec, 200), num_heldout=200)["tokens"]

    def log(msg: str) -> None:
        if rank == 0:
            print(f"[plain_{framework}] {msg}", flush=True)

    def shards(epoch: int):
        order = np.random.default_rng([int(cfg["seed"]), epoch]).permutation(len(tokens))
        for i in range(0, len(order) - bsz + 1, bsz):
            rows = order[i : i + bsz][rank * per : (rank + 1) * per]
            yield np.ascontiguousarray(tokens[rows], dtype=np.int32)

    if framework == "jax":
        import jax
        from addition.train_jax import DataParallelState

        jax.distributed.initialize(f"127.0.0.1:{port}", world, rank)
        state = DataParallelState(cfg, init_params(model_cfg, int(cfg["seed"])))
        fit(state.step, state.fetch_float, cfg, lambda ep: (state.global_batch(s) for s in shards(ep)), log=log)
        jax.distributed.shutdown()
        return
    import torch
    import torch.distributed as dist
    from addition.model_torch import AdditionTransformer, make_optimizer, make_train_step, mean_loss

    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    torch.manual_seed(int(cfg["seed"]))
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", world_size=world, rank=rank)
    module = AdditionTransformer(model_cfg)
    module.load_canonical(init_params(model_cfg, int(cfg["seed"])))
    model = torch.nn.parallel.DistributedDataParallel(module) if world > 1 else module
    optimizer, scheduler = make_optimizer(model, cfg)
    step, fetch = make_train_step(model, optimizer, scheduler, cfg, spec), mean_loss(world)

    fit(step, fetch, cfg, lambda ep: (torch.from_numpy(s.astype(np.int64)) for s in shards(ep)), log=log)
    dist.destroy_process_group()


if __name__ == "__main__":
    fw, world, steps, log_every = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    if len(sys.argv) > 6:
        rank_main(fw, world, steps, log_every, int(sys.argv[5]), int(sys.argv[6]))
        sys.exit(0)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = [subprocess.Popen([sys.executable, __file__, *sys.argv[1:5], str(r), str(port)]) for r in range(world)]
    codes = [p.wait() for p in procs]
    sys.exit(max(codes))
