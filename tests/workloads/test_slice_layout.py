"""The multi-slice checks of the workloads, without Ray: the workers' slice layout and the preflight spec."""

from __future__ import annotations

import pytest
from addition.train_jax import check_slice_layout, slice_layout, worker_identity
from tpuflow_driver.preflight import PreflightSpec


def _w(rank: int, name: str, slice_id: int, num: int = 2) -> dict:
    return {"rank": rank, "slice_name": name, "tpu_worker_id": rank % 2, "megascale_slice_id": slice_id,
            "megascale_num_slices": num}  # fmt: skip


def test_two_slices_of_two_workers_each_are_one_group():
    layout = [_w(0, "a", 0), _w(1, "a", 0), _w(2, "b", 1), _w(3, "b", 1)]
    assert check_slice_layout(layout) == {"a": [0, 1], "b": [2, 3]}


@pytest.mark.parametrize(
    ("layout", "problem"),
    [
        ([_w(0, "a", 0), _w(1, "b", 0), _w(2, "a", 1), _w(3, "b", 1)], "MEGASCALE_SLICE_ID per slice"),  # mixed
        ([_w(0, "a", 0), _w(1, "a", 0), _w(2, "b", 0), _w(3, "b", 0)], "MEGASCALE_SLICE_ID per slice"),  # one id
        ([_w(0, "a", 0), _w(1, "a", 0), _w(2, "a", 0), _w(3, "b", 1)], "uneven"),
        ([_w(0, "a", -1, 0), _w(1, "b", -1, 0)], "MEGASCALE_NUM_SLICES"),  # two slices, no multi-slice env
    ],
)
def test_workers_that_are_not_one_multislice_group_fail(layout, problem):
    with pytest.raises(RuntimeError, match=problem):
        check_slice_layout(layout)


def test_one_slice_needs_no_multislice_env(monkeypatch):
    monkeypatch.setenv("TPU_NAME", "s-0")
    monkeypatch.setenv("TPU_WORKER_ID", "1")
    for key in ("MEGASCALE_SLICE_ID", "MEGASCALE_NUM_SLICES"):
        monkeypatch.delenv(key, raising=False)
    layout = slice_layout(worker_identity())  # one process: no collective
    assert layout == [{"rank": 0, "slice_name": "s-0", "tpu_worker_id": 1, "megascale_slice_id": -1,
                       "megascale_num_slices": 0}]  # fmt: skip
    assert check_slice_layout(layout) == {"s-0": [0]}


def test_preflight_spec_checks_its_keys():
    spec = PreflightSpec.from_dict({"topology": "2x4", "accelerator_version": "v6e", "num_slices": 2, "deadline_s": 5})
    assert spec.placement == {"topology": "2x4", "accelerator_version": "v6e", "num_slices": 2}
    assert (spec.deadline_s, spec.collective) == (5.0, "jax")
    for bad in ({"topology": "2x4"}, {"topology": "2x4", "accelerator_version": "v6e", "deadline_s": 0},
                {"topology": "2x4", "accelerator_version": "v6e", "collective": "mpi"},
                {"topology": "2x4", "accelerator_version": "v6e", "extra": 1}):  # fmt: skip
        with pytest.raises(ValueError):
            PreflightSpec.from_dict(bad)


def test_the_driver_log_says_which_slice_lost_which_host(capsys):
    from tpuflow_driver.train import HostWatch

    def node(node_id, slice_name, worker, alive=True):
        return {"NodeID": node_id, "Alive": alive,
                "Labels": {"ray.io/tpu-slice-name": slice_name, "ray.io/tpu-worker-id": worker}}  # fmt: skip

    nodes = [node("a" * 20, "s-0", "0"), node("b" * 20, "s-0", "1"), node("c" * 20, "s-1", "0"),
             node("d" * 20, "s-1", "1"), {"NodeID": "head", "Alive": True, "Labels": {}}]  # fmt: skip
    watch = HostWatch(lambda: list(nodes))
    nodes[3] = node("d" * 20, "s-1", "1", alive=False)
    watch.check()
    assert watch.lost == [("s-1", "1")]
    nodes.append(node("e" * 20, "s-1", "1"))  # GKE recreated the VM
    watch.check()
    out = capsys.readouterr().out
    assert "slice s-1 lost its host worker 1 (Ray node dddddddddddd)" in out
    assert "slice s-1 has a host worker 1 again" in out and watch.lost == [("s-1", "1")]
