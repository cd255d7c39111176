"""`tpuflow slice`: the JSON contract and one-line errors (never a traceback)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

REQUIRED_KEYS = {
    "generation",
    "gke_accelerator",
    "ray_accelerator_type",
    "topology",
    "machine_type",
    "chips",
    "chips_per_host",
    "num_hosts",
    "multi_host",
    "ray_pod_type",
    "node_selector",
    "scaling_config",
}


def tpuflow(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tpuflow.cli", *args], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("accelerator", ["TPU-V6E", "tpu-v6e-slice", "v6e"])
def test_slice_json_contract(accelerator):
    out = tpuflow("slice", "--accelerator", accelerator, "--topology", "4x4", "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert REQUIRED_KEYS <= set(data)
    assert (data["generation"], data["chips"], data["num_hosts"], data["ray_pod_type"]) == ("v6e", 16, 4, "v6e-16")
    assert data["scaling_config"] == {
        "use_tpu": True,
        "topology": "4x4",
        "accelerator_type": "TPU-V6E",
        "num_workers": 4,
    }


def test_slice_two_vm_form_and_num_slices():
    out = tpuflow(
        "slice",
        "--accelerator",
        "TPU-V5LITEPOD",
        "--topology",
        "2x4",
        "--machine-type",
        "ct5lp-hightpu-4t",
        "--num-slices",
        "2",
        "--json",
    )
    data = json.loads(out.stdout)
    assert (data["num_hosts"], data["total_hosts"], data["machine_type"]) == (2, 4, "ct5lp-hightpu-4t")
    assert data["scaling_config"]["num_workers"] == 4


def test_human_summary():
    out = tpuflow("slice", "--accelerator", "v5p", "--topology", "2x2x2")
    assert out.returncode == 0
    assert "v5p 2x2x2 (v5p-16): 8 chips, multi-host, 2 x ct5p-hightpu-4t" in out.stdout


@pytest.mark.parametrize(
    ("args", "field", "hint"),
    [
        (["--accelerator", "TPU-V6E", "--topology", "16"], "topology", "4x4"),
        (["--accelerator", "TPU-V6E", "--topology", "4x5"], "topology", "valid shapes"),
        (["--accelerator", "TPU-V6E", "--topology", "2x2x2"], "topology", "2D"),
        (["--accelerator", "TPU-V5E", "--topology", "2x2"], "accelerator", "TPU-V5LITEPOD"),
        (
            ["--accelerator", "v6e", "--topology", "4x4", "--machine-type", "ct6e-standard-8t"],
            "machine_type",
            "ct6e-standard-4t",
        ),
        (["--accelerator", "v6e", "--topology", "4x4", "--num-slices", "0"], "num_slices", "1 or more"),
        (["--accelerator", "v6e", "--topology", "4x4", "--num-slices", "-1"], "num_slices", "1 or more"),
    ],
)
def test_bad_input_is_one_line_naming_the_field(args, field, hint):
    out = tpuflow("slice", *args, "--json")
    assert out.returncode == 2
    assert out.stdout == ""
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in out.stderr
    assert lines[0].startswith(f"tpuflow: error: {field}=") and hint in lines[0]
