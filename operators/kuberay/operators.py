"""Airflow operators for KubeRay RayClusters and RayServices on GKE TPU slices.

    create = KubeRayCreateClusterOperator(task_id="ray_cluster", tpu=TpuSlice.from_spec("v6e", "4x4"),
                                          image="rayproject/ray:2.60.0-py311", deferrable=True)
    delete = KubeRayDeleteClusterOperator(task_id="delete_ray_cluster", cluster_task_id="ray_cluster")
    create >> ... >> delete.as_teardown(setups=create)

Names are deterministic (dag id, run id, task id, map index), so a retried task adopts what its
earlier try created; an object of that name with a different spec (or another owner) is an error.
Ready means KubeRay's conditions (tpuflow.kuberay.status); a failure or the deadline raises with
KubeRay's reason, pod states, Warning events and the head pod's last log lines. The return value
(XCom) is the address payload of tpuflow.kuberay.addresses.

Cheap to import: no kubernetes, ray or google imports at module level; the manifest builders, the
Serve config checks and the TPU webhook rules load when a manifest is built or checked (at parse
time only when the slice arguments are static).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from airflow.sdk import XComArg
from airflow.sdk.exceptions import AirflowException, AirflowFailException
from tpuflow.errors import UserInputError
from tpuflow.kuberay import (
    DEFAULT_RAY_VERSION,
    DEFAULT_UPGRADE_STRATEGY,
    LABEL_PREFIX,
    MANAGED_BY,
    RAYCLUSTERS,
    RAYSERVICES,
    SPEC_HASH,
)
from tpuflow.kuberay.addresses import check_address_mode
from tpuflow.kuberay.links import RayDashboardLink
from tpuflow.kuberay.operator_base import KubeRayBaseOperator, SliceArgumentsMixin, object_name, owner_labels

if TYPE_CHECKING:
    from airflow.sdk import Context
    from tpuflow.kuberay.hooks import KubeApiError, KubeRayHook
    from tpuflow.tpu import TpuSlice

RUN_KEY_LABEL = f"{LABEL_PREFIX}/run-key"
CLUSTER_SPEC_HASH = f"{LABEL_PREFIX}/cluster-spec-hash"
_SLICE_DOC = """
    :param tpu: the slice (TpuSlice or its to_dict()); or give accelerator/topology/machine_type/num_slices.
    :param image: container image with Ray ``ray_version`` (head and TPU workers).
    :param env: environment for head and workers (the slice's own, e.g. tpu7x's, is added).
    :param head_resources: head container requests = limits (default cpu 2, memory 8Gi; Ray num-cpus 0).
    :param worker_resources: extra TPU-host container requests = limits (cpu, memory); google.com/tpu
        always comes from the slice.
    :param address_mode: auto | in_cluster_dns | head_service | port_forward (tpuflow.kuberay.addresses).
"""


def _slice_dict(spec: Mapping[str, Any]) -> dict[str, Any] | None:
    from tpuflow.kuberay.webhook_rules import slice_of_group, tpu_worker_groups

    for _, group, _ in tpu_worker_groups(spec):
        try:
            return slice_of_group(group).to_dict()
        except UserInputError:
            return None
    return None


def _rejection(err: KubeApiError, kind: str, namespace: str, name: str, cluster_spec: Mapping[str, Any]) -> str:
    from tpuflow.kuberay.webhook_rules import WEBHOOK_DENIAL, tpu_group_problems

    text = f"Kubernetes rejected {kind} {namespace}/{name} ({err.code} {err.reason}): {err.message}"
    if WEBHOOK_DENIAL in err.message:
        for problem in tpu_group_problems(cluster_spec):
            text += f"\n  {problem.message}; set {problem.field}={problem.expected_hosts}"
        text += ("\n  The GKE TPU webhook requires numOfHosts = chips(topology) / google.com/tpu per host; build the "
                 "manifest from a TpuSlice (tpuflow render raycluster) instead of editing the shape by hand.")
    return text


class KubeRayCreateClusterOperator(SliceArgumentsMixin, KubeRayBaseOperator):
    __doc__ = f"""Create (or adopt) a RayCluster for a TPU slice and wait until KubeRay reports it ready.

    Returns {{"kind", "name", "namespace", "dashboard_url", "serve_url", "gcs_address", "address_mode",
    "head_service", "head_pod", "in_cluster_dns": {{...}}, "slice": TpuSlice.to_dict()}}.
    {_SLICE_DOC}
    :param manifest: instead of the slice arguments, a complete RayCluster (dict or YAML), e.g. an edited
        ``tpuflow render raycluster``; name/namespace/ownership labels are set by the operator.
    :param tpu_preflight: check TPU worker groups against the GKE TPU webhook's numOfHosts rule before
        sending (turn off only for features the check does not model, such as TPU sub-slicing).
    """

    template_fields: Sequence[str] = (
        *KubeRayBaseOperator.template_fields, "name", "image", "env", "labels", "accelerator", "topology",
        "machine_type", "num_slices", "manifest",
    )

    def __init__(
        self,
        *,
        tpu: TpuSlice | Mapping[str, Any] | None = None,
        accelerator: str | None = None,
        topology: str | None = None,
        machine_type: str | None = None,
        num_slices: int | str = 1,
        image: str | None = None,
        ray_version: str = DEFAULT_RAY_VERSION,
        env: Mapping[str, str] | None = None,
        head_resources: Mapping[str, str] | None = None,
        worker_resources: Mapping[str, str] | None = None,
        service_account: str | None = None,
        shm_size: str | None = None,
        manifest: Mapping[str, Any] | str | None = None,
        name: str | None = None,
        labels: Mapping[str, str] | None = None,
        annotations: Mapping[str, str] | None = None,
        address_mode: str = "auto",
        tpu_preflight: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.init_slice(tpu=tpu, accelerator=accelerator, topology=topology, machine_type=machine_type,
                        num_slices=num_slices, image=image, ray_version=ray_version, env=env,
                        head_resources=head_resources, worker_resources=worker_resources,
                        service_account=service_account, shm_size=shm_size)
        if manifest is not None and (self.accelerator or self.topology or image):
            raise UserInputError("manifest", "<manifest>", "give either manifest or the slice arguments, not both")
        self.manifest = manifest
        self.name = name
        self.labels = dict(labels or {})
        self.annotations = dict(annotations or {})
        self.address_mode = check_address_mode(address_mode)
        self.tpu_preflight = tpu_preflight
        if manifest is None and not self.slice_is_templated():
            self.build_template()  # bad slice/image/env fails at parse time, naming the field

    # --- manifest ---
    def _parsed_manifest(self) -> dict[str, Any]:
        import yaml

        try:
            raw = yaml.safe_load(self.manifest) if isinstance(self.manifest, str) else self.manifest
        except yaml.YAMLError as err:
            raise UserInputError("manifest", str(self.manifest)[:80], f"not valid YAML: {err}") from err
        if not isinstance(raw, Mapping) or raw.get("kind") != "RayCluster" or raw.get("apiVersion") != "ray.io/v1":
            raise UserInputError("manifest", str(raw)[:80], "give a ray.io/v1 RayCluster manifest")
        return dict(raw)

    def _manifest_from_user(self, name: str, namespace: str, labels: Mapping[str, str]) -> dict[str, Any]:
        from tpuflow.kuberay.manifests import spec_hash
        from tpuflow.kuberay.webhook_rules import tpu_group_problems

        body = self._parsed_manifest()
        spec = dict(body.get("spec") or {})
        if not spec.get("headGroupSpec"):
            raise UserInputError("manifest.spec.headGroupSpec", None, "a RayCluster needs a headGroupSpec")
        if self.tpu_preflight:
            for problem in tpu_group_problems(spec):
                raise UserInputError(f"manifest.spec.{problem.field}", problem.num_of_hosts, problem.message)
        meta = dict(body.get("metadata") or {})
        meta.update(name=name, namespace=namespace)
        meta["labels"] = {**(meta.get("labels") or {}), **labels}
        meta["annotations"] = {**(meta.get("annotations") or {}), **self.annotations, SPEC_HASH: spec_hash(spec)}
        return {**body, "metadata": meta, "spec": spec}

    def build_manifest(self, context: Context, namespace: str) -> dict[str, Any]:
        from tpuflow.kuberay.manifests import raycluster_manifest

        labels = owner_labels(context, self.labels)
        if self.manifest is not None:
            manifest_name = (self._parsed_manifest().get("metadata") or {}).get("name")
            return self._manifest_from_user(object_name(context, self.name or manifest_name), namespace, labels)
        name = object_name(context, self.name)
        return raycluster_manifest(self.build_template(), name=name, namespace=namespace, labels=labels,
                                   annotations=self.annotations)

    # --- execution ---
    def execute(self, context: Context) -> dict[str, Any]:
        from tpuflow.kuberay.hooks import KubeApiError
        from tpuflow.kuberay.status import raycluster_verdict

        hook = self.kube_hook()
        namespace = self.resolve_namespace()
        body = self.build_manifest(context, namespace)
        name = body["metadata"]["name"]
        self.persist_gke_links(context, namespace)
        obj = self._adopt(hook, body, namespace)
        if obj is None:
            try:
                obj = hook.create(RAYCLUSTERS, body, namespace)
                self.log.info("Created RayCluster %s/%s: %s", namespace, name,
                              body["metadata"]["annotations"].get(f"{LABEL_PREFIX}/slice", ""))
            except KubeApiError as err:
                if err.code != 409:
                    raise AirflowFailException(_rejection(err, "RayCluster", namespace, name, body["spec"])) from err
                obj = self._adopt(hook, body, namespace)
        verdict = raycluster_verdict(obj)
        if verdict.ready:
            return self.finish(context, name, namespace)
        owner = body["metadata"]["labels"][RUN_KEY_LABEL]  # killing the task deletes the cluster if it has this
        if verdict.failed:
            event = self.wait_ready("RayCluster", name, namespace, owner_run_key=owner)  # diagnostics, at once
            self.raise_for_event(event, "ready")
        self.log.info("Waiting up to %.0fs for RayCluster %s/%s: %s", self.wait_timeout, namespace, name, verdict.reason)
        event = self.wait_ready("RayCluster", name, namespace, owner_run_key=owner)
        return self.execute_complete(context, event)

    def _adopt(self, hook: KubeRayHook, body: Mapping[str, Any], namespace: str) -> dict[str, Any] | None:
        name = body["metadata"]["name"]
        existing = hook.get(RAYCLUSTERS, name, namespace)
        if existing is None:
            return None
        meta = existing.get("metadata") or {}
        if meta.get("deletionTimestamp"):
            raise AirflowException(f"RayCluster {namespace}/{name} is being deleted (a teardown of an earlier try?); "
                                   "retry once it is gone")
        ours = body["metadata"]["labels"].get(RUN_KEY_LABEL)
        theirs = (meta.get("labels") or {}).get(RUN_KEY_LABEL)
        if theirs != ours:
            owner = f"run-key {theirs}" if theirs else "something other than tpuflow"
            raise AirflowFailException(f"RayCluster {namespace}/{name} already exists and belongs to {owner}; delete "
                                       "it or choose another name")
        # Compare what was sent (the annotation), not the stored spec: the apiserver fills CRD defaults in.
        want, have = body["metadata"]["annotations"][SPEC_HASH], (meta.get("annotations") or {}).get(SPEC_HASH)
        if want != have:
            raise AirflowFailException(f"RayCluster {namespace}/{name} exists with a different spec (spec-hash {have}, "
                                       f"this task wants {want}): delete it (KubeRayDeleteClusterOperator) or use "
                                       "another name")
        self.log.info("Adopting RayCluster %s/%s created by an earlier try", namespace, name)
        return existing

    def execute_complete(self, context: Context, event: dict[str, Any]) -> dict[str, Any]:
        self.raise_for_event(event, "ready")
        return self.finish(context, event["name"], event["namespace"])

    def finish(self, context: Context, name: str, namespace: str) -> dict[str, Any]:
        from tpuflow.kuberay.addresses import cluster_payload

        hook = self.kube_hook()
        cluster = hook.get(RAYCLUSTERS, name, namespace)
        if cluster is None:
            raise AirflowException(f"RayCluster {namespace}/{name} disappeared right after becoming ready")
        svc_name = ((cluster.get("status") or {}).get("head") or {}).get("serviceName") or f"{name}-head-svc"
        payload = cluster_payload(cluster, hook.get_service(svc_name, namespace), mode=self.address_mode,
                                  in_cluster=hook.is_in_cluster())
        payload["slice"] = _slice_dict(cluster.get("spec") or {})
        RayDashboardLink.persist(context, url=payload["dashboard_url"])
        self.persist_gke_links(context, namespace, payload["head_pod"])
        self.log.info("RayCluster %s/%s ready: dashboard %s", namespace, name, payload["dashboard_url"])
        return payload


class KubeRayDeployServiceOperator(SliceArgumentsMixin, KubeRayBaseOperator):
    __doc__ = f"""Deploy or update a RayService and wait until Ready with every application RUNNING.

    serveConfigV2 is the same Serve config dict the local deploy PUTs to the dashboard. An application
    DEPLOY_FAILED/UNHEALTHY fails at once; at the deadline the error names the stuck deployment and the
    likely cause. Changing only the Serve config updates in place; with upgrade_strategy "None" (default:
    no second TPU slice needed) a changed cluster shape is refused; delete the RayService first.

    Returns {{"kind", "name", "namespace", "serve_url", "dashboard_url", "gcs_address", "ray_cluster_name",
    "applications": {{app: status}}, "address_mode", "in_cluster_dns": {{...}}}}.
    {_SLICE_DOC}
    :param serve_config: {{"applications": [...], "http_options"?: ...}} or an object with to_dict(); templated
        (an upstream task's XCom works, and is checked when the task runs).
    :param name: a stable name makes the task update one long-lived endpoint across runs; default: per
        task instance.
    """

    template_fields: Sequence[str] = (
        *KubeRayBaseOperator.template_fields, "name", "image", "env", "labels", "accelerator", "topology",
        "machine_type", "num_slices", "serve_config",
    )

    def __init__(
        self,
        *,
        serve_config: Any,
        tpu: TpuSlice | Mapping[str, Any] | None = None,
        accelerator: str | None = None,
        topology: str | None = None,
        machine_type: str | None = None,
        num_slices: int | str = 1,
        image: str | None = None,
        ray_version: str = DEFAULT_RAY_VERSION,
        env: Mapping[str, str] | None = None,
        head_resources: Mapping[str, str] | None = None,
        worker_resources: Mapping[str, str] | None = None,
        service_account: str | None = None,
        shm_size: str | None = None,
        name: str | None = None,
        labels: Mapping[str, str] | None = None,
        annotations: Mapping[str, str] | None = None,
        upgrade_strategy: str = DEFAULT_UPGRADE_STRATEGY,
        address_mode: str = "auto",
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.init_slice(tpu=tpu, accelerator=accelerator, topology=topology, machine_type=machine_type,
                        num_slices=num_slices, image=image, ray_version=ray_version, env=env,
                        head_resources=head_resources, worker_resources=worker_resources,
                        service_account=service_account, shm_size=shm_size)
        # A template or an upstream task's XCom (e.g. a @task building the config) is checked when it renders.
        deferred = isinstance(serve_config, XComArg) or (isinstance(serve_config, str) and "{{" in serve_config)
        if isinstance(serve_config, (str, XComArg)):
            self.serve_config = serve_config
        else:
            from tpuflow.kuberay.serve_config import serve_config_dict

            self.serve_config = serve_config_dict(serve_config)
        self.name = name
        self.labels = dict(labels or {})
        self.annotations = dict(annotations or {})
        self.upgrade_strategy = upgrade_strategy
        self.address_mode = check_address_mode(address_mode)
        if not self.slice_is_templated() and not deferred:
            self.build_manifest_for("parse-check", "default", {})

    def build_manifest_for(self, name: str, namespace: str, labels: Mapping[str, str]) -> dict[str, Any]:
        from tpuflow.kuberay.manifests import rayservice_manifest, spec_hash

        manifest = rayservice_manifest(self.build_template(), self.serve_config, name=name, namespace=namespace,
                                       labels=labels, annotations=self.annotations,
                                       upgrade_strategy=self.upgrade_strategy, pod_labels=self.labels)
        manifest["metadata"]["annotations"][CLUSTER_SPEC_HASH] = spec_hash(manifest["spec"]["rayClusterConfig"])
        return manifest

    def execute(self, context: Context) -> dict[str, Any]:
        from tpuflow.kuberay.hooks import KubeApiError
        from tpuflow.kuberay.status import rayservice_verdict

        hook = self.kube_hook()
        namespace = self.resolve_namespace()
        name = object_name(context, self.name)
        body = self.build_manifest_for(name, namespace, owner_labels(context, self.labels))
        self.persist_gke_links(context, namespace)
        obj = self._create_or_update(hook, body, namespace)
        if obj is None:
            try:
                obj = hook.create(RAYSERVICES, body, namespace)
                self.log.info("Created RayService %s/%s", namespace, name)
            except KubeApiError as err:
                if err.code != 409:
                    raise AirflowFailException(_rejection(err, "RayService", namespace, name,
                                                          body["spec"]["rayClusterConfig"])) from err
                obj = self._create_or_update(hook, body, namespace)
        verdict = rayservice_verdict(obj)
        if verdict.ready:
            return self.finish(context, name, namespace)
        self.log.info("Waiting up to %.0fs for RayService %s/%s: %s", self.wait_timeout, namespace, name, verdict.reason)
        # Killing the task deletes the RayService only if this task instance created it (its run-key label),
        # not a long-lived one (stable name) it updated.
        event = self.wait_ready("RayService", name, namespace, owner_run_key=body["metadata"]["labels"][RUN_KEY_LABEL])
        return self.execute_complete(context, event)

    def _create_or_update(self, hook: KubeRayHook, body: Mapping[str, Any], namespace: str) -> dict[str, Any] | None:
        name = body["metadata"]["name"]
        existing = hook.get(RAYSERVICES, name, namespace)
        if existing is None:
            return None
        meta = existing.get("metadata") or {}
        if meta.get("deletionTimestamp"):
            raise AirflowException(f"RayService {namespace}/{name} is being deleted; retry once it is gone")
        if (meta.get("labels") or {}).get(MANAGED_BY) != "tpuflow":
            raise AirflowFailException(f"RayService {namespace}/{name} exists and was not created by tpuflow; delete "
                                       "it or choose another name")
        annotations = meta.get("annotations") or {}
        want = body["metadata"]["annotations"]
        # What was sent is recorded in annotations; the stored spec also carries the apiserver's CRD defaults.
        if annotations.get(SPEC_HASH) == want[SPEC_HASH]:
            self.log.info("RayService %s/%s already has this spec; adopting it", namespace, name)
            return existing
        cluster_changed = annotations.get(CLUSTER_SPEC_HASH) != want[CLUSTER_SPEC_HASH]
        if cluster_changed and self.upgrade_strategy == "None":
            raise AirflowFailException(
                f"RayService {namespace}/{name} exists with a different Ray cluster (image, slice, env or resources). "
                "With upgrade_strategy 'None' KubeRay does not replace the cluster, and replacing it needs a second "
                "TPU slice: delete the RayService (KubeRayDeleteServiceOperator) and deploy again, or use "
                "upgrade_strategy='NewCluster' with capacity for two slices")
        patch: dict[str, Any] = {
            "metadata": {"annotations": {SPEC_HASH: want[SPEC_HASH], CLUSTER_SPEC_HASH: want[CLUSTER_SPEC_HASH]}},
            "spec": dict(body["spec"]) if cluster_changed else {
                "serveConfigV2": body["spec"]["serveConfigV2"], "upgradeStrategy": body["spec"]["upgradeStrategy"]},
        }
        updated = hook.patch(RAYSERVICES, name, patch, namespace)
        self.log.info("Updated RayService %s/%s (%s)", namespace, name,
                      "new Ray cluster" if cluster_changed else "Serve config in place")
        return updated

    def execute_complete(self, context: Context, event: dict[str, Any]) -> dict[str, Any]:
        self.raise_for_event(event, "ready")
        return self.finish(context, event["name"], event["namespace"])

    def finish(self, context: Context, name: str, namespace: str) -> dict[str, Any]:
        from tpuflow.kuberay.addresses import cluster_payload, service_payload

        hook = self.kube_hook()
        service = hook.get(RAYSERVICES, name, namespace)
        if service is None:
            raise AirflowException(f"RayService {namespace}/{name} disappeared right after becoming ready")
        cluster_name = ((service.get("status") or {}).get("activeServiceStatus") or {}).get("rayClusterName", "")
        cluster = hook.get(RAYCLUSTERS, cluster_name, namespace) if cluster_name else None
        in_cluster = hook.is_in_cluster()
        cluster_info: dict[str, Any] = {}
        if cluster is not None:
            svc_name = ((cluster.get("status") or {}).get("head") or {}).get("serviceName") or f"{cluster_name}-head-svc"
            cluster_info = cluster_payload(cluster, hook.get_service(svc_name, namespace), mode=self.address_mode,
                                           in_cluster=in_cluster)
        payload = service_payload(service, cluster_info, hook.get_service(f"{name}-serve-svc", namespace),
                                  mode=self.address_mode, in_cluster=in_cluster)
        RayDashboardLink.persist(context, url=payload["dashboard_url"])
        self.persist_gke_links(context, namespace, cluster_info.get("head_pod"))
        self.log.info("RayService %s/%s ready: %s at %s", namespace, name, payload["applications"], payload["serve_url"])
        return payload


class _KubeRayDeleteOperator(KubeRayBaseOperator):
    kind = "RayCluster"
    plural = RAYCLUSTERS
    operator_extra_links = ()

    def __init__(self, *, name: str | None = None, owner_task_id: str | None = None, wait: bool = True,
                 wait_timeout: float = 600.0, poll_interval: float = 5.0, **kwargs: Any) -> None:
        super().__init__(wait_timeout=wait_timeout, poll_interval=poll_interval, **kwargs)
        if not name and not owner_task_id:
            raise UserInputError("name", name, "give the object's name, or the task id that created it")
        self.name, self.owner_task_id, self.wait = name, owner_task_id, wait

    def execute(self, context: Context) -> dict[str, Any]:
        hook = self.kube_hook()
        namespace = self.resolve_namespace()
        name = object_name(context, self.name, self.owner_task_id)
        existed = hook.delete(self.plural, name, namespace)
        result = {"kind": self.kind, "name": name, "namespace": namespace, "existed": existed, "deleted": True}
        if not existed:
            self.log.info("%s %s/%s does not exist; nothing to delete", self.kind, namespace, name)
            return result
        self.log.info("Deleting %s %s/%s", self.kind, namespace, name)
        if not self.wait or hook.get(self.plural, name, namespace) is None:
            result["deleted"] = hook.get(self.plural, name, namespace) is None
            return result
        event = self.wait_gone(self.kind, name, namespace)
        return self.execute_complete(context, event)

    def execute_complete(self, context: Context, event: dict[str, Any]) -> dict[str, Any]:
        self.raise_for_event(event, "deleted")
        return {"kind": self.kind, "name": event["name"], "namespace": event["namespace"], "existed": True,
                "deleted": True}


class KubeRayDeleteClusterOperator(_KubeRayDeleteOperator):
    """Delete a RayCluster and wait until it is gone (KubeRay has removed its pods).

    :param name: the RayCluster; or ``cluster_task_id``: the KubeRayCreateClusterOperator task whose
        deterministic name to use (works as a teardown even when that task failed before pushing XCom).
    """

    kind, plural = "RayCluster", RAYCLUSTERS
    template_fields: Sequence[str] = (*KubeRayBaseOperator.template_fields, "name")

    def __init__(self, *, name: str | None = None, cluster_task_id: str | None = None, **kwargs: Any) -> None:
        super().__init__(name=name, owner_task_id=cluster_task_id, **kwargs)


class KubeRayDeleteServiceOperator(_KubeRayDeleteOperator):
    """Delete a RayService (KubeRay removes its RayClusters) and wait until it is gone.

    :param name: the RayService; or ``service_task_id``: the KubeRayDeployServiceOperator task.
    """

    kind, plural = "RayService", RAYSERVICES
    template_fields: Sequence[str] = (*KubeRayBaseOperator.template_fields, "name")

    def __init__(self, *, name: str | None = None, service_task_id: str | None = None, **kwargs: Any) -> None:
        super().__init__(name=name, owner_task_id=service_task_id, **kwargs)


__all__ = [
    "KubeRayCreateClusterOperator",
    "KubeRayDeleteClusterOperator",
    "KubeRayDeleteServiceOperator",
    "KubeRayDeployServiceOperator",
]
