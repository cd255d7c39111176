"""tpuflow.docstrings: a family's shared ``:param`` entries are written once, in the base that takes them,
and every subclass's docstring shows them (what Sphinx and ``help()`` read)."""

from __future__ import annotations

from tpuflow.docstrings import InheritedParamDocs, param_entries
from tpuflow.gke.operators import GKECreateTPUNodePoolOperator, GKEDeleteNodePoolOperator
from tpuflow.kuberay.operators import KubeRayDeleteClusterOperator


class Base(InheritedParamDocs):
    """A base.

    :param conn_id: where the API is.
    :param timeout: seconds to wait,
        continued on a second line.
    """


class Narrower(Base):
    """A subclass.

    :param timeout: seconds to wait (default 5).

    Returns something.
    """


class Undocumented(Base):
    pass


def test_a_subclass_shows_the_entries_it_does_not_write_itself() -> None:
    entries = param_entries(Narrower.__doc__)
    assert entries["timeout"] == ":param timeout: seconds to wait (default 5)."  # its own wins
    assert entries["conn_id"] == ":param conn_id: where the API is."
    doc = Narrower.__doc__ or ""
    assert doc.index(":param conn_id:") < doc.index("Returns something."), "prose after the entries stays last"


def test_a_continued_entry_is_kept_whole() -> None:
    assert param_entries(Base.__doc__)["timeout"].endswith("continued on a second line.")


def test_a_class_without_a_docstring_gets_none() -> None:
    assert Undocumented.__doc__ is None


def test_the_operator_families_document_their_shared_arguments_once() -> None:
    for cls in (GKECreateTPUNodePoolOperator, GKEDeleteNodePoolOperator):
        assert {"project_id", "gcp_conn_id", "operation_timeout"} <= set(param_entries(cls.__doc__))
    delete = param_entries(KubeRayDeleteClusterOperator.__doc__)
    assert {"cluster_task_id", "wait", "kubernetes_conn_id", "namespace", "deferrable"} <= set(delete)
    assert "default 600" in delete["wait_timeout"]
