"""input_feed_overhead, run as a Ray job (working_dir: workloads/): the product's JAX step fed by Ray Data
iter_jax_batches (the product's collate) vs the same step on preloaded arrays, one process.

    python feed.py TRAIN_PARQUET STEPS
Prints `TPUFLOW_RESULT {"preloaded_ms": [...], "ray_data_ms": [...]}` (per-step times, ms).
"""

import json
import sys
import time

import numpy as np
import ray
from addition import data
from addition.model_jax import init_params
from addition.train_jax import DataParallelState, tokens_collate
from addition.training import model_config, resolve_config

path, steps = sys.argv[1], int(sys.argv[2])
cfg = resolve_config({})
bsz = int(cfg["global_batch_size"])
spec, model = model_config(cfg)
state = DataParallelState(cfg, init_params(model, int(cfg["seed"])))


def as_batch(b):
    return state.global_batch(np.ascontiguousarray(b, dtype=np.int32)) if isinstance(b, np.ndarray) else b


def timed(batches):
    out, loss = [], None
    t = time.perf_counter()
    for i, b in enumerate(batches):
        loss = state.step(as_batch(b))
        state.fetch_float(loss)  # a host sync each step: the step's time, input included
        now = time.perf_counter()
        out.append((now - t) * 1000)
        t = now
        if i + 1 >= steps:
            break
    return out


tokens = data.generate("2026-01-01", "train", data.default_num_train(spec, 200), num_heldout=200)["tokens"]
preloaded = [tokens[i : i + bsz] for i in range(0, len(tokens) - bsz + 1, bsz)]
timed(preloaded[:3])  # compile
ray.init(logging_level="WARNING")
ds = ray.data.read_parquet(path, columns=["tokens"])
ray_data, pre = [], []
while len(ray_data) < steps:  # epochs until enough steps, alternating so load drifts hit both sides
    ray_data += timed(
        ds.iter_jax_batches(batch_size=bsz, drop_last=True, collate_fn=tokens_collate(), prefetch_batches=4)
    )
    pre += timed(preloaded)
print("TPUFLOW_RESULT " + json.dumps({"preloaded_ms": pre[:steps], "ray_data_ms": ray_data[:steps]}), flush=True)
