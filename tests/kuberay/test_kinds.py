"""A KubeRay kind is one unit (tpuflow.kuberay.kinds): the waits, triggers and operators look it up by name
instead of branching on "RayCluster" / "RayService", so a new kind is one subclass."""

from __future__ import annotations

import ast
import asyncio
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from support.kuberay_readers import NothingToExplain

from tpuflow.kuberay import kinds
from tpuflow.kuberay.kinds import KIND_BY_NAME, KIND_BY_PLURAL, KubeRayKind, RayClusterKind, RayServiceKind, kind_named
from tpuflow.kuberay.manifests import RayClusterTemplate, raycluster_manifest
from tpuflow.kuberay.status import Verdict
from tpuflow.kuberay.waits import wait_gone, wait_ready
from tpuflow.tpu import TpuSlice

KUBERAY = Path(kinds.__file__).parent
SERVE = {"applications": [{"name": "app", "import_path": "workloads.serve:app", "route_prefix": "/"}]}
# The modules that act on any kind: none of them may compare a value with a kind's name.
KIND_NEUTRAL = ("waits.py", "triggers.py", "operator_base.py", "operators.py")


class ObjectsReader(NothingToExplain):
    """A Reader over fixed objects by (plural, name); records every plural it is asked for."""

    def __init__(self, objects: Mapping[tuple[str, str], Any]) -> None:
        self.objects = dict(objects)
        self.asked: list[str] = []

    async def get(self, plural: str, name: str, namespace: str) -> dict[str, Any] | None:
        self.asked.append(plural)
        return self.objects.get((plural, name))  # type: ignore[no-any-return]


@pytest.fixture
def ray_job_kind() -> Iterator[type[KubeRayKind]]:
    """A kind the package does not define, declared here as a newcomer would: one subclass."""

    class RayJobKind(KubeRayKind):
        name = "RayJobUnderTest"
        plural = "rayjobsundertest"

        @staticmethod
        def verdict(obj: Mapping[str, Any] | None) -> Verdict:
            state = ((obj or {}).get("status") or {}).get("jobDeploymentStatus")
            if state == "Complete":
                return Verdict("ready", "job complete")
            if state == "Failed":
                return Verdict("failed", "job failed")
            return Verdict("waiting", f"job {state or 'not started'}")

        @classmethod
        async def diagnosis(
            cls, reader: Any, obj: Mapping[str, Any], *, name: str, namespace: str, timed_out: bool, log_lines: int
        ) -> str:
            return f"{'timed out' if timed_out else 'failed'}: see job {namespace}/{name}"

    try:
        yield RayJobKind
    finally:
        KIND_BY_NAME.pop(RayJobKind.name, None)
        KIND_BY_PLURAL.pop(RayJobKind.plural, None)


def _job(state: str) -> dict[str, Any]:
    return {"metadata": {"name": "job"}, "status": {"jobDeploymentStatus": state}}


def _wait(reader: ObjectsReader, kind: str, timeout: float = 2.0) -> dict[str, Any]:
    deadline = time.time() + timeout
    return dict(
        asyncio.run(wait_ready(reader, kind=kind, name="job", namespace="ns", deadline=deadline, poll_interval=0.01))
    )


def test_the_kind_neutral_modules_never_branch_on_a_kinds_name() -> None:
    names = set(KIND_BY_NAME)
    assert {"RayCluster", "RayService"} <= names
    branches = []
    for module in KIND_NEUTRAL:
        tree = ast.parse((KUBERAY / module).read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Compare):
                values = [node.left, *node.comparators]
                if any(isinstance(v, ast.Constant) and v.value in names for v in values):
                    branches.append(f"{module}:{node.lineno}: {ast.unparse(node)}")
    assert branches == []


def test_a_new_kind_is_one_subclass_and_the_waits_take_it_by_name(ray_job_kind: type[KubeRayKind]) -> None:
    assert kind_named("RayJobUnderTest") is ray_job_kind
    assert KIND_BY_PLURAL["rayjobsundertest"] == "RayJobUnderTest"

    reader = ObjectsReader({("rayjobsundertest", "job"): _job("Complete")})
    event = _wait(reader, "RayJobUnderTest")
    assert (event["status"], event["kind"], event["message"]) == ("success", "RayJobUnderTest", "job complete")
    assert set(reader.asked) == {"rayjobsundertest"}

    failed = _wait(ObjectsReader({("rayjobsundertest", "job"): _job("Failed")}), "RayJobUnderTest")
    assert (failed["status"], failed["diagnostics"]) == ("failed", "failed: see job ns/job")

    stuck = _wait(ObjectsReader({("rayjobsundertest", "job"): _job("Running")}), "RayJobUnderTest", timeout=0.05)
    assert stuck["status"] == "timeout" and stuck["diagnostics"] == "timed out: see job ns/job"
    assert stuck["message"] == "RayJobUnderTest ns/job not ready by the deadline: job Running"

    gone = asyncio.run(
        wait_gone(
            ObjectsReader({}),
            kind="RayJobUnderTest",
            name="job",
            namespace="ns",
            deadline=time.time() + 1,
            poll_interval=0.01,
        )
    )
    assert gone["status"] == "success" and gone["message"] == "RayJobUnderTest ns/job is gone"


def test_an_unknown_kind_is_named_and_a_kind_is_defined_once() -> None:
    with pytest.raises(ValueError, match="unknown KubeRay kind 'RayJob': use one of RayCluster, RayService"):
        kind_named("RayJob")
    with pytest.raises(TypeError, match="'RayCluster'"):

        class Again(RayClusterKind):
            name = "RayCluster"

    with pytest.raises(TypeError, match="set plural and define verdict"):

        class NoVerdict(KubeRayKind):
            name = "NoVerdict"
            plural = "noverdicts"

    assert set(KIND_BY_NAME) == {"RayCluster", "RayService"}


def test_each_kind_holds_its_manifest_builder_and_names_its_manifests() -> None:
    template = RayClusterTemplate(tpu=TpuSlice.from_spec("v6e", "2x2"), image="rayproject/ray:2.60.0-py311")
    built = RayClusterKind.manifest(template, name="rc", namespace="ns")
    assert built == raycluster_manifest(template, name="rc", namespace="ns")
    assert RayClusterKind.is_manifest(built) and not RayServiceKind.is_manifest(built)
    service = RayServiceKind.manifest(template, serve_config=SERVE, name="svc", namespace="ns")
    assert RayServiceKind.is_manifest(service) and service["spec"]["rayClusterConfig"] == built["spec"]


def test_a_rayservice_diagnosis_reads_its_raycluster() -> None:
    service = {
        "metadata": {"name": "svc"},
        "status": {"pendingServiceStatus": {"rayClusterName": "svc-raycluster-1"}},
    }
    cluster = {"metadata": {"name": "svc-raycluster-1"}, "status": {"state": "suspended"}}
    reader = ObjectsReader({(RayClusterKind.plural, "svc-raycluster-1"): cluster})
    text = asyncio.run(
        RayServiceKind.diagnosis(reader, service, name="svc", namespace="ns", timed_out=True, log_lines=5)
    )
    assert reader.asked == [RayClusterKind.plural]
    assert text.startswith("Stuck: the RayService's RayCluster never became ready: RayCluster svc-raycluster-1 is")
