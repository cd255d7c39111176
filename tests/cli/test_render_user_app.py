"""`tpuflow render rayservice --import-path` for a team's own app on a multi-host slice: the Serve
deployment's TPU placement (accelerator type, topology, TPU per host bundle) comes from the one slice
definition the worker group is built from; a value the user declared that contradicts it is refused."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.kuberay_crds import schema_errors

from tpuflow.cli import main

USER_APP = "acme_models.chat:build_app"  # not the demo's app: nothing here knows its args
TWO_HOST_2X4 = ["--accelerator", "v6e", "--topology", "2x4", "--machine-type", "ct6e-standard-4t"]
V6E_4X4 = ["--accelerator", "v6e", "--topology", "4x4"]


def render(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(["render", "rayservice", *argv])
    out, err = capsys.readouterr()
    return rc, out, err


def served_app(manifest: dict[str, Any]) -> dict[str, Any]:
    (app,) = yaml.safe_load(manifest["spec"]["serveConfigV2"])["applications"]
    return app


def worker_group(manifest: dict[str, Any]) -> tuple[int, str]:
    group = manifest["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]
    limits = group["template"]["spec"]["containers"][0]["resources"]["limits"]
    return group["numOfHosts"], limits["google.com/tpu"]


def test_the_cli_derives_the_placement_for_a_two_host_2x4(tmp_path: Path) -> None:
    # As a user runs it: a fresh process, the manifest on stdout.
    done = subprocess.run(
        [sys.executable, "-m", "tpuflow.cli", "render", "rayservice", *TWO_HOST_2X4, "--import-path", USER_APP],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    manifest = yaml.safe_load(done.stdout)
    assert schema_errors("rayservices", manifest) == []
    app = served_app(manifest)
    assert app["import_path"] == USER_APP
    assert app["args"] == {
        "accelerator_type": "TPU-V6E",
        "accelerator_config": {"kind": "tpu", "topology": "2x4"},
        "chips_per_host": 4,
    }
    assert worker_group(manifest) == (2, "4")  # the bundles the replica reserves are the hosts rendered
    assert "accelerator_type, accelerator_config, chips_per_host derived from the v6e 2x4 slice" in done.stderr


def test_a_4x4_keeps_the_users_own_args_and_adds_the_slice(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = render(
        capsys,
        *V6E_4X4,
        "--num-slices",
        "2",
        "--import-path",
        USER_APP,
        "--app-arg",
        "model_dir=gs://acme/chat",
        "--app-arg",
        'accelerator_config={"kind": "tpu"}',  # partly declared: completed, not replaced
        "--app-arg",
        "accelerator_type=TPU-V6E",
        "--json",
    )
    assert rc == 0
    manifest = json.loads(out)
    assert served_app(manifest)["args"] == {
        "model_dir": "gs://acme/chat",
        "accelerator_config": {"kind": "tpu", "topology": "4x4"},
        "accelerator_type": "TPU-V6E",
        "chips_per_host": 4,
    }
    group = manifest["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]
    assert (group["numOfHosts"], group["replicas"]) == (4, 2)
    assert worker_group(manifest) == (4, "4")


def test_a_serve_config_file_app_without_placement_is_completed(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    config = {
        "applications": [
            {"name": "chat", "import_path": USER_APP, "route_prefix": "/chat"},
            {
                "name": "llm",
                "import_path": "ray.serve.llm:build_openai_app",
                "route_prefix": "/v1",
                "args": {"llm_configs": [{"model_loading_config": {"model_id": "acme/m"}}]},
            },
        ]
    }
    path = tmp_path / "serve.yaml"
    path.write_text(yaml.safe_dump(config))
    rc, out, _ = render(capsys, *V6E_4X4, "--serve-config", str(path))
    assert rc == 0
    chat, llm = yaml.safe_load(yaml.safe_load(out)["spec"]["serveConfigV2"])["applications"]
    assert chat["args"]["accelerator_config"] == {"kind": "tpu", "topology": "4x4"}
    # LLMConfig forbids unknown fields: only its own two placement fields are added.
    assert llm["args"]["llm_configs"] == [
        {
            "model_loading_config": {"model_id": "acme/m"},
            "accelerator_type": "TPU-V6E",
            "accelerator_config": {"kind": "tpu", "topology": "4x4"},
        }
    ]


def test_a_single_host_slice_leaves_the_app_as_given(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = render(capsys, "--accelerator", "v6e", "--topology", "2x2", "--import-path", USER_APP)
    assert rc == 0 and err == ""
    assert "args" not in served_app(yaml.safe_load(out))


@pytest.mark.parametrize(
    ("slice_args", "app_arg", "needle"),
    [
        (
            V6E_4X4,
            'accelerator_config={"kind": "tpu", "topology": "2x4"}',
            "applications[default].args.accelerator_config.topology='2x4' is invalid: the serve slice is v6e 4x4 "
            "(4 hosts of 4 chips): give '4x4'",
        ),
        (TWO_HOST_2X4, "accelerator_type=TPU-V5E", "args.accelerator_type='TPU-V5E' is invalid"),
        (TWO_HOST_2X4, "chips_per_host=2", "args.chips_per_host=2 is invalid: the serve slice is v6e 2x4"),
        (V6E_4X4, 'accelerator_config={"kind": "gpu"}', "args.accelerator_config.kind='gpu' is invalid"),
        # a file-referenced LLM config cannot be completed or checked: still refused up front
        (V6E_4X4, 'llm_configs=["llm.yaml"]', "args.llm_configs=['llm.yaml'] is invalid: on a multi-host slice"),
    ],
)
def test_a_declared_value_the_slice_contradicts_is_refused_in_one_line(
    capsys: pytest.CaptureFixture[str], slice_args: list[str], app_arg: str, needle: str
) -> None:
    rc, out, err = render(capsys, *slice_args, "--import-path", USER_APP, "--app-arg", app_arg)
    assert (rc, out) == (2, "")
    assert needle in err, err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_a_contradiction_from_a_fresh_process_has_no_traceback() -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "tpuflow.cli",
            "render",
            "rayservice",
            *V6E_4X4,
            "--import-path",
            USER_APP,
            "--app-arg",
            'accelerator_config={"kind": "tpu", "topology": "2x2"}',
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and done.stdout == ""
    (line,) = done.stderr.splitlines()
    assert "accelerator_config.topology='2x2'" in line and "give '4x4'" in line


def test_app_args_need_the_import_path(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "serve.json"
    path.write_text(json.dumps({"applications": [{"name": "a", "import_path": USER_APP}]}))
    rc, _, err = render(capsys, *V6E_4X4, "--serve-config", str(path), "--app-arg", "k=v")
    assert rc == 2 and "--app-arg='k=v'" in err
