"""The KubeRay custom resources tpuflow makes and waits on, one class per kind.

A kind is one unit: its name and plural, its manifest builder (tpuflow.kuberay.manifests), its status
verdict (tpuflow.kuberay.status) and its diagnosis (what a failed or timed-out wait reports). The
operators, the waits and the triggers look a kind up instead of branching on its name; a trigger carries
the name (plain JSON) and resolves it with ``kind_named``.

Adding a kind is one subclass, registered when it is defined (``KIND_BY_NAME``), plus its stand-in in
the simulated KubeRay controller (tpuflow_rehearsal.standins.kuberay_controller).

Cheap to import (the operators name their kind at DAG parse time): the manifest builders load when a
manifest is built.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from tpuflow.kuberay import API_VERSION, ORIGIN_CRD_LABEL, ORIGIN_NAME_LABEL, RAYCLUSTERS, RAYSERVICES
from tpuflow.kuberay.diagnostics import Reader, cluster_diagnostics
from tpuflow.kuberay.status import (
    Verdict,
    raycluster_verdict,
    rayservice_verdict,
    service_cluster_name,
    stuck_service_diagnosis,
)

if TYPE_CHECKING:
    from tpuflow.kuberay.manifests import RayClusterTemplate


KIND_BY_NAME: dict[str, type[KubeRayKind]] = {}
"""Every kind by its name (what events and trigger kwargs carry); filled as the subclasses are defined."""
KIND_BY_PLURAL: dict[str, str] = {}
"""Every kind's name by its plural (the custom-object API's word for it)."""


class KubeRayKind:
    """One KubeRay kind. Used as a class (never instantiated): a subclass that sets ``name`` registers
    itself in ``KIND_BY_NAME`` and must set ``plural`` and define ``verdict``."""

    name: ClassVar[str]
    plural: ClassVar[str]
    delete_foreground: ClassVar[bool] = True
    """Delete with foreground propagation: the object stays until the garbage collector has removed what it
    owns (its pods), so a wait for it to be gone ends once they have stopped."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "name" not in cls.__dict__:
            return  # a shared base of kinds, not a kind
        if not getattr(cls, "plural", None) or cls.verdict is KubeRayKind.verdict:
            raise TypeError(f"KubeRay kind {cls.name!r} ({cls.__qualname__}): set plural and define verdict")
        taken = KIND_BY_NAME.get(cls.name) or KIND_BY_PLURAL.get(cls.plural)
        if taken is not None:
            raise TypeError(f"KubeRay kind {cls.name!r} ({cls.__qualname__}): {taken!r} is already defined")
        KIND_BY_NAME[cls.name] = cls
        KIND_BY_PLURAL[cls.plural] = cls.name

    @staticmethod
    def verdict(obj: Mapping[str, Any] | None) -> Verdict:
        """ready / failed(reason) / waiting(why), by KubeRay's semantics for this kind."""
        raise NotImplementedError

    @classmethod
    def manifest(cls, template: RayClusterTemplate, **fields: Any) -> dict[str, Any]:
        """The object to apply, built from the Ray cluster template (fields: the builder's keywords)."""
        raise NotImplementedError(f"tpuflow builds no {cls.name} manifest")

    @classmethod
    def is_manifest(cls, body: Mapping[str, Any]) -> bool:
        """Whether ``body`` is a manifest of this kind (a user-given one, before it is applied)."""
        return body.get("apiVersion") == API_VERSION and body.get("kind") == cls.name

    @classmethod
    async def diagnosis(
        cls, reader: Reader, obj: Mapping[str, Any], *, name: str, namespace: str, timed_out: bool, log_lines: int
    ) -> str:
        """Why the object is not ready, in words, for a failed or timed-out wait ("" when nothing to add)."""
        return ""

    @classmethod
    def clusters_selector(cls, name: str) -> str | None:
        """The label selector of the RayClusters KubeRay made for the object ``name`` (a wait for it to be gone
        waits for them and their pods too); None: it owns no RayCluster."""
        return None


class RayClusterKind(KubeRayKind):
    name = "RayCluster"
    plural = RAYCLUSTERS

    @staticmethod
    def verdict(obj: Mapping[str, Any] | None) -> Verdict:
        return raycluster_verdict(obj)

    @classmethod
    def manifest(cls, template: RayClusterTemplate, **fields: Any) -> dict[str, Any]:
        from tpuflow.kuberay.manifests import raycluster_manifest

        return raycluster_manifest(template, **fields)

    @classmethod
    async def diagnosis(
        cls, reader: Reader, obj: Mapping[str, Any], *, name: str, namespace: str, timed_out: bool, log_lines: int
    ) -> str:
        """Its pods, Warning events and head pod log tail."""
        return await cluster_diagnostics(reader, name, namespace, "", log_lines)


class RayServiceKind(KubeRayKind):
    name = "RayService"
    plural = RAYSERVICES
    # KubeRay (1.6.0) reconciles a RayService that is being deleted as a live one: while the garbage collector
    # deletes its active RayCluster in the foreground, it makes a new one, which the foreground delete does not
    # wait for. Deleted in the background, the RayService is gone at once and KubeRay makes nothing more; the wait
    # for it to be gone follows its RayClusters and their pods (clusters_selector).
    delete_foreground = False

    @classmethod
    def clusters_selector(cls, name: str) -> str | None:
        """The labels KubeRay puts on a RayService's RayClusters."""
        return f"{ORIGIN_CRD_LABEL}={cls.name},{ORIGIN_NAME_LABEL}={name}"

    @staticmethod
    def verdict(obj: Mapping[str, Any] | None) -> Verdict:
        return rayservice_verdict(obj)

    @classmethod
    def manifest(cls, template: RayClusterTemplate, **fields: Any) -> dict[str, Any]:
        from tpuflow.kuberay.manifests import rayservice_manifest

        return rayservice_manifest(template, **fields)

    @classmethod
    async def diagnosis(
        cls, reader: Reader, obj: Mapping[str, Any], *, name: str, namespace: str, timed_out: bool, log_lines: int
    ) -> str:
        """Its RayCluster's diagnosis; on a timeout headed by the stuck deployment and its likely cause."""
        cluster = service_cluster_name(obj)
        cluster_reason = None
        if cluster:
            cluster_obj = await reader.get(RayClusterKind.plural, cluster, namespace)
            cluster_reason = RayClusterKind.verdict(cluster_obj).reason if cluster_obj else None
        headline = ("Stuck: " + stuck_service_diagnosis(obj, cluster_reason)) if timed_out else ""
        if not cluster:
            return (headline + "\n" if headline else "") + "(KubeRay has not created the RayService's RayCluster)"
        return await cluster_diagnostics(reader, cluster, namespace, headline, log_lines, extra_objects=(name,))


def kind_named(name: str) -> type[KubeRayKind]:
    """The kind called ``name`` (a trigger's or wait's ``kind``)."""
    try:
        return KIND_BY_NAME[name]
    except KeyError:
        raise ValueError(f"unknown KubeRay kind {name!r}: use one of {', '.join(sorted(KIND_BY_NAME))}") from None


__all__ = ["KIND_BY_NAME", "KIND_BY_PLURAL", "KubeRayKind", "RayClusterKind", "RayServiceKind", "kind_named"]
