"""The name and owner record of the object a task instance makes: the same on every try, a valid Kubernetes
name and labels whatever the DAG's ids look like, and different for each run and mapped instance."""

from __future__ import annotations

import re
import time
from datetime import timedelta

import pytest
from support.airflow_context import FakeTaskInstance, task_context

from tpuflow.errors import UserInputError
from tpuflow.kubernetes.ownership import (
    check_expires_after,
    object_name,
    owner_annotations,
    owner_labels,
    ownership_labels,
    resource_name,
)
from tpuflow.kubernetes.values import MAX_NAME_LENGTH, check_name
from tpuflow.labels import EXPIRES_LABEL, check_labels
from tpuflow.naming import TaskIdentity

DAG = "Team.Training_DAG-with-a-rather-long-name-v2"
RUN = "scheduled__2026-12-04T14:00:00+00:00"
# a task id inside nested TaskGroups: dots, underscores, capitals, far past the name limit
TASK = "prepare_data_group.Tokenise_Shards.train_group.run_the_big_training_job_on_v6e_256"
RFC1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


@pytest.mark.parametrize("map_index", [-1, 0, 17])
@pytest.mark.parametrize(("dag_id", "task_id"), [(DAG, TASK), ("d", "t"), ("0dag", "1.task"), ("__", "__")])
def test_resource_name_is_a_valid_kuberay_name_however_long_the_ids(dag_id: str, task_id: str, map_index: int) -> None:
    name = resource_name(dag_id, RUN, task_id, map_index)
    assert len(name) <= MAX_NAME_LENGTH and RFC1035.match(name), name
    assert check_name("name", name) == name


def test_resource_name_is_the_same_on_every_try() -> None:
    assert resource_name(DAG, RUN, TASK, 3) == resource_name(DAG, RUN, TASK, 3)


def test_resource_name_differs_per_run_map_index_and_task() -> None:
    names = {
        resource_name(DAG, RUN, TASK),
        resource_name(DAG, RUN, TASK, 0),
        resource_name(DAG, RUN, TASK, 1),
        resource_name(DAG, RUN.replace("14:00", "15:00"), TASK),
        # two tasks whose names are cut to the same readable prefix
        resource_name(DAG, RUN, TASK + "_a"),
        resource_name(DAG, RUN, TASK + "_b"),
    }
    assert len(names) == 6


@pytest.mark.parametrize("map_index", [-1, 5])
def test_ownership_labels_are_valid_kubernetes_labels(map_index: int) -> None:
    labels = ownership_labels(DAG, RUN, TASK, map_index, expires_at=1_900_000_000)
    assert check_labels("labels", labels) == labels
    assert labels[EXPIRES_LABEL] == "1900000000"
    assert EXPIRES_LABEL not in ownership_labels(DAG, RUN, TASK, map_index)


def test_ownership_labels_tell_runs_and_mapped_instances_apart() -> None:
    first, mapped = ownership_labels(DAG, RUN, TASK), ownership_labels(DAG, RUN, TASK, 0)
    other_run = ownership_labels(DAG, RUN + "x", TASK)
    assert first != mapped and first != other_run
    assert ownership_labels(DAG, RUN, TASK) == first


def test_owner_labels_from_the_context_keep_extra_labels_and_can_expire() -> None:
    context = task_context(dag_id=DAG, run_id=RUN, task_id=TASK, map_index=2)
    before = int(time.time())
    labels = owner_labels(context, {"team": "tpu"}, expires_after=timedelta(hours=1))
    after = int(time.time())
    assert labels["team"] == "tpu" and check_labels("labels", labels) == labels
    assert before + 3600 <= int(labels[EXPIRES_LABEL]) <= after + 3600
    assert {k: v for k, v in labels.items() if k not in ("team", EXPIRES_LABEL)} == ownership_labels(DAG, RUN, TASK, 2)
    assert EXPIRES_LABEL not in owner_labels(context, None)


def test_owner_annotations_record_the_full_owner() -> None:
    context = task_context(dag_id=DAG, run_id=RUN, task_id=TASK, map_index=4)
    (record,) = owner_annotations(context).values()
    assert TaskIdentity.from_record(record) == TaskIdentity(DAG, RUN, TASK, 4)


@pytest.mark.parametrize(("value", "seconds"), [(90, 90.0), (0.5, 0.5), (timedelta(days=1), 86400.0), (None, None)])
def test_check_expires_after_takes_seconds_a_timedelta_or_none(value: object, seconds: float | None) -> None:
    assert check_expires_after(value) == seconds


@pytest.mark.parametrize("value", [-1, 0, timedelta(seconds=-5), float("inf"), "1h", True])
def test_check_expires_after_refuses_the_rest_in_one_line(value: object) -> None:
    with pytest.raises(UserInputError) as caught:
        check_expires_after(value)
    message = str(caught.value)
    assert message.startswith(f"expires_after={value!r} is invalid: ") and "\n" not in message
    assert "or None for no limit" in message


def test_owner_labels_refuse_a_negative_expiry() -> None:
    with pytest.raises(UserInputError, match=r"^expires_after=-60 is invalid"):
        owner_labels(task_context(), None, expires_after=-60)


def test_object_name_is_the_checked_explicit_name_or_the_task_instances() -> None:
    ti = FakeTaskInstance(dag_id=DAG, run_id=RUN, task_id=TASK, map_index=1)
    context = task_context(ti)
    assert object_name(context, "my-cluster") == "my-cluster"
    assert object_name(context, None) == resource_name(DAG, RUN, TASK, 1)
    assert object_name(context, "") == resource_name(DAG, RUN, TASK, 1)
    # another task's object in the same run and map index (a teardown finding its setup's cluster)
    assert object_name(context, None, task_id="setup") == resource_name(DAG, RUN, "setup", 1)
    with pytest.raises(UserInputError, match=r"^name='My_Cluster' is invalid"):
        object_name(context, "My_Cluster")
