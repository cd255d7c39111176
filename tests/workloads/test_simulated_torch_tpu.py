"""tpuflow's CPU stand-in for torch_tpu (workloads/simulated_tpu): with it on the path, Ray's
TPUTorchDeviceManager is available, torch.device("tpu") exists and torch_tpu._loader.load()
registers a working tpu_dist backend; it refuses to shadow a real torch_tpu."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

SITE = Path(__file__).resolve().parents[2] / "workloads" / "simulated_tpu"

PROBE = """
import json, tempfile
from ray.air._internal.device_manager.tpu import TPUTorchDeviceManager
manager = TPUTorchDeviceManager()
out = {"available": manager.is_available()}
if out["available"]:
    import torch, torch.distributed as dist
    import torch_tpu
    out["devices"] = [str(d) for d in manager.get_devices()]
    TPUTorchDeviceManager.register_custom_torch_dist_backend()  # what Ray does for backend tpu_dist
    torch_tpu._loader.load()  # a second time: idempotent
    dist.init_process_group("tpu_dist", init_method="file://" + tempfile.mktemp(), rank=0, world_size=1)
    t = torch.arange(3.0)
    dist.all_reduce(t)
    out.update(backend=dist.get_backend(), reduced=t.tolist(), simulated=torch_tpu.SIMULATED)
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.ones(1, 2)).sum().backward()
    optimizer.step()  # asks torch.accelerator, hence torch.tpu, whether a chip is there
    out["accelerator_available"] = torch.accelerator.is_available()
print("PROBE " + json.dumps(out))
"""


def _probe(pythonpath: list[Path], code: str = PROBE) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = os.pathsep.join(str(p) for p in pythonpath)
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=180)


def _result(proc: subprocess.CompletedProcess[str]) -> dict:
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.split("PROBE ", 1)[1])


def test_rays_tpu_device_manager_runs_on_the_stand_in() -> None:
    assert _result(_probe([SITE])) == {
        "available": True,
        "devices": ["tpu"],
        "backend": "tpu_dist",
        "reduced": [0.0, 1.0, 2.0],
        "simulated": True,
        "accelerator_available": False,
    }


def test_without_the_stand_in_rays_tpu_path_is_unavailable() -> None:
    assert _result(_probe([])) == {"available": False}


def test_the_stand_in_never_shadows_a_real_torch_tpu(tmp_path: Path) -> None:
    real = tmp_path / "torch_tpu"
    real.mkdir()
    (real / "__init__.py").write_text("REAL = True\n")
    proc = _probe([SITE, tmp_path], "import torch_tpu")
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert f"would shadow the real torch_tpu at {real / '__init__.py'}" in last
    assert f"remove {SITE} from PYTHONPATH" in last


def test_a_second_copy_of_the_stand_in_is_not_a_real_torch_tpu(tmp_path: Path) -> None:
    """Ray's runtime_env (py_modules) can ship the stand-in to a cluster that already has it on the path."""
    shutil.copytree(SITE / "torch_tpu", tmp_path / "torch_tpu")
    proc = _probe([tmp_path, SITE], "import torch_tpu; print(torch_tpu.__file__)")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == str(tmp_path / "torch_tpu" / "__init__.py")
