"""Airflow operators for KubeRay RayClusters and RayServices on GKE TPU slices.

    create = KubeRayCreateClusterOperator(task_id="ray_cluster", tpu_slice=TpuSlice.from_spec("v6e", "4x4"),
                                          image="rayproject/ray:2.60.0-py311", deferrable=True)
    delete = KubeRayDeleteClusterOperator(task_id="delete_ray_cluster", cluster_task_id="ray_cluster")
    create >> ... >> delete.as_teardown(setups=create)

Names are deterministic (dag id, run id, task id, map index), so a retried task adopts what its
earlier try created; an object of that name with a different spec (or another owner) is an error.
Ready means KubeRay's conditions (tpuflow.kuberay.status); a failure or the deadline raises with
KubeRay's reason, pod states, Warning events and the head pod's last log lines. The return value
(XCom) is the address payload of tpuflow.kuberay.addresses. The create/deploy flow (apply, wait,
finish) is ``tpuflow.kuberay.operator_base.KubeRayApplyOperator``.

Cheap to import: no kubernetes, ray or google imports at module level; the manifest builders, the
Serve config checks and the TPU webhook rules load when a manifest is built or checked (at parse
time only when the arguments they read are static).
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from airflow.sdk.exceptions import AirflowFailException

from tpuflow.arguments import ArgumentCheck
from tpuflow.errors import UserInputError
from tpuflow.events import raise_for_event
from tpuflow.kuberay import API_VERSION, DEFAULT_UPGRADE_STRATEGY, MANAGED_BY, RUN_KEY_LABEL, SPEC_HASH
from tpuflow.kuberay.addresses import cluster_payload, service_payload
from tpuflow.kuberay.kinds import RayClusterKind, RayServiceKind
from tpuflow.kuberay.links import RayDashboardLink
from tpuflow.kuberay.operator_base import KubeRayApplyOperator, KubeRayBaseOperator, SliceArgumentsMixin
from tpuflow.kuberay.ray_auth import with_cluster_auth
from tpuflow.kuberay.status import head_service_name, service_cluster_name
from tpuflow.kubernetes.operator_base import check_choice
from tpuflow.kubernetes.ownership import object_name, owner_labels
from tpuflow.kubernetes.values import check_name, stringify_ray_group_values
from tpuflow.labels import CLUSTER_SPEC_HASH_ANNOTATION as CLUSTER_SPEC_HASH
from tpuflow.labels import MANAGED_BY_VALUE
from tpuflow.templating import is_true
from tpuflow.work_spans import SERVING, push_open_span

if TYPE_CHECKING:
    from airflow.sdk import BaseOperatorLink, Context

    from tpuflow.kuberay.hooks import KubeRayHook
    from tpuflow.kubernetes.hooks import KubeTarget

ON_KILL_ACTIONS = ("delete", "keep")


def _slice_dict(spec: Mapping[str, Any]) -> dict[str, Any] | None:
    from tpuflow.kuberay.webhook_rules import slice_of_group, tpu_worker_groups

    for _, group, _ in tpu_worker_groups(spec):
        try:
            return slice_of_group(group).to_dict()
        except UserInputError:
            return None
    return None


def _rejection(err: Exception, kind: str, namespace: str, name: str, cluster_spec: Mapping[str, Any]) -> str:
    """Why the API refused the create; for the GKE TPU webhook's denial, which group and the numOfHosts to set."""
    from tpuflow.kuberay.webhook_rules import WEBHOOK_DENIAL, tpu_group_problems
    from tpuflow.kubernetes.errors import api_error_parts

    code, reason, message = api_error_parts(err)
    text = f"Kubernetes rejected {kind} {namespace}/{name} ({code} {reason}): {message}"
    if WEBHOOK_DENIAL in message:
        for problem in tpu_group_problems(cluster_spec):
            text += f"\n  {problem.message}; set {problem.field}={problem.expected_hosts}"
        text += (
            "\n  The GKE TPU webhook requires numOfHosts = chips(topology) / google.com/tpu per host; build the "
            "manifest from a TpuSlice (tpuflow render raycluster) instead of editing the shape by hand."
        )
    return text


def _cluster_addresses(
    hook: KubeRayHook, cluster: Mapping[str, Any], namespace: str, mode: str, target: Mapping[str, Any]
) -> dict[str, Any]:

    return cluster_payload(
        cluster,
        hook.get_service(head_service_name(cluster), namespace),
        mode=mode,
        in_cluster=bool(hook.is_in_cluster),
        target=target,
    )


class KubeRayCreateClusterOperator(SliceArgumentsMixin, KubeRayApplyOperator):
    """Create (or adopt) a RayCluster for a TPU slice and wait until KubeRay reports it ready.

    Returns {"kind", "name", "namespace", "dashboard_url", "serve_url", "gcs_address", "address_mode",
    "head_service", "head_pod", "in_cluster_dns": {...}, "slice": TpuSlice.to_dict()}. Killing the task
    while it waits deletes the RayCluster it created.

    :param ray_auth: ``"token"`` (default): KubeRay's authOptions turn on Ray token authentication, the
        token lives in the Secret KubeRay creates and downstream hooks read it from there (XCom carries
        only a reference to it); ``"disabled"`` (or ``"none"``) opts out by name and leaves the dashboard
        and Jobs API open to anything that reaches the head Service. Applies to ``manifest`` too: one
        without authOptions is completed (and the task log says so); one that sets ``mode: disabled``
        itself is refused unless ray_auth opts out.
    :param manifest: instead of the slice arguments, a complete RayCluster (dict or YAML), e.g. an edited
        ``tpuflow render raycluster``; name/namespace/ownership labels are set by the operator, authOptions
        as ``ray_auth`` says; templated.
    :param name: the RayCluster's name; default: per task instance (the same on every try); templated.
    :param labels: extra labels on the RayCluster and its pods; templated.
    :param annotations: extra annotations on the RayCluster.
    :param address_mode: auto | in_cluster_dns | head_service | port_forward (tpuflow.kuberay.addresses).
    :param expires_after: (seconds or timedelta) the RayCluster's ``tpuflow-expires`` label is the unix time
        this long after the task creates it (default 24 hours, as for node pools): past it the orphan reaper
        deletes it whatever its run's state. None: no label. A retry that adopts the cluster keeps the first.
        Templated.
    :param tpu_preflight: check TPU worker groups against the GKE TPU webhook's numOfHosts rule before
        sending (turn off only for features the check does not model, such as TPU sub-slicing).
    :param wait_timeout: seconds until the task fails with KubeRay's reason, pod states, Warning events and
        the head pod's last log lines.
    """

    kuberay_kind = RayClusterKind
    template_fields: Sequence[str] = (
        *KubeRayApplyOperator.template_fields,
        *SliceArgumentsMixin.slice_template_fields,
        "manifest",
    )

    def __init__(
        self, *, manifest: Mapping[str, Any] | str | None = None, tpu_preflight: bool = True, **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self.manifest = manifest
        self.tpu_preflight = tpu_preflight

    # --- checks ---
    def argument_checks(self) -> list[ArgumentCheck]:
        checks = [
            *super().argument_checks(),
            ((self.manifest, self.tpu_slice, self.image, self.provisioning_request_name), self._check_one_source),
        ]
        if self.manifest is None:
            checks.append((self.slice_values(), self.build_template))  # bad slice/image/env names the field
        else:
            checks.append(((self.manifest,), lambda: self._manifest_spec(self._parsed_manifest())))
        return checks

    def _check_one_source(self) -> None:
        if self.manifest is not None and (self.tpu_slice or self.image):
            raise UserInputError("manifest", "<manifest>", "give either manifest or the slice arguments, not both")
        if self.manifest is not None and self.provisioning_request_name:
            raise UserInputError(
                "provisioning_request_name",
                self.provisioning_request_name,
                "applies to the slice arguments: with manifest, put the consume-provisioning-request annotations "
                "on its TPU worker group's pod template",
            )

    # --- manifest ---
    def _parsed_manifest(self) -> dict[str, Any]:
        import yaml

        try:
            raw = yaml.safe_load(self.manifest) if isinstance(self.manifest, str) else self.manifest
        except yaml.YAMLError as err:
            problem = " ".join(str(err).split())  # one line: YAML errors span several
            raise UserInputError("manifest", str(self.manifest)[:80], f"not valid YAML: {problem}") from err
        if not isinstance(raw, Mapping) or not self.kuberay_kind.is_manifest(raw):
            raise UserInputError("manifest", str(raw)[:80], f"give a {API_VERSION} {self.kind} manifest")
        return dict(raw)

    def _manifest_spec(self, body: Mapping[str, Any]) -> tuple[dict[str, Any], bool]:
        """The user manifest's spec, checked (the TPU webhook's rule too, unless tpu_preflight is off) and
        carrying the authOptions ``ray_auth`` asks for; and whether authOptions had to be added."""
        from tpuflow.kuberay.webhook_rules import tpu_group_problems

        spec = stringify_ray_group_values(body.get("spec") or {})
        if not spec.get("headGroupSpec"):
            raise UserInputError("manifest.spec.headGroupSpec", None, "a RayCluster needs a headGroupSpec")
        if self.tpu_preflight:
            for problem in tpu_group_problems(spec):
                raise UserInputError(f"manifest.spec.{problem.field}", problem.num_of_hosts, problem.message)
        return with_cluster_auth(spec, self.ray_auth, field="manifest.spec")

    def _manifest_from_user(self, name: str, namespace: str, labels: Mapping[str, str]) -> dict[str, Any]:
        from tpuflow.kuberay.manifests import spec_hash

        body = self._parsed_manifest()
        spec, auth_added = self._manifest_spec(body)
        if auth_added:
            self.log.info(
                "The manifest sets no spec.authOptions: applying it with authOptions.mode=%s (ray_auth=%r)",
                spec["authOptions"]["mode"],
                self.ray_auth,
            )
        meta = dict(body.get("metadata") or {})
        meta.update(name=name, namespace=namespace)
        meta["labels"] = {**(meta.get("labels") or {}), **labels}
        meta["annotations"] = {
            **(meta.get("annotations") or {}),
            **(self.annotations or {}),
            SPEC_HASH: spec_hash(spec),
        }
        return {**body, "metadata": meta, "spec": spec}

    def build_body(self, context: Context, namespace: str) -> dict[str, Any]:
        labels = owner_labels(context, self.labels, self.expires_after)
        if self.manifest is not None:
            manifest_name = (self._parsed_manifest().get("metadata") or {}).get("name")
            return self._manifest_from_user(object_name(context, self.name or manifest_name), namespace, labels)
        return self.kuberay_kind.manifest(
            self.build_template(),
            name=object_name(context, self.name),
            namespace=namespace,
            labels=labels,
            annotations=self.annotations,
        )

    # --- the flow's steps ---
    def reconcile_existing(
        self, hook: KubeRayHook, existing: dict[str, Any], body: Mapping[str, Any], namespace: str
    ) -> dict[str, Any]:
        """Adopt the RayCluster an earlier try of this task instance created with the same spec."""
        meta = existing.get("metadata") or {}
        name = body["metadata"]["name"]
        ours = body["metadata"]["labels"].get(RUN_KEY_LABEL)
        theirs = (meta.get("labels") or {}).get(RUN_KEY_LABEL)
        if theirs != ours:
            owner = f"run-key {theirs}" if theirs else "something other than tpuflow"
            raise AirflowFailException(
                f"RayCluster {namespace}/{name} already exists and belongs to {owner}; delete it or choose another name"
            )
        # Compare what was sent (the annotation), not the stored spec: the apiserver fills CRD defaults in.
        want, have = body["metadata"]["annotations"][SPEC_HASH], (meta.get("annotations") or {}).get(SPEC_HASH)
        if want != have:
            raise AirflowFailException(
                f"RayCluster {namespace}/{name} exists with a different spec (spec-hash {have}, "
                f"this task wants {want}): delete it (KubeRayDeleteClusterOperator) or use "
                "another name"
            )
        self.log.info("Adopting RayCluster %s/%s created by an earlier try", namespace, name)
        return existing

    def rejection(self, err: Exception, body: Mapping[str, Any], namespace: str) -> str:
        return _rejection(err, self.kind, namespace, body["metadata"]["name"], body["spec"])

    def connection_payload(self, hook: KubeRayHook, target: KubeTarget, obj: Mapping[str, Any]) -> dict[str, Any]:
        namespace = (obj.get("metadata") or {}).get("namespace", "default")
        payload = _cluster_addresses(hook, obj, namespace, self.address_mode, target.to_dict())
        payload["slice"] = _slice_dict(obj.get("spec") or {})
        return payload

    def finish(self, context: Context, name: str, namespace: str) -> dict[str, Any]:
        hook = self.kube_hook()
        cluster = hook.get(self.plural, name, namespace)
        if cluster is None:
            raise AirflowFailException(f"RayCluster {namespace}/{name} disappeared right after becoming ready")
        payload = self.connection_payload(hook, self.kube_target(), cluster)
        RayDashboardLink.persist(context, url=payload["dashboard_url"])
        self.persist_gke_links(context, namespace, payload["head_pod"])
        self.log.info("RayCluster %s/%s ready: dashboard %s", namespace, name, payload["dashboard_url"])
        return payload


class KubeRayDeployServiceOperator(SliceArgumentsMixin, KubeRayApplyOperator):
    """Deploy or update a RayService and wait until Ready with every application RUNNING.

    serveConfigV2 is the same Serve config dict the local deploy PUTs to the dashboard. An application
    DEPLOY_FAILED/UNHEALTHY fails at once; at the deadline the error names the stuck deployment and the
    likely cause. Changing only the Serve config updates in place; with upgrade_strategy "None" (default:
    no second TPU slice needed) a changed cluster shape is refused; delete the RayService first.

    Returns {"kind", "name", "namespace", "serve_url", "dashboard_url", "gcs_address", "ray_cluster_name",
    "applications": {app: status}, "address_mode", "in_cluster_dns": {...}}.

    :param serve_config: {"applications": [...], "http_options"?: ...} or an object with to_dict(); templated
        (an upstream task's XCom works, and is checked when the task runs). On a multi-host slice an
        application whose args leave out its placement (accelerator_type, accelerator_config.topology,
        chips_per_host; each inline LLMConfig's accelerator_type / accelerator_config) gets it from the
        slice, logged; a declared value the slice contradicts is refused, never rewritten.
    :param llm_model_id: instead of serve_config, serve this model with Ray Serve LLM (vLLM) on the slice
        (tpuflow.serve.llm: LLMConfig with the slice's accelerator_type, topology and tensor parallel size,
        one replica per slice, the vLLM TPU sample's pod fields); give ``image`` (a vLLM TPU image, e.g.
        tpuflow.serve.llm.DEFAULT_VLLM_TPU_IMAGE pinned to a tag); templated.
    :param llm_options: with llm_model_id, the other tpuflow.serve.llm.LlmServe fields (model_source,
        max_model_len, engine_kwargs, route_prefix, hf_secret, cache_bucket); templated.
    :param deployment_options: with llm_model_id, Serve deployment settings
        (tpuflow.serve.deployment_options.DeploymentOptions or its fields as a dict: num_replicas or
        autoscaling_config, max_ongoing_requests, max_queued_requests, request_timeout_s, ...); templated.
    :param ray_auth: ``"token"`` (default): KubeRay's authOptions turn on Ray token authentication, the
        token lives in the Secret KubeRay creates and downstream hooks read it from there (XCom carries
        only a reference to it); ``"disabled"`` (or ``"none"``) opts out by name and leaves the dashboard,
        Jobs and Serve REST APIs open on the head Service (the Serve endpoint itself stays ClusterIP).
    :param name: a stable name makes the task update one long-lived endpoint across runs; default: per
        task instance; templated.
    :param labels: extra labels on the RayService and its Ray pods (keep per-run values out: they would
        change the cluster spec); templated.
    :param annotations: extra annotations on the RayService.
    :param upgrade_strategy: KubeRay's upgradeStrategy: "None" (update in place), "NewCluster" or
        "NewClusterWithIncrementalUpgrade" (both need capacity for a second slice).
    :param address_mode: auto | in_cluster_dns | head_service | port_forward (tpuflow.kuberay.addresses).
    :param expires_after: (seconds or timedelta) the RayService's ``tpuflow-expires`` label is the unix time
        this long after the task creates it (default 24 hours, as for node pools): past it the orphan reaper
        deletes it whatever its run's state. None: no label. Adopting or updating the RayService keeps the
        first: give a long-lived endpoint (a stable ``name``) None or a lifetime that covers it. Templated.
    :param on_kill_action: "delete" (default): killing the task while it waits deletes the RayService it
        created (never one it only updated); "keep": leave it for inspection.
    :param serve_token_conn_id: an Airflow Connection whose password is the endpoint's bearer token
        (optional, serve_config only): every application gets the token's SHA-256 as ``args.token_sha256``
        (never the token) and must answer 401 without ``Authorization: Bearer <token>``
        (tpuflow_driver.endpoint_token checks it).
    :param wait_timeout: seconds until the task fails naming the stuck application or deployment.
    """

    kuberay_kind = RayServiceKind
    template_fields: Sequence[str] = (
        *KubeRayApplyOperator.template_fields,
        *SliceArgumentsMixin.slice_template_fields,
        "serve_config",
        "llm_model_id",
        "llm_options",
        "deployment_options",
    )

    def __init__(
        self,
        *,
        serve_config: Any = None,
        llm_model_id: str | None = None,
        llm_options: Mapping[str, Any] | None = None,
        deployment_options: Any = None,
        upgrade_strategy: str = DEFAULT_UPGRADE_STRATEGY,
        on_kill_action: str = "delete",
        serve_token_conn_id: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.serve_token_conn_id = serve_token_conn_id
        self.serve_config = serve_config
        self.llm_model_id = llm_model_id
        self.llm_options = llm_options
        self.deployment_options = deployment_options
        self.upgrade_strategy = upgrade_strategy
        self.on_kill_action = on_kill_action

    # --- checks ---
    def argument_checks(self) -> list[ArgumentCheck]:
        llm_values = (self.llm_model_id, self.llm_options, self.deployment_options)
        from_slice = (*self.slice_values(), self.serve_config, *llm_values, self.labels, self.upgrade_strategy)
        return [
            *super().argument_checks(),
            ((self.on_kill_action,), lambda: check_choice("on_kill_action", self.on_kill_action, ON_KILL_ACTIONS)),
            ((self.serve_config, *llm_values, self.image), self._check_serve_source),
            (from_slice, lambda: self.build_manifest_for("parse-check", "default", {})),
        ]

    def _check_serve_source(self) -> None:
        if self.llm_model_id is not None and self.serve_token_conn_id:
            raise UserInputError(
                "serve_token_conn_id",
                self.serve_token_conn_id,
                "applies to serve_config applications, not llm_model_id",
            )
        if self.llm_model_id is None:
            if self.serve_config is None:
                raise UserInputError("serve_config", None, "give serve_config, or llm_model_id to serve an LLM")
            if self.llm_options is not None or self.deployment_options is not None:
                raise UserInputError(
                    "llm_options" if self.llm_options is not None else "deployment_options",
                    "<set>",
                    "these apply with llm_model_id; put a serve_config's settings in its deployments entries",
                )
            self._serve_config()
            return
        if self.serve_config is not None:
            raise UserInputError("serve_config", "<serve_config>", "give either serve_config or llm_model_id")
        if not self.image:
            from tpuflow.serve.llm import DEFAULT_VLLM_TPU_IMAGE

            raise UserInputError(
                "image", self.image, f"give the vLLM TPU image, e.g. {DEFAULT_VLLM_TPU_IMAGE} (pin a tag)"
            )
        self._llm()

    def _serve_config(self) -> dict[str, Any]:
        from tpuflow.kuberay.serve_config import serve_config_dict

        return serve_config_dict(self.serve_config)

    def _llm(self) -> Any:
        from tpuflow.serve.llm import LlmServe

        options = dict(self.llm_options or {})
        if self.deployment_options is not None:
            options["deployment_options"] = self.deployment_options
        return LlmServe.from_value(str(self.llm_model_id), options)

    def deletes_on_kill(self) -> bool:
        return self.on_kill_action == "delete"

    # --- manifest ---
    def execute(self, context: Context) -> dict[str, Any]:
        push_open_span(context, SERVING)  # the ledger's timeline: serving from here until the slice goes
        return super().execute(context)

    def build_manifest_for(
        self,
        name: str,
        namespace: str,
        labels: Mapping[str, str],
        token_digest: str | None = None,
        *,
        log_derived: bool = False,
    ) -> dict[str, Any]:
        """The RayService; with ``token_digest`` every application's args carry it (tpuflow.serve.endpoint_token).

        On a multi-host slice an application whose args leave out its placement gets it from the slice
        (``log_derived``: each derived value logged); a declared value the slice contradicts is refused."""
        from tpuflow.kuberay.manifests import spec_hash

        template = self.build_template()
        common: dict[str, Any] = {
            "name": name,
            "namespace": namespace,
            "labels": labels,
            "annotations": self.annotations,
            "upgrade_strategy": self.upgrade_strategy,
            "pod_labels": self.labels or {},
        }
        if self.llm_model_id is not None:
            from tpuflow.kuberay.llm_service import llm_rayservice_manifest

            manifest = llm_rayservice_manifest(template, self._llm(), **common)
        else:
            from tpuflow.serve.config import check_tpu_placement, derived_placement, place_on_slice

            given = self._serve_config()
            serve_config = place_on_slice(given, template.tpu)
            for line in derived_placement(given, serve_config, template.tpu) if log_derived else []:
                self.log.info("%s", line)
            if token_digest:
                from tpuflow.serve.endpoint_token import with_token_digest

                serve_config = with_token_digest(serve_config, token_digest)
            check_tpu_placement(serve_config, template.tpu)  # what is left must fit the slice
            manifest = self.kuberay_kind.manifest(template, serve_config=serve_config, **common)
        manifest["metadata"]["annotations"][CLUSTER_SPEC_HASH] = spec_hash(manifest["spec"]["rayClusterConfig"])
        return manifest

    def build_body(self, context: Context, namespace: str) -> dict[str, Any]:
        labels = owner_labels(context, self.labels, self.expires_after)
        digest = None
        if self.serve_token_conn_id:
            from tpuflow.serve.endpoint_token import serve_token, token_digest

            digest = token_digest(serve_token(self.serve_token_conn_id))
            self.log.info("Endpoint guarded by the bearer token of connection %r", self.serve_token_conn_id)
        return self.build_manifest_for(object_name(context, self.name), namespace, labels, digest, log_derived=True)

    # --- the flow's steps ---
    def reconcile_existing(
        self, hook: KubeRayHook, existing: dict[str, Any], body: Mapping[str, Any], namespace: str
    ) -> dict[str, Any]:
        """Adopt a RayService with this spec, or update one tpuflow created (Serve config in place)."""
        name = body["metadata"]["name"]
        meta = existing.get("metadata") or {}
        if (meta.get("labels") or {}).get(MANAGED_BY) != MANAGED_BY_VALUE:
            raise AirflowFailException(
                f"RayService {namespace}/{name} exists and was not created by tpuflow; delete it or choose another name"
            )
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
                "upgrade_strategy='NewCluster' with capacity for two slices"
            )
        patch: dict[str, Any] = {
            "metadata": {"annotations": {SPEC_HASH: want[SPEC_HASH], CLUSTER_SPEC_HASH: want[CLUSTER_SPEC_HASH]}},
            "spec": dict(body["spec"])
            if cluster_changed
            else {"serveConfigV2": body["spec"]["serveConfigV2"], "upgradeStrategy": body["spec"]["upgradeStrategy"]},
        }
        updated = hook.patch(self.plural, name, patch, namespace)
        self.log.info(
            "Updated RayService %s/%s (%s)",
            namespace,
            name,
            "new Ray cluster" if cluster_changed else "Serve config in place",
        )
        return updated

    def rejection(self, err: Exception, body: Mapping[str, Any], namespace: str) -> str:
        return _rejection(err, self.kind, namespace, body["metadata"]["name"], body["spec"]["rayClusterConfig"])

    def connection_payload(self, hook: KubeRayHook, target: KubeTarget, obj: Mapping[str, Any]) -> dict[str, Any]:
        meta = obj.get("metadata") or {}
        name, namespace = meta.get("name", ""), meta.get("namespace", "default")
        cluster_name = service_cluster_name(obj)
        cluster = hook.get(RayClusterKind.plural, cluster_name, namespace) if cluster_name else None
        cluster_info = (
            _cluster_addresses(hook, cluster, namespace, self.address_mode, target.to_dict()) if cluster else {}
        )
        payload = service_payload(
            obj,
            cluster_info,
            hook.get_service(f"{name}-serve-svc", namespace),
            mode=self.address_mode,
            in_cluster=bool(hook.is_in_cluster),
        )
        return {**payload, "head_pod": cluster_info.get("head_pod", "")}

    def finish(self, context: Context, name: str, namespace: str) -> dict[str, Any]:

        hook = self.kube_hook()
        service = hook.get(self.plural, name, namespace)
        if service is None:
            raise AirflowFailException(f"RayService {namespace}/{name} disappeared right after becoming ready")
        payload = self.connection_payload(hook, self.kube_target(), service)
        head_pod = payload.pop("head_pod")
        RayDashboardLink.persist(context, url=payload["dashboard_url"])
        self.persist_gke_links(context, namespace, head_pod)
        self.log.info(
            "RayService %s/%s ready: %s at %s", namespace, name, payload["applications"], payload["serve_url"]
        )
        return payload


class _KubeRayDeleteOperator(KubeRayBaseOperator):
    """Delete one object of ``kuberay_kind``; with ``wait``, wait until it is gone (in the triggerer or here).

    :param keep: templated; true (True, "true", "1", "yes") leaves the object running instead, labelled
        ``tpuflow-kept=true`` without its ``tpuflow-expires`` label (a merge patch; the orphan reaper leaves it,
        and what it owns stays with it), and returns ``{"kind", "name", "namespace", "kept": True, "existed",
        "deleted": False}``; e.g. a run's kept endpoint. Default False: delete.
    :param wait: wait until the object is gone (default True).
    :param poll_interval: seconds between reads (default 5).
    :param wait_timeout: seconds until the task fails naming the object's finalizers (default 600).
    :param log_lines: unused by deletes (accepted for symmetry with the create and deploy operators).
    """

    operator_extra_links: Collection[BaseOperatorLink] = ()
    template_fields: Sequence[str] = (*KubeRayBaseOperator.template_fields, "name", "keep")

    def __init__(
        self,
        *,
        name: str | None = None,
        owner_task_id: str | None = None,
        keep: Any = False,
        wait: bool = True,
        wait_timeout: float = 600.0,
        poll_interval: float = 5.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(wait_timeout=wait_timeout, poll_interval=poll_interval, **kwargs)
        self.name = name
        self.owner_task_id = owner_task_id
        self.keep = keep
        self.wait = wait

    def argument_checks(self) -> list[ArgumentCheck]:
        return [*super().argument_checks(), ((self.name,), self._check_target)]

    def _check_target(self) -> None:
        if not self.name and not self.owner_task_id:
            raise UserInputError("name", self.name, "give the object's name, or the task id that created it")
        if self.name:
            check_name("name", self.name)

    def execute(self, context: Context) -> dict[str, Any]:
        """Request the deletion; wait until the object is gone in the triggerer or in this worker."""
        self.validate_arguments()
        hook = self.kube_hook()
        namespace = self.resolve_namespace()
        name = object_name(context, self.name, self.owner_task_id)
        if is_true(self.keep):
            return self._keep(name, namespace)
        kind = self.kuberay_kind
        # the RayClusters KubeRay made for it, read before the delete: a background delete may take them at once,
        # and the wait follows their pods by their names
        selector = kind.clusters_selector(name)
        listed = hook.objects(RayClusterKind.plural, namespace, selector) if selector else []
        clusters = [str(c["metadata"]["name"]) for c in listed]
        existed = hook.delete(self.plural, name, namespace, foreground=kind.delete_foreground)
        result = {"kind": self.kind, "name": name, "namespace": namespace, "existed": existed, "deleted": True}
        if not existed and not clusters:
            self.log.info("%s %s/%s does not exist; nothing to delete", self.kind, namespace, name)
            return result
        made = f" and its RayClusters {', '.join(clusters)}" if clusters else ""
        self.log.info("Deleting %s %s/%s%s", self.kind, namespace, name, made)
        gone = hook.get(self.plural, name, namespace) is None
        if not self.wait or (gone and not clusters):
            result["deleted"] = gone
            return result
        wait = {**self.wait_arguments(name, namespace), "clusters": clusters}
        if self.deferrable:
            self.execute_async(context, wait)
        return self.execute_sync(context, wait)

    def _keep(self, name: str, namespace: str) -> dict[str, Any]:
        """``keep``: leave the object running, marked kept (the orphan reaper never deletes a marked object)."""
        existed = self.kube_hook().mark_kept(self.plural, name, namespace)
        what = "running (marked kept)" if existed else "alone (it does not exist)"
        self.log.info("keep: leaving %s %s/%s %s", self.kind, namespace, name, what)
        return {
            "kind": self.kind,
            "name": name,
            "namespace": namespace,
            "kept": True,
            "existed": existed,
            "deleted": False,
        }

    def execute_async(self, context: Context, wait: dict[str, Any]) -> None:
        """Defer: KubeRayDeletedTrigger waits in the triggerer until the object is gone, and ends the task there."""
        from tpuflow.kuberay.triggers import KubeRayDeletedTrigger
        from tpuflow.triggers import task_end

        gone = self._gone(wait["name"], wait["namespace"])
        self.defer(
            trigger=KubeRayDeletedTrigger(
                target=self.kube_target().to_dict(),
                end_task=task_end(self, gone),
                **wait,
            ),
            method_name="execute_complete",
        )

    def execute_sync(self, context: Context, wait: dict[str, Any]) -> dict[str, Any]:
        """Wait in this worker: the trigger's own wait, run here."""
        from tpuflow.kuberay.waits import SyncReader, wait_gone

        event = asyncio.run(wait_gone(SyncReader(self.kube_hook()), **wait))
        return self.execute_complete(context, dict(event))

    def execute_complete(self, context: Context, event: dict[str, Any]) -> dict[str, Any]:
        """The deletion's outcome, for both paths: the trigger's event, or the same event from execute_sync."""
        raise_for_event(event, f"deleting {self.kind} {event.get('namespace')}/{event.get('name')}")
        return self._gone(event["name"], event["namespace"])

    def _gone(self, name: str, namespace: str) -> dict[str, Any]:
        """The task's value once the object it deleted is gone."""
        return {"kind": self.kind, "name": name, "namespace": namespace, "existed": True, "deleted": True}


class KubeRayDeleteClusterOperator(_KubeRayDeleteOperator):
    """Delete a RayCluster and wait until it is gone (KubeRay has removed its pods).

    Returns {"kind", "name", "namespace", "existed", "deleted"}; a RayCluster that does not exist is a
    no-op (``existed`` False), so the operator works as a teardown.

    :param name: the RayCluster; templated.
    :param cluster_task_id: instead of ``name``, the KubeRayCreateClusterOperator task whose deterministic
        name to use (works as a teardown even when that task failed before pushing XCom).
    :param wait: wait until the RayCluster is gone (default True).
    """

    kuberay_kind = RayClusterKind

    def __init__(self, *, name: str | None = None, cluster_task_id: str | None = None, **kwargs: Any) -> None:
        super().__init__(name=name, owner_task_id=cluster_task_id, **kwargs)


class KubeRayDeleteServiceOperator(_KubeRayDeleteOperator):
    """Delete a RayService (KubeRay removes its RayClusters) and wait until it is gone.

    Returns {"kind", "name", "namespace", "existed", "deleted"}; a RayService that does not exist is a
    no-op (``existed`` False).

    :param name: the RayService; templated.
    :param service_task_id: instead of ``name``, the KubeRayDeployServiceOperator task whose deterministic
        name to use.
    :param wait: wait until the RayService is gone (default True).
    """

    kuberay_kind = RayServiceKind

    def __init__(self, *, name: str | None = None, service_task_id: str | None = None, **kwargs: Any) -> None:
        super().__init__(name=name, owner_task_id=service_task_id, **kwargs)


__all__ = [
    "KubeRayCreateClusterOperator",
    "KubeRayDeleteClusterOperator",
    "KubeRayDeleteServiceOperator",
    "KubeRayDeployServiceOperator",
]
