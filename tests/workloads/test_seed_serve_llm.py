"""Seed 004's model on Ray Serve LLM as a team's own app builder (examples/workloads/seed_serve_llm/app.py),
rendered as docs/your-own-model.md says: `tpuflow render rayservice --import-path seed_serve_llm.app:build_app` on a
v6e 4x4. The RayService validates against KubeRay's CRD; the render hands the builder the slice's
accelerator_type / accelerator_config.topology / chips_per_host, and the LLMConfig the builder makes of
them is valid for Ray's own model and reserves exactly the rendered hosts. vLLM cannot run here: the
builder imports Ray Serve LLM only when Serve calls it."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.kuberay_crds import schema_errors

from tpuflow.cli import main

# a seed example, not in the provider wheel: on sys.path here as a team puts its own app on its pods' path
EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "workloads"
if str(EXAMPLES) not in sys.path:
    sys.path.insert(0, str(EXAMPLES))
IMPORT_PATH = "seed_serve_llm.app:build_app"
README_RENDER = [
    "render",
    "rayservice",
    "--accelerator",
    "TPU-V6E",
    "--topology",
    "4x4",
    "--image",
    "vllm/vllm-tpu:latest",
    "--import-path",
    IMPORT_PATH,
]


def served_args(manifest: dict[str, Any]) -> dict[str, Any]:
    (app,) = yaml.safe_load(manifest["spec"]["serveConfigV2"])["applications"]
    assert app["import_path"] == IMPORT_PATH
    return app.get("args") or {}


def test_the_readme_render_places_the_app_on_the_whole_4x4() -> None:
    from ray.llm._internal.serve.core.configs.accelerators import TPUAccelerator
    from ray.llm._internal.serve.core.configs.llm_config import LLMConfig
    from seed_serve_llm.app import MODEL_ID, llm_config

    done = subprocess.run(
        [sys.executable, "-m", "tpuflow.cli", *README_RENDER], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    manifest = yaml.safe_load(done.stdout)
    assert schema_errors("rayservices", manifest) == []
    args = served_args(manifest)
    assert args == {
        "accelerator_type": "TPU-V6E",
        "accelerator_config": {"kind": "tpu", "topology": "4x4"},
        "chips_per_host": 4,
    }
    assert "accelerator_type, accelerator_config, chips_per_host derived from the v6e 4x4 slice" in done.stderr
    group = manifest["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]
    container = group["template"]["spec"]["containers"][0]
    assert (group["numOfHosts"], container["resources"]["limits"]["google.com/tpu"]) == (4, "4")
    assert container["image"] == "vllm/vllm-tpu:latest"

    # What Serve's build_app makes of those args: Ray's own LLMConfig model accepts it (no vLLM needed) ...
    parsed = LLMConfig.model_validate(llm_config(args))
    assert "vllm" not in sys.modules
    assert parsed.model_id == MODEL_ID == "google/gemma-4-E2B-it"
    assert (parsed.accelerator_type, parsed.accelerator_config.topology) == ("TPU-V6E", "4x4")
    assert parsed.engine_kwargs["tensor_parallel_size"] == 16
    # ... and each replica reserves one bundle per rendered host, each the host's TPU.
    backend = TPUAccelerator(parsed.accelerator_config)
    assert backend.requires_deferred_placement_group
    bundles = backend.default_bundles(num_devices=16, accelerator_type_str=parsed.accelerator_type)
    assert [b["TPU"] for b in bundles] == [4] * group["numOfHosts"]


def test_a_two_host_2x4_is_refused_by_the_builder_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    from seed_serve_llm.app import AppArgsError, llm_config

    argv = [*README_RENDER, "--json"]
    argv[argv.index("4x4")] = "2x4"
    rc = main([*argv, "--machine-type", "ct6e-standard-4t"])
    out, _ = capsys.readouterr()
    assert rc == 0
    args = served_args(yaml.safe_load(out))
    assert args["chips_per_host"] == 4
    # Ray Serve LLM 2.60 reads a v6e 2x4 as one 8-chip host: its one bundle would never fit a 4-chip VM.
    with pytest.raises(AppArgsError) as err:
        llm_config(args)
    message = str(err.value)
    assert message.startswith("args.chips_per_host=4 is invalid:") and "hosts of 8 chips" in message
    assert "\n" not in message


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        ({"modle_id": "acme/m"}, "args.modle_id='acme/m' is invalid: this builder reads only"),
        ({"model_id": "acme/m"}, 'args.accelerator_config=None is invalid: give {"kind": "tpu"'),
        (
            {"accelerator_type": "TPU-V6E", "accelerator_config": {"kind": "gpu", "topology": "4x4"}},
            "args.accelerator_config={'kind': 'gpu', 'topology': '4x4'} is invalid",
        ),
        (
            {"accelerator_type": "TPU-V6E", "accelerator_config": {"kind": "tpu", "topology": "four"}},
            "args.accelerator_config.topology='four' is invalid",
        ),
    ],
)
def test_a_bad_arg_is_named_with_its_value(args: dict[str, Any], needle: str) -> None:
    from seed_serve_llm.app import AppArgsError, llm_config

    with pytest.raises(AppArgsError, match="^args\\.") as err:
        llm_config(args)
    assert needle in str(err.value)


def test_a_single_host_app_takes_its_slice_as_app_args(capsys: pytest.CaptureFixture[str]) -> None:
    from ray.llm._internal.serve.core.configs.accelerators import TPUAccelerator
    from ray.llm._internal.serve.core.configs.llm_config import LLMConfig
    from seed_serve_llm.app import llm_config

    argv = [*README_RENDER, "--json", "--app-arg", "model_id=acme/chat", "--app-arg", "model_source=gs://acme/chat"]
    argv[argv.index("4x4")] = "2x2"
    argv += [
        "--app-arg",
        "accelerator_type=TPU-V6E",
        "--app-arg",
        'accelerator_config={"kind": "tpu", "topology": "2x2"}',
    ]
    assert main(argv) == 0
    out, err = capsys.readouterr()
    assert err == ""  # a single host: the render derives nothing
    parsed = LLMConfig.model_validate(llm_config(served_args(yaml.safe_load(out))))
    assert (parsed.model_id, parsed.model_loading_config.model_source) == ("acme/chat", "gs://acme/chat")
    assert parsed.engine_kwargs["tensor_parallel_size"] == 4
    bundles = TPUAccelerator(parsed.accelerator_config).default_bundles(
        num_devices=4, accelerator_type_str=parsed.accelerator_type
    )
    assert [b["TPU"] for b in bundles] == [4]


def test_ray_serve_llm_is_imported_only_when_serve_builds_the_app() -> None:
    # A fresh process: importing the module (as Serve resolves the import path) pulls in neither Ray
    # Serve LLM nor vLLM; build_app does, and without vLLM that is Ray's own error naming it.
    code = textwrap.dedent(
        """
        import sys
        from seed_serve_llm import app
        assert "ray.serve.llm" not in sys.modules and "vllm" not in sys.modules
        try:
            import vllm  # noqa: F401
        except ImportError:
            try:
                app.build_app({})
            except ImportError as err:
                print("NO-VLLM", err)
        else:
            args = {"accelerator_type": "TPU-V6E", "accelerator_config": {"kind": "tpu", "topology": "2x2"}}
            print("BUILT", type(app.build_app(args)).__name__)
        """
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=EXAMPLES)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("BUILT Application") or (
        done.stdout.startswith("NO-VLLM") and "vLLM" in done.stdout
    ), done.stdout
