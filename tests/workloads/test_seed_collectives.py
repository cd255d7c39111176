"""Seed 004's Ray Core collectives (examples/workloads/seed_collectives/ray_core_collectives.py, the seed's script
byte for byte) submitted with the seed's command line, `ray job submit --working-dir . -- python3
ray_core_collectives.py --topology=2x2 --accelerator-type=TPU-V6E`, through Ray's JobSubmissionClient:
one actor per chip of a slice reserved with slice_placement_group, tensors on the stand-in's ``tpu``
device, init_process_group(backend="tpu_dist"), a DTensor tensor-parallel step checked against a CPU
reference and an all-reduce whose sum the driver checks on every rank."""

from __future__ import annotations

import re
import uuid
from pathlib import Path

import pytest
from support.ray_cluster import run_job, running_cluster

SCRIPT_DIR = Path(__file__).resolve().parents[2] / "examples" / "workloads" / "seed_collectives"
RANK_LINE = re.compile(
    r"^Rank +(\d+) \(worker_id=(\d+), local_rank=(\d+), ip=([0-9.]+)\): all_reduce_sum=\[([0-9., ]+)\]$", re.M
)

pytestmark = pytest.mark.slow


def ranks(logs: str) -> dict[int, tuple[int, int, str, list[float]]]:
    """rank -> (worker_id, local_rank, node ip, all_reduce_sum) as the driver printed them."""
    return {
        int(r): (int(w), int(lr), ip, [float(x) for x in s.split(",")]) for r, w, lr, ip, s in RANK_LINE.findall(logs)
    }


@pytest.mark.long  # docs/contributing/testing.md lists it with make test-long (CI's time); make test runs the 2x4
def test_the_seed_script_unchanged_on_a_single_host_v6e_2x2(tmp_path: Path) -> None:
    with running_cluster(f"coll-{uuid.uuid4().hex[:6]}", tmp_path / "clusters") as cluster:
        logs = run_job(
            cluster,
            "ray_core_collectives.py --topology=2x2 --accelerator-type=TPU-V6E",
            {"working_dir": str(SCRIPT_DIR)},
            timeout=600,
        )
    seen = ranks(logs)
    expected = {r: (0, r, [10.0] * 4) for r in range(4)}  # one host: rank = chip, 1 + 2 + 3 + 4 everywhere
    assert {r: (w, lr, s) for r, (w, lr, _, s) in seen.items()} == expected, logs[-4000:]
    assert len({ip for _, _, ip, _ in seen.values()}) == 1
    assert re.search(
        r"All 4 TorchTPU ranks verified DTensor TP parity \(max_abs_diff=[0-9.]+\) and all_reduce sum = 10\.0", logs
    )


def test_the_seed_script_unchanged_on_a_two_host_v6e_2x4_fails_in_seconds_naming_the_fix(tmp_path: Path) -> None:
    """Two ct6e-standard-4t hosts: Ray 2.60 reads a v6e 2x4 as one 8-chip host, so the seed's arithmetic gives host 1
    ranks 8-11 of a WORLD_SIZE of 16 that can never form. tpu_dist refuses the group at once, with one line naming
    the slice and the fix, instead of waiting out gloo's 30-minute timeout."""
    import time

    from ray.job_submission import JobStatus
    from support.ray_cluster import submit_job

    with running_cluster(
        f"coll-{uuid.uuid4().hex[:6]}", tmp_path / "clusters", topology="2x4", machine_type="ct6e-standard-4t"
    ) as cluster:
        client, job = submit_job(
            cluster,
            "ray_core_collectives.py --topology=2x4 --accelerator-type=TPU-V6E",
            {"working_dir": str(SCRIPT_DIR)},
        )
        started = time.monotonic()
        while (status := client.get_job_status(job)) not in {JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.STOPPED}:
            assert time.monotonic() - started < 240, f"the job still {status}: a silent wait"
            time.sleep(1)
        logs = client.get_job_logs(job)
    assert status == JobStatus.FAILED, logs[-4000:]
    (line,) = {ln.split("SliceMismatchError: ", 1)[1] for ln in logs.splitlines() if "SliceMismatchError: " in ln}
    assert line.startswith(
        "tpu_dist: WORLD_SIZE=16 but this slice (v6e-8, topology 2x4) has 8 TPU devices on 2 host"
    ), line
    assert line.endswith("pass chips_per_vm=4 to ray.util.tpu.slice_placement_group"), line
