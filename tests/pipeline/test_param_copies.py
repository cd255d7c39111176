"""The pipelines' Params: a deep copy (Airflow makes one per operator class level, in apply_defaults) shares the
schema and copies the value, and the Params stay Airflow's own class, so the DAG serializes as before."""

from __future__ import annotations

import copy

from tpuflow.pipeline.params import ParamSpec, pipeline_params


def test_a_deep_copy_shares_the_schema_copies_the_value_and_copies_alike() -> None:
    from airflow.sdk import Param

    param = ParamSpec(["a", "b"], type="array", title="T", enum=[["a", "b"], ["c"]]).param()
    clone = copy.deepcopy(param)
    assert type(clone) is Param and clone is not param and clone.schema is param.schema
    assert clone.value == ["a", "b"] and clone.value is not param.value
    clone.value.append("c")
    clone.source = "task"  # as apply_defaults' _fill_missing_param_source does on its copy
    assert param.value == ["a", "b"] and param.source is None
    again = copy.deepcopy(clone)
    assert again.schema is param.schema and again.value == ["a", "b", "c"] and again.value is not clone.value
    assert again.resolve(["c"]) == ["c"]


def test_the_dags_params_and_every_tasks_copy_serialize_as_airflows_own() -> None:
    from airflow.sdk import DAG, Param
    from airflow.serialization.serialized_objects import DagSerialization
    from tpuflow.workloads.addition.pipeline import ADDITION

    from tpuflow.pipeline.dag import tpu_pipeline

    dag = tpu_pipeline("param_copies", workload=ADDITION, backend="local")
    assert isinstance(dag, DAG)
    for task in dag.tasks:
        for name in task.params:
            assert type(task.params.get_param(name)) is Param, (task.task_id, name)
        if task.params:  # (a person's approval asks with its own Params)
            assert task.params.get_param("topology").schema is dag.params.get_param("topology").schema
    plain = {name: Param(p.value, description=p.description, **p.schema) for name, p in pipeline_params().items()}
    rebuilt = DagSerialization.from_dict(DagSerialization.to_dict(dag))
    for name, param in plain.items():
        assert rebuilt.params.get_param(name).schema == param.schema, name
        assert rebuilt.params[name] == param.value, name
