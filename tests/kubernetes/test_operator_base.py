"""The Kubernetes operators' shared argument checks: a bad literal fails when the DAG is parsed, with one
line naming field, value and fix; a templated value waits for execute, where the rendered value is checked;
and where the API is follows the arguments."""

from __future__ import annotations

from typing import Any

import pytest

from tpuflow.errors import UserInputError
from tpuflow.kubernetes.hooks import KubeTarget
from tpuflow.kubernetes.operator_base import KubernetesBaseOperator
from tpuflow.validation import check_count

CLUSTER = {"project_id": "my-project", "location": "us-east5", "cluster_name": "tpus"}


def build(**kwargs: Any) -> KubernetesBaseOperator:
    return KubernetesBaseOperator(task_id="kube", **kwargs)


def refused(**kwargs: Any) -> str:
    with pytest.raises(UserInputError) as caught:
        build(**kwargs)
    message = str(caught.value)
    assert "\n" not in message
    return message


def test_good_arguments_build() -> None:
    op = build(namespace="team-a", gke_cluster=CLUSTER, poll_interval=2, wait_timeout=60, log_lines=0)
    assert (op.namespace, op.gke_cluster, op.log_lines) == ("team-a", CLUSTER, 0)


@pytest.mark.parametrize(
    ("kwargs", "start"),
    [
        ({"namespace": "Team_A"}, "namespace='Team_A' is invalid: "),
        ({"gke_cluster": {"project_id": "p", "location": "l"}}, "gke_cluster={"),
        ({"gke_cluster": "projects/p/locations/l/clusters/c"}, "gke_cluster='projects/p"),
        ({"poll_interval": 0}, "poll_interval=0 is invalid: "),
        ({"wait_timeout": -1}, "wait_timeout=-1 is invalid: "),
        ({"log_lines": -5}, "log_lines=-5 is invalid: "),
    ],
)
def test_a_bad_literal_fails_at_construction(kwargs: dict[str, Any], start: str) -> None:
    assert refused(**kwargs).startswith(start)


def test_the_gke_cluster_error_names_what_is_missing() -> None:
    assert "(missing: cluster_name)" in refused(gke_cluster={"project_id": "p", "location": "l"})


def test_an_empty_namespace_means_the_connections() -> None:
    assert build(namespace="").namespace == ""


@pytest.mark.parametrize("kwargs", [{"namespace": "{{ var.value.ns }}"}, {"gke_cluster": "{{ var.json.cluster }}"}])
def test_a_templated_value_waits_for_execute(kwargs: dict[str, Any]) -> None:
    op = build(**kwargs)  # parse time: not checked
    [field] = kwargs
    setattr(op, field, "Team_A" if field == "namespace" else {"project_id": "p"})  # what rendering gave
    with pytest.raises(UserInputError, match=rf"^{field}="):
        op.validate_arguments()


def test_a_subclass_is_checked_once_all_its_attributes_are_set() -> None:
    class Sized(KubernetesBaseOperator):
        def __init__(self, *, replicas: int, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.replicas = replicas

        def argument_checks(self) -> list[Any]:
            return [*super().argument_checks(), ((self.replicas,), lambda: check_count("replicas", self.replicas))]

    assert Sized(task_id="s", replicas=2).replicas == 2
    with pytest.raises(UserInputError, match=r"^replicas=0 is invalid"):
        Sized(task_id="s", replicas=0)
    with pytest.raises(UserInputError, match=r"^namespace="):
        Sized(task_id="s", replicas=1, namespace="-x")


def test_the_target_is_the_connection_unless_gke_cluster_stands_alone() -> None:
    assert build().kube_target() == KubeTarget(kubernetes_conn_id="kubernetes_default")
    # with a connection, gke_cluster only feeds the console links: no GKE lookup
    assert build(kubernetes_conn_id="kc", gke_cluster=CLUSTER).kube_target() == KubeTarget(kubernetes_conn_id="kc")
