"""Python packages a test writes to disk: a team's own package that a workload names, or a probe package."""

from __future__ import annotations

from pathlib import Path


def write_package(parent: Path, name: str, modules: dict[str, str]) -> Path:
    """parent/name/ (parent made if missing) with an empty __init__.py and each ``modules`` entry as name.py holding its text."""
    package = parent / name
    package.mkdir(parents=True)
    for module, text in {"__init__": "", **modules}.items():
        (package / f"{module}.py").write_text(text)
    return package


def write_team_folder(dags: Path, name: str, modules: dict[str, str], dag_source: str) -> Path:
    """A team's DAGs folder as a user lays it out: DAGS/name_dag.py holding ``dag_source`` beside its package
    DAGS/name/ (``modules`` as in write_package); returns the DAG file."""
    write_package(dags, name, modules)
    dag_file = dags / f"{name}_dag.py"
    dag_file.write_text(dag_source)
    return dag_file


def acme_sales(tmp_path: Path) -> Path:
    """The package the pipeline tests' workloads name: a prep module (acme_sales.build_features) and a train loop
    (acme_sales.regress:fit), so tpu_pipeline finds each step's module and function in it."""
    return write_package(tmp_path, "acme_sales", {"build_features": "", "regress": "def fit(config):\n    pass\n"})
