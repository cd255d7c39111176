"""storage_deadline_overhead — what the per-call deadline (tpuflow_driver.deadline_fs) costs parquet I/O.

Prep's writes and Ray Data's reads go through `storage.resolve_with_deadline`: on GCS every call (an open, a
write, a read, a listing) then runs on a helper thread the caller waits on. Here N parquet files of several
row groups are written with `pyarrow.parquet.write_table` (what Ray Data's write_parquet does per block) and
read back with `pyarrow.dataset` (what its read_parquet does) on the GCS emulator, through the deadline
filesystem and through the plain `storage.resolve`, alternating in one run. value = the deadline side's
seconds (median of the repeats, write + read), baseline = the plain side's, ratio = deadline ÷ plain.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from typing import Any

from bench.core import WORKLOADS, Context, Result, goal_check, measure, median, ratio

GOAL = 1.10
BUCKET = "tpuflow-bench-storage"
FILES = 4
ROWS = 40_000  # per file: about 1.3 MB of parquet
ROW_GROUP = 10_000  # four row groups per file


def _table() -> Any:
    """Rows shaped like prep's: an id, a prompt, an answer, a number."""
    import numpy as np
    import pyarrow as pa

    rng = np.random.default_rng(0)
    a, b = rng.integers(0, 1000, ROWS), rng.integers(0, 1000, ROWS)
    return pa.table({
        "problem_id": np.arange(ROWS, dtype=np.int64),
        "prompt": [f"{x}+{y}=" for x, y in zip(a.tolist(), b.tolist(), strict=True)],
        "answer": [str(x + y) for x, y in zip(a.tolist(), b.tolist(), strict=True)],
        "weight": rng.random(ROWS),
    })  # fmt: skip


def _round(resolve: Callable[[str], tuple[Any, str]], uri: str, table: Any) -> tuple[float, float, float]:
    """Seconds to write FILES parquet files under `uri`, then to read them all back; and this process's CPU
    seconds for both (the client's own cost, less noisy than wall time on a shared machine)."""
    import pyarrow.dataset as pads
    import pyarrow.parquet as pq

    fs, root = resolve(uri)
    cpu = time.process_time()
    started = time.perf_counter()
    for i in range(FILES):
        pq.write_table(table, f"{root}/part-{i}.parquet", filesystem=fs, row_group_size=ROW_GROUP)
    wrote = time.perf_counter()
    back = pads.dataset(root, filesystem=fs, format="parquet").to_table()
    read = time.perf_counter()
    if back.num_rows != FILES * ROWS:
        raise RuntimeError(f"read {back.num_rows} rows back from {uri}, wrote {FILES * ROWS}")
    return wrote - started, read - wrote, time.process_time() - cpu


def _sides(repeats: int) -> dict[str, list[tuple[float, float, float]]]:
    """(write s, read s, CPU s) per repeat for each side, the sides alternating (which goes first alternates too)."""
    if str(WORKLOADS) not in sys.path:
        sys.path.insert(0, str(WORKLOADS))
    from tpuflow_driver import storage

    table = _table()
    resolvers = {"deadline": storage.resolve_with_deadline, "plain": storage.resolve}
    if storage.resolve_with_deadline(f"gs://{BUCKET}")[0].type_name != "py::gcs":
        raise RuntimeError("resolve_with_deadline did not wrap GCS")
    _round(storage.resolve, f"gs://{BUCKET}/warm-up", table)  # connections, imports
    runs: dict[str, list[tuple[float, float, float]]] = {name: [] for name in resolvers}
    for rep in range(repeats):
        order = list(resolvers) if rep % 2 == 0 else list(reversed(resolvers))
        for name in order:
            runs[name].append(_round(resolvers[name], f"gs://{BUCKET}/{name}-{rep}", table))
    return runs


@measure("storage_deadline_overhead")
def storage_deadline_overhead(ctx: Context) -> list[Result]:
    from tpuflow_rehearsal.gcs_emulator import EMULATOR_ENV, GcsEmulator, ensure_buckets

    repeats = 5 if ctx.quick else 7
    emulator = GcsEmulator.start(state_dir=ctx.work / "gcs-emulator")
    before = os.environ.get(EMULATOR_ENV)
    try:
        ensure_buckets(emulator.url, [BUCKET])
        os.environ[EMULATOR_ENV] = emulator.url
        runs = _sides(repeats)
    finally:
        if before is None:
            os.environ.pop(EMULATOR_ENV, None)
        else:
            os.environ[EMULATOR_ENV] = before
        emulator.stop()
    total = {name: median([w + r for w, r, _ in rows]) for name, rows in runs.items()}
    write = {name: median([w for w, _, _ in rows]) for name, rows in runs.items()}
    read = {name: median([r for _, r, _ in rows]) for name, rows in runs.items()}
    cpu = {name: median([c for _, _, c in rows]) for name, rows in runs.items()}
    r = ratio(total["deadline"], total["plain"])
    ctx.log(f"parquet on the GCS emulator, {FILES} files x {ROWS} rows: deadline {total['deadline']:.3f} s, "
            f"plain {total['plain']:.3f} s (write {write['deadline']:.3f} / {write['plain']:.3f}, "
            f"read {read['deadline']:.3f} / {read['plain']:.3f}, client CPU {cpu['deadline']:.3f} / "
            f"{cpu['plain']:.3f}); ratio {r:.3f}")  # fmt: skip
    return [Result(
        "storage_deadline_overhead", total["deadline"], "s", total["plain"], r, f"ratio <= {GOAL}",
        goal_check(r, "<=", GOAL), variant=f"parquet write + read, {FILES} files x {ROWS} rows, GCS emulator",
        baseline_is="the same writes and reads through the plain GcsFileSystem (storage.resolve), same run",
        ratio_means="deadline filesystem ÷ plain filesystem",
        notes=f"median of {repeats}, sides alternating; write {write['deadline']:.3f} / {write['plain']:.3f} s, "
              f"read {read['deadline']:.3f} / {read['plain']:.3f} s, client CPU {cpu['deadline']:.3f} / "
              f"{cpu['plain']:.3f} s (deadline / plain)",
        details={"write_s": write, "read_s": read, "client_cpu_s": cpu, "runs": runs},
    )]  # fmt: skip
