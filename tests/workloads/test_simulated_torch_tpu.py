"""tpuflow's CPU stand-in for torch_tpu (workloads/simulated_tpu): with it on the path, Ray's
TPUTorchDeviceManager is available, tensors live on torch.device("tpu") (ops, in-place ops, views,
autograd, nn.Module.to, optimizers), torch_tpu._loader.load() registers a working tpu_dist backend
whose collectives take tpu tensors; it refuses to shadow a real torch_tpu."""

from __future__ import annotations

import json
import os
import shutil
import socket
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
    t = torch.arange(3.0, device="tpu")
    dist.all_reduce(t)
    out.update(backend=dist.get_backend(), reduced=t.cpu().tolist(), simulated=torch_tpu.SIMULATED)
    model = torch.nn.Linear(2, 1).to("tpu")
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.ones(1, 2, device="tpu")).sum().backward()
    optimizer.step()  # asks torch.accelerator, hence torch.tpu, about the chip
    out["accelerator"] = str(torch.accelerator.current_accelerator())
    out["param_device"] = str(next(model.parameters()).device)
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
        "accelerator": "tpu",
        "param_device": "tpu:0",
    }


def test_without_the_stand_in_rays_tpu_path_is_unavailable() -> None:
    assert _result(_probe([])) == {"available": False}


def test_the_stand_in_never_shadows_a_real_torch_tpu(tmp_path: Path) -> None:
    real = tmp_path / "torch_tpu"
    real.mkdir()
    (real / "__init__.py").write_text("REAL = True\n")
    proc = _probe([SITE, tmp_path], "import torch_tpu")
    assert proc.returncode != 0
    # torch's backend autoload (the stand-in's entry point) meets it first and re-raises it with its cause
    (line,) = [ln for ln in proc.stderr.splitlines() if ln.startswith("ImportError: ")]
    assert f"would shadow the real torch_tpu at {real / '__init__.py'}" in line
    assert f"remove {SITE} from PYTHONPATH" in line


def test_a_second_copy_of_the_stand_in_is_not_a_real_torch_tpu(tmp_path: Path) -> None:
    """Ray's runtime_env (py_modules) can ship the stand-in to a cluster that already has it on the path."""
    shutil.copytree(SITE / "torch_tpu", tmp_path / "torch_tpu")
    proc = _probe([tmp_path, SITE], "import torch_tpu; print(torch_tpu.__file__)")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == str(tmp_path / "torch_tpu" / "__init__.py")


TENSORS = """
import json
import torch, torch_tpu
x = torch.randn(3, 4)
t = x.to("tpu")
out = {"device": str(t.device), "type": type(t).__name__, "roundtrip": torch.equal(t.cpu(), x)}
y = t * 2 + 1
out["op"] = [str(y.device), torch.allclose(y.cpu(), x * 2 + 1)]
same = t.add_(1)
out["in_place"] = [same is t, torch.allclose(t.cpu(), x + 1)]
t.view(12)[0] = 100.0  # a write through a view reaches its base
out["view"] = t.cpu()[0, 0].item()
out["factories"] = [torch.full((2,), 3.0, device="tpu").cpu().tolist(), torch.arange(3, device="tpu").cpu().tolist()]
model = torch.nn.Linear(4, 2).to("tpu")
out["module"] = [str(model.weight.device), isinstance(model.weight, torch.nn.Parameter)]
inputs = torch.randn(5, 4, device="tpu", requires_grad=True)
model(inputs).pow(2).sum().backward()
ref = torch.nn.Linear(4, 2)
ref.load_state_dict({k: v.cpu() for k, v in model.state_dict().items()})
ref_inputs = inputs.detach().cpu().requires_grad_()
ref(ref_inputs).pow(2).sum().backward()
out["grads"] = [str(model.weight.grad.device), torch.allclose(model.weight.grad.cpu(), ref.weight.grad),
                torch.allclose(inputs.grad.cpu(), ref_inputs.grad)]
print("PROBE " + json.dumps(out))
"""


def test_tensors_live_on_the_tpu_device() -> None:
    assert _result(_probe([SITE], TENSORS)) == {
        "device": "tpu:0",
        "type": "TpuTensor",
        "roundtrip": True,
        "op": ["tpu:0", True],
        "in_place": [True, True],
        "view": 100.0,
        "factories": [[3.0, 3.0], [0, 1, 2]],
        "module": ["tpu:0", True],
        "grads": ["tpu:0", True, True],
    }


ALL_REDUCE = """
import json, torch, torch.distributed as dist
import torch_tpu  # registers tpu_dist, as the seed's import does
dist.init_process_group(backend="tpu_dist")
t = torch.full((4,), float(dist.get_rank() + 1), device="tpu")
dist.all_reduce(t, op=dist.ReduceOp.SUM)
print("PROBE " + json.dumps({"device": str(t.device), "sum": t.cpu().tolist()}))
dist.destroy_process_group()
"""


def test_all_reduce_of_tpu_tensors_over_tpu_dist_in_two_processes() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(PYTHONPATH=str(SITE), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE="2")
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", ALL_REDUCE],
            env={**env, "RANK": str(rank)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in (0, 1)
    ]
    results = []
    for proc in procs:
        stdout, stderr = proc.communicate(timeout=120)
        results.append(_result(subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)))
    assert results == [{"device": "tpu:0", "sum": [3.0] * 4}] * 2
