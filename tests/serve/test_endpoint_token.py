"""An optional bearer token on Serve endpoints: the app gets only its SHA-256 digest and answers 401
without the token; the deploy operator hands every app the digest from a Connection; the smoke test sends
the token."""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Iterator
from email.message import Message
from pathlib import Path

import pytest
import requests
from support.airflow_context import task_context
from support.loopback_endpoint import LoopbackEndpoint
from support.ray_in_process import free_port, in_process_ray

from tpuflow.errors import UserInputError
from tpuflow.serve.operators import (
    RayServeDeploymentFailedError,
    RayServeDeployOperator,
    ServeEndpointSmokeTestOperator,
)

WORKLOADS = Path(__file__).resolve().parents[2] / "workloads"
if str(WORKLOADS) not in sys.path:
    sys.path.insert(0, str(WORKLOADS))

from tpuflow_driver.endpoint_token import authorized, checked_digest, token_digest  # noqa: E402

TOKEN = "endpoint-token-1"
DIGEST = hashlib.sha256(TOKEN.encode()).hexdigest()
CONN = "serve_token"
CONFIG = {"applications": [{"name": "addition", "import_path": "addition.serve_app:app_builder", "args": {"a": 1}}]}


@pytest.fixture
def token_conn(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv(f"AIRFLOW_CONN_{CONN.upper()}", json.dumps({"conn_type": "generic", "password": TOKEN}))
    monkeypatch.setenv("AIRFLOW_CONN_WRONG_TOKEN", json.dumps({"conn_type": "generic", "password": "not-it"}))
    monkeypatch.setenv("AIRFLOW_CONN_NO_PASSWORD", json.dumps({"conn_type": "generic"}))
    return CONN


def test_the_check_compares_digests_and_refuses_everything_else() -> None:
    assert token_digest(TOKEN) == DIGEST
    assert authorized(f"Bearer {TOKEN}", DIGEST) and authorized(f"bearer  {TOKEN} ", DIGEST)
    for header in (None, "", "Bearer", "Bearer ", f"Basic {TOKEN}", "Bearer wrong", f"Bearer {DIGEST}", TOKEN):
        assert not authorized(header, DIGEST), header
    assert authorized(None, None)  # no digest configured: the endpoint stays open
    assert checked_digest(DIGEST) == DIGEST and checked_digest(None) is None
    with pytest.raises(ValueError, match="token_sha256"):
        checked_digest(TOKEN)  # the plaintext token is refused as an arg


def test_the_deploy_gives_every_app_the_digest_never_the_token(token_conn: str) -> None:
    two = {"applications": [*CONFIG["applications"], {"name": "b", "import_path": "m:app"}]}
    op = RayServeDeployOperator(
        task_id="deploy", serve_config=two, cluster={"dashboard_url": "http://x"}, serve_token_conn_id=token_conn
    )
    sent = op._config_to_deploy()
    assert [a["args"]["token_sha256"] for a in sent["applications"]] == [DIGEST, DIGEST]
    assert sent["applications"][0]["args"]["a"] == 1
    assert TOKEN not in json.dumps(sent) and "token_sha256" not in json.dumps(op.serve_config)
    unguarded = RayServeDeployOperator(task_id="d2", serve_config=CONFIG, cluster={"dashboard_url": "http://x"})
    assert unguarded._config_to_deploy() == CONFIG
    with pytest.raises(UserInputError, match="serve_token_conn_id"):
        RayServeDeployOperator(
            task_id="d3", serve_config=CONFIG, cluster={"dashboard_url": "http://x"}, serve_token_conn_id="no_password"
        )._config_to_deploy()


def test_the_rayservice_carries_the_digest_never_the_token(token_conn: str) -> None:
    from tpuflow.kuberay.operators import KubeRayDeployServiceOperator
    from tpuflow.tpu import TpuSlice

    app = {"name": "addition", "import_path": "addition.serve_app:app_builder", "args": {"checkpoint": "gs://b/c"}}
    op = KubeRayDeployServiceOperator(
        task_id="deploy",
        tpu_slice=TpuSlice.from_spec("v6e", "2x2"),
        image="rayproject/ray:2.60.0-py311",
        serve_config={"applications": [app]},
        serve_token_conn_id=token_conn,
    )
    body = op.build_body(task_context(task_id="deploy"), "default")
    serve_config = json.dumps(body["spec"]["serveConfigV2"])
    assert DIGEST in serve_config and TOKEN not in json.dumps(body)
    with pytest.raises(UserInputError, match="serve_token_conn_id"):
        KubeRayDeployServiceOperator(
            task_id="llm", tpu_slice=TpuSlice.from_spec("v6e", "2x2"), image="vllm/vllm-tpu:x", llm_model_id="m/m",
            serve_token_conn_id=token_conn,
        )  # fmt: skip


def answer_if_authorized(headers: Message, body: bytes) -> tuple[int, str]:
    """A completions endpoint that answers 401 unless the bearer token hashes to DIGEST."""
    if authorized(headers.get("Authorization"), DIGEST):
        return 200, json.dumps({"choices": [{"text": "42"}]})
    return 401, json.dumps({"error": "unauthorized"})


@pytest.fixture
def guarded() -> Iterator[LoopbackEndpoint]:
    with LoopbackEndpoint(answer_if_authorized) as endpoint:
        yield endpoint


def _smoke(url: str, conn: str | None) -> ServeEndpointSmokeTestOperator:
    payload = {"prompt": "17+25="}
    return ServeEndpointSmokeTestOperator(
        task_id="smoke", url=url, payload=payload, expect="42", timeout=20, serve_token_conn_id=conn
    )


def test_the_smoke_test_sends_the_token_and_fails_at_once_without_it(
    guarded: LoopbackEndpoint, token_conn: str
) -> None:
    assert _smoke(guarded.url, token_conn).execute(task_context(task_id="smoke"))["choices"][0]["text"] == "42"
    with pytest.raises(RayServeDeploymentFailedError, match="requires a bearer token; pass serve_token_conn_id"):
        _smoke(guarded.url, None).execute(task_context(task_id="smoke"))
    with pytest.raises(RayServeDeploymentFailedError, match="'wrong_token' is not the deploy's"):
        _smoke(guarded.url, "wrong_token").execute(task_context(task_id="smoke"))


# --- the real application on Ray Serve (one Ray-heavy test) ---------------------------------------------
def _untrained_checkpoint(directory: Path) -> str:
    """A checkpoint of initial weights: the routes' auth does not depend on what the model learnt."""
    from addition import checkpoint as ckpt
    from addition.model_jax import init_params
    from addition.training import model_config, resolve_config

    spec, model = model_config(resolve_config({}))
    ckpt.save(directory, ckpt.Meta("jax", 0, 0, model, spec), init_params(model))
    return str(directory)


@pytest.mark.long  # a Ray cluster and Serve: 30-90 s on 2 shared cores
def test_the_addition_app_answers_401_without_the_token_and_200_with_it(tmp_path: Path) -> None:
    from addition.serve_app import app_builder
    from ray import serve

    checkpoint = _untrained_checkpoint(tmp_path / "ckpt")
    port = free_port()
    with in_process_ray(num_cpus=2, prefix="tfs-"):
        try:
            serve.start(http_options={"host": "127.0.0.1", "port": port})
            args = {"checkpoint": checkpoint, "framework": "jax", "model_name": "m", "backend": "numpy"}
            serve.run(app_builder({**args, "token_sha256": DIGEST}), name="addition", route_prefix="/addition")
            base = f"http://127.0.0.1:{port}/addition/v1"
            body = {"model": "m", "prompt": "1+1=", "max_tokens": 2}
            for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {TOKEN}"}):
                assert requests.get(f"{base}/models", headers=headers, timeout=30).status_code == 401, headers
                refused = requests.post(f"{base}/completions", json=body, headers=headers, timeout=30)
                assert refused.status_code == 401 and refused.headers["WWW-Authenticate"].startswith("Bearer")
            bearer = {"Authorization": f"Bearer {TOKEN}"}
            assert requests.get(f"{base}/models", headers=bearer, timeout=30).json()["data"][0]["id"] == "m"
            assert requests.post(f"{base}/completions", json=body, headers=bearer, timeout=60).status_code == 200
            with pytest.raises(ValueError, match="token_sha256"):
                app_builder({**args, "token_sha256": TOKEN})
        finally:
            serve.shutdown()
