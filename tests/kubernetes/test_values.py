"""The Kubernetes value checks: good values come back normalised, a bad one is a one-line UserInputError that
names the field and the value, before any API call."""

from __future__ import annotations

from typing import Any

import pytest

from tpuflow.errors import UserInputError
from tpuflow.kubernetes.values import (
    MAX_NAME_LENGTH,
    check_env,
    check_name,
    check_namespace,
    check_quantities,
    parse_key_values,
    stringify_ray_group_values,
)


def _refused(call: Any, *args: Any, **kwargs: Any) -> UserInputError:
    with pytest.raises(UserInputError) as caught:
        call(*args, **kwargs)
    assert "\n" not in str(caught.value)
    return caught.value


@pytest.mark.parametrize("name", ["a", "ray-1", "x" * MAX_NAME_LENGTH, "a1-b2"])
def test_check_name_takes_rfc1035_labels_up_to_the_limit(name: str) -> None:
    assert check_name("name", name) == name


@pytest.mark.parametrize("name", ["", "1ray", "Ray", "ray-", "ray_1", "ray.1", "x" * (MAX_NAME_LENGTH + 1), 7, None])
def test_check_name_refuses_what_kuberay_could_not_suffix(name: object) -> None:
    err = _refused(check_name, "cluster_name", name)
    assert err.field == "cluster_name" and err.value == name
    assert str(err).startswith(f"cluster_name={name!r} is invalid: ") and "RFC 1035" in str(err)


def test_check_name_honours_a_longer_limit() -> None:
    long = "x" * 60
    assert check_name("name", long, max_len=63) == long
    assert "at most 40 " in str(_refused(check_name, "name", long))


@pytest.mark.parametrize("namespace", ["default", "team-a", "0ns", "a" * 63])
def test_check_namespace_takes_rfc1123_labels(namespace: str) -> None:
    assert check_namespace(namespace) == namespace


@pytest.mark.parametrize("namespace", ["", "Team", "team_a", "-a", "a" * 64, None, 3])
def test_check_namespace_refuses_the_rest(namespace: object) -> None:
    err = _refused(check_namespace, namespace)
    assert err.field == "namespace" and str(err).startswith(f"namespace={namespace!r} is invalid: ")


def test_check_quantities_normalises_to_stripped_strings() -> None:
    got = check_quantities("resources", {"cpu": 2, "memory": " 8Gi ", "ephemeral": "500m", "x": "1e3", "y": ".5"})
    assert got == {"cpu": "2", "memory": "8Gi", "ephemeral": "500m", "x": "1e3", "y": ".5"}
    assert check_quantities("resources", None) == {}


@pytest.mark.parametrize("value", ["lots", "8GB", "-1", "", "1.", "8 Gi"])
def test_check_quantities_refuses_what_is_no_quantity(value: str) -> None:
    err = _refused(check_quantities, "head_resources", {"memory": value})
    assert err.field == "head_resources['memory']" and err.value == value
    assert "'500m'" in err.fix


def test_check_quantities_refuses_a_forbidden_key_naming_it() -> None:
    err = _refused(check_quantities, "worker_resources", {"google.com/tpu": "4"}, forbidden=("google.com/tpu",))
    assert err.field == "worker_resources['google.com/tpu']" and err.value == "4"
    assert "comes from the TPU slice" in err.fix


def test_check_env_takes_string_values_under_posix_names() -> None:
    assert check_env("env", {"A": "1", "_b2": ""}) == {"A": "1", "_b2": ""}
    assert check_env("env", None) == {}


@pytest.mark.parametrize("key", ["1A", "A-B", "A B", "", 3])
def test_check_env_refuses_a_bad_name(key: object) -> None:
    err = _refused(check_env, "env", {key: "v"})
    assert err.field == f"env[{key!r}]" and err.value == key


@pytest.mark.parametrize("value", [2, 1.5, True, None])
def test_check_env_refuses_a_value_that_is_no_string(value: object) -> None:
    err = _refused(check_env, "runtime_env", {"N": value})
    assert err.field == "runtime_env['N']" and err.value == value and "quote numbers" in err.fix


def test_parse_key_values_splits_at_the_first_equals() -> None:
    assert parse_key_values("--env", ["A=1", "B=x=y", "C="]) == {"A": "1", "B": "x=y", "C": ""}
    assert parse_key_values("--env", None) == {}


@pytest.mark.parametrize("pair", ["A", "=1", ""])
def test_parse_key_values_refuses_what_is_no_pair(pair: str) -> None:
    err = _refused(parse_key_values, "--label", ["OK=1", pair])
    assert err.field == "--label" and err.value == pair and "KEY=VALUE" in str(err)


def _group(params: dict[str, object], env: list[dict[str, object]]) -> dict[str, object]:
    return {"rayStartParams": params, "template": {"spec": {"containers": [{"name": "ray", "env": env}]}}}


def test_stringify_ray_group_values_makes_native_values_strings() -> None:
    spec = {
        "rayVersion": "2.9",
        "headGroupSpec": _group({"num-cpus": 0, "dashboard-host": "0.0.0.0"}, [{"name": "A", "value": 2}]),
        "workerGroupSpecs": [
            _group({"block": True}, [{"name": "B", "value": 1.5}, {"name": "S", "valueFrom": {"x": 1}}])
        ],
    }
    out = stringify_ray_group_values(spec)
    assert out["headGroupSpec"]["rayStartParams"] == {"num-cpus": "0", "dashboard-host": "0.0.0.0"}
    assert out["headGroupSpec"]["template"]["spec"]["containers"][0]["env"] == [{"name": "A", "value": "2"}]
    worker = out["workerGroupSpecs"][0]
    assert worker["rayStartParams"] == {"block": "true"}
    assert worker["template"]["spec"]["containers"][0]["env"] == [
        {"name": "B", "value": "1.5"},
        {"name": "S", "valueFrom": {"x": 1}},
    ]
    assert out["rayVersion"] == "2.9"
    # the caller's spec is left as it was
    assert spec["headGroupSpec"]["rayStartParams"]["num-cpus"] == 0  # type: ignore[index]
    assert spec["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]["env"][0]["value"] == 1.5  # type: ignore[index]


def test_stringify_ray_group_values_names_the_value_it_cannot_write() -> None:
    err = _refused(stringify_ray_group_values, {"workerGroupSpecs": [{}, _group({"resources": {"TPU": 4}}, [])]})
    assert err.field == "workerGroupSpecs[1].rayStartParams.resources" and err.value == {"TPU": 4}
    err = _refused(stringify_ray_group_values, {"headGroupSpec": _group({}, [{"name": "L", "value": [1]}])})
    assert err.field == "headGroupSpec.env.L" and err.value == [1]


def test_stringify_ray_group_values_leaves_a_spec_without_groups_alone() -> None:
    spec = {"rayVersion": "2.9", "workerGroupSpecs": "{{ templated }}"}
    assert stringify_ray_group_values(spec) == spec
