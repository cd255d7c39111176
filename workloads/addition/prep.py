"""Generate the training and held-out sets for one logical date with Ray Data.

    python -m addition.prep --output-dir DIR --date YYYY-MM-DD [--num-train N] [--num-heldout 200]
                            [--seed S] [--digits 2]

Writes parquet to DIR/train and DIR/heldout (DIR local or gs://...), then DIR/_SUCCESS with
the parameters. A rerun with the same parameters finds _SUCCESS and skips; different
parameters overwrite. Prints one `TPUFLOW_RESULT {json}` line.

Local paths only work where every Ray node shares the filesystem (one machine); use gs://
on a real cluster.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import re
import time
from typing import Any

import numpy as np
from addition.data import TaskSpec, check_sizes, default_num_train, make_split_rows, seed_for
from tpuflow_driver import storage
from tpuflow_driver.result import emit_result

SUCCESS = "_SUCCESS"
PREP_VERSION = 2  # 2: zero-padded operands and answers in the tokens. Bump when generation changes, so old outputs are not taken as current


def _valid_date(value: str) -> str:
    try:
        # fromisoformat also takes 20261203 and 2026-W49-4: the date seeds the data, one spelling only
        if not re.fullmatch(r"[0-9]{4}-[0-9]{2}-[0-9]{2}", value):
            raise ValueError(value)
        dt.date.fromisoformat(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--date must be YYYY-MM-DD, got {value!r}") from None
    return value


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m addition.prep", description=__doc__.split("\n")[0])
    p.add_argument("--output-dir", required=True, help="local directory or gs://bucket/prefix")
    p.add_argument("--date", required=True, type=_valid_date, help="logical date, seeds the generator")
    p.add_argument("--num-train", type=int, default=None, help="training rows (default: every non-held-out problem)")
    p.add_argument("--num-heldout", type=int, default=200)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--digits", type=int, default=2, help="max digits per operand (1-3)")
    args = p.parse_args(argv)
    spec = TaskSpec(args.digits)
    try:
        check_sizes(spec, args.num_heldout)
    except ValueError as exc:
        p.error(str(exc))
    if args.num_train is None:
        args.num_train = default_num_train(spec, args.num_heldout)
    if args.num_train < 1:
        p.error("--num-train must be >= 1")
    return args


def _generate(batch: dict[str, np.ndarray], *, seed: int, num_heldout: int, spec: TaskSpec) -> dict[str, np.ndarray]:
    return make_split_rows(batch["id"], seed=seed, num_heldout=num_heldout, spec=spec)


def _count_rows(path: str) -> int:
    """Rows in the written parquet files, from their footers (no Ray Data execution)."""
    import pyarrow.dataset as pads

    fs, p = storage.resolve_with_deadline(path)
    return int(pads.dataset(p, filesystem=fs, format="parquet").count_rows())


def run(args: argparse.Namespace) -> dict[str, Any]:
    import ray
    from ray.data.expressions import col

    out = storage.normalize(args.output_dir)
    params = {
        "version": PREP_VERSION,
        "date": args.date,
        "seed": args.seed,
        "digits": args.digits,
        "num_train": args.num_train,
        "num_heldout": args.num_heldout,
    }
    result = {
        "output_dir": out,
        "train_path": storage.join(out, "train"),
        "heldout_path": storage.join(out, "heldout"),
        **{k: v for k, v in params.items() if k != "version"},
    }
    marker = storage.join(out, SUCCESS)
    previous = storage.read_text(marker)
    if previous is not None:
        done = json.loads(previous)
        if done.get("params") == params:
            print(f"[prep] {marker} exists with the same parameters; skipping", flush=True)
            return {**result, **done.get("counts", {}), "skipped": True}
        print(f"[prep] {marker} has other parameters {done.get('params')}; regenerating", flush=True)
        storage.delete(marker)

    t0 = time.perf_counter()
    storage.quiet_ray_data()
    spec = TaskSpec(args.digits)
    total = args.num_heldout + args.num_train
    rows = ray.data.range(total, override_num_blocks=max(1, min(8, total // 4000))).map_batches(
        _generate,
        fn_kwargs={"seed": seed_for(args.date, args.seed), "num_heldout": args.num_heldout, "spec": spec},
        batch_format="numpy",
        batch_size=4096,
    )
    counts = {}
    for split, path in (("train", result["train_path"]), ("heldout", result["heldout_path"])):
        # generation is cheap and deterministic: each split re-runs it rather than materialising
        fs, fs_path = storage.resolve_with_deadline(path)
        rows.filter(expr=col("split") == split).write_parquet(fs_path, filesystem=fs, mode="overwrite")
        counts[f"{split}_rows"] = _count_rows(path)
    if counts["train_rows"] != args.num_train or counts["heldout_rows"] != args.num_heldout:
        raise RuntimeError(f"wrote {counts}, expected {args.num_train} train and {args.num_heldout} held-out rows")
    storage.write_text(marker, json.dumps({"params": params, "counts": counts}, indent=2))
    print(f"[prep] wrote {counts} to {out} in {time.perf_counter() - t0:.1f}s", flush=True)
    return {**result, **counts, "skipped": False}


def main(argv: list[str] | None = None) -> None:
    emit_result(run(parse_args(argv)))


if __name__ == "__main__":
    main()
