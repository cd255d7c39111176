"""bench/serving.py's parts that need no Ray cluster: the configs it deploys (the pipeline's own, with
batching switched on for the batched app), the load generators against a local HTTP server, and the
rows it reports (names, goals, what the ratios compare). No timing asserts."""

from __future__ import annotations

import json
from collections.abc import Iterator
from email.message import Message
from typing import Any

import pytest
from support.loopback_endpoint import LoopbackEndpoint

from bench import serving
from bench.core import MEASURES, Result
from bench.serving import APP, BATCHED, BATCHING, CLIENTS, NO_BATCHING, PLAIN, UNBATCHED, Figures

INFO = {"backend": "local", "serve_port": 18200, "serve_url": "http://127.0.0.1:18200"}


def test_the_apps_are_the_pipelines_config_with_batching_only_where_asked() -> None:
    from ray.serve.schema import ServeDeploySchema
    from tpuflow.workloads.addition.pipeline import SERVE_DEPLOYMENT

    from tpuflow.pipeline.params import local_serve_slice
    from tpuflow.tpu import TpuSlice

    plain = serving.plain_app("/ckpt")
    app = serving.product_app(INFO, "/ckpt", "addition")
    batched = serving.product_app(INFO, "/ckpt", "addition-batched", batching=True)
    assert "deployments" not in app and app["route_prefix"] == "/addition"
    assert batched["route_prefix"] == "/addition-batched"
    assert batched["deployments"] == [{"name": SERVE_DEPLOYMENT, "user_config": BATCHING}]
    off = serving.product_app(INFO, "/ckpt", "addition-off", batching=False)
    assert off["deployments"] == [{"name": SERVE_DEPLOYMENT, "user_config": NO_BATCHING}]
    assert {k: v for k, v in batched.items() if k not in ("name", "route_prefix", "deployments")} == {
        k: v for k, v in app.items() if k not in ("name", "route_prefix")
    }
    config = serving.serve_config(INFO, [app, batched, plain])
    assert ServeDeploySchema.model_validate(config).http_options.port == 18200
    tpu = TpuSlice.from_spec("TPU-V6E", "2x4", "ct6e-standard-4t")
    multi = serving.product_app(INFO, "/ckpt", "addition-mh", tpu.to_dict(), batching=True)
    assert multi["args"]["accelerator_config"] == {"kind": "tpu", "topology": "2x4"}
    single = serving.product_app(INFO, "/ckpt", "addition-1h", local_serve_slice(tpu, None).to_dict())
    assert single["args"]["accelerator_config"]["topology"] == "2x2" and single["args"]["chips_per_host"] == 4
    on_head = serving.plain_app("/ckpt", on_head=True)
    (dep,) = ServeDeploySchema.model_validate(serving.serve_config(INFO, [multi, on_head])).applications[1].deployments
    assert dep.ray_actor_options.resources == {serving.HEAD_RESOURCE: 0.001}
    ep = serving.endpoint(INFO, batched, BATCHED)
    assert ep.url == "http://127.0.0.1:18200/addition-batched/v1/completions"
    assert ep.body == {"model": "addition", "prompt": "17+25=", "max_tokens": 4, "temperature": 0}
    assert serving.endpoint(INFO, plain, PLAIN).url == "http://127.0.0.1:18200/plain"


def _echo(headers: Message, body: bytes) -> tuple[int, str]:
    return 500 if json.loads(body).get("fail") else 200, '{"choices": [{"text": "42"}]}'


@pytest.fixture
def echo_url() -> Iterator[str]:
    with LoopbackEndpoint(_echo, path="/x", keep_alive=True) as endpoint:
        yield endpoint.url


def test_load_generators_count_answers_and_errors(echo_url: str) -> None:
    import asyncio

    eps = [serving.Endpoint("a", echo_url, {}), serving.Endpoint("b", echo_url, {"x": 1})]
    assert {k: len(v) for k, v in serving._sequential_ms(eps, 5).items()} == {"a": 5, "b": 5}
    assert serving._rotated([1, 2, 3], 1) == [2, 3, 1] and serving._rotated([1, 2, 3], 3) == [1, 2, 3]
    rps, errors = asyncio.run(serving._rps(echo_url, {}, 4, 0.3))
    assert rps > 0 and errors == 0
    rps, errors = asyncio.run(serving._rps(echo_url, {"fail": True}, 2, 0.2))
    assert rps == 0 and errors > 0


def _figs(app_rps: float, other_rps: float | None, plain_rps: float, other: str = BATCHED) -> dict[str, Figures]:
    def fig(ms: float, rps: float) -> Figures:
        return Figures([ms] * 10, {c: rps * c / 32 for c in CLIENTS}, dict.fromkeys(CLIENTS, 0))

    out = {APP: fig(8.0, app_rps), PLAIN: fig(6.0, plain_rps)}
    if other_rps is not None:
        out[other] = fig(8.5, other_rps)
    return out


def test_rows_keep_the_names_and_goals_and_compare_what_they_say() -> None:
    direct = {"jax": [1.0] * 10, "numpy": [1.5] * 10}
    rows = serving.serve_rows("", "", _figs(100.0, 130.0, 80.0), direct, "jax", with_goals=True, where="w")
    by_name = {r.name: r for r in rows}
    assert list(by_name) == ["serve_overhead_p50_ms", "serve_rps_32", "serve_batched_rps_32"]
    over, rps, batched = by_name.values()
    assert (over.value, over.baseline, over.goal, over.met, over.variant) == (7.0, 1.0, "value <= 5 ms", False, "")
    assert (rps.value, rps.baseline, rps.ratio, rps.goal, rps.met) == (100.0, 80.0, 1.25, "ratio >= 1.0", True)
    assert rps.details["rps"][PLAIN] == {"1": 2.5, "8": 20.0, "32": 80.0}
    assert rps.series[f"{APP}_x"] == list(CLIENTS) and rps.series[BATCHED] == [130.0 * c / 32 for c in CLIENTS]
    assert (batched.value, batched.baseline, batched.ratio, batched.met) == (130.0, 100.0, 1.3, True)
    assert batched.variant == "CPU replica" and batched.details["p50_ms"] == {"batched": 8.5, "unbatched": 8.0}
    json.dumps([r.row() for r in rows])  # what latest.json gets


def test_rows_without_goals_or_batched_figures() -> None:
    rows = serving.serve_rows("_multi_host", "v6e 2x4, 2 hosts", _figs(10.0, None, 80.0), {"jax": [1.0]}, "jax",
                              with_goals=False, where="w")  # fmt: skip
    assert [r.name for r in rows] == ["serve_overhead_p50_ms_multi_host", "serve_rps_32_multi_host"]
    assert all(r.met is None and r.goal == serving.NO_GOAL and r.variant == "v6e 2x4, 2 hosts" for r in rows)
    assert rows[1].ratio == 0.125


def test_where_the_demo_app_batches_by_default_the_baseline_is_batching_off() -> None:
    figs = _figs(150.0, 60.0, 12.0, other=UNBATCHED)
    rows = serving.serve_rows("_multi_host", "v6e 2x4, 2 hosts", figs, {"jax": [1.0]}, "jax", with_goals=False,
                              where="w", app_batched=True)  # fmt: skip
    assert [r.name for r in rows] == ["serve_overhead_p50_ms_multi_host", "serve_rps_32_multi_host",
                                      "serve_batched_rps_32"]  # fmt: skip
    assert (rows[1].value, rows[1].baseline) == (150.0, 12.0)  # the demo app as deployed (batched) vs plain
    assert (rows[2].value, rows[2].baseline, rows[2].ratio, rows[2].met) == (150.0, 60.0, 2.5, True)
    assert rows[2].details["p50_ms"] == {"batched": 8.0, "unbatched": 8.5}


def test_the_measures_are_registered_with_the_slice_part_in_the_serving_set_only() -> None:
    quick = MEASURES["serve_overhead_p50_ms"]
    assert quick.in_quick and {"serve_rps_32", "serve_batched_rps_32"} <= set(quick.produces)
    slices: Any = MEASURES["serve_rps_32_multi_host"]
    assert not slices.in_quick and not slices.in_full  # make bench-serving, not make bench
    assert {"serve_overhead_p50_ms_multi_host", "serve_rps_32_single_host_tpu"} <= set(slices.produces)
    assert isinstance(Result("x", 1.0, "s", 1.0, 1.0, "g", True), Result)
