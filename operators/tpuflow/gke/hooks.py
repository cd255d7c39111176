"""Node pool calls on top of the google provider's GKEHook (its credentials, its ClusterManagerClient).

Connection extras honoured besides the google_cloud_platform ones (``is_anonymous``, ``key_path``,
``project``, ...):

``container_api_endpoint``
    Base URL of the GKE API, e.g. ``http://127.0.0.1:8123`` for the local stand-in
    (``python -m tpuflow_rehearsal.standins.gke_api``). Unset: the real GKE endpoint.
``container_api_transport``
    ``rest`` or ``grpc``. Defaults to ``rest`` when the endpoint starts with ``http://`` or
    ``https://``, otherwise to the client library's default (gRPC).
``compute_api_endpoint`` / ``compute_api_transport``
    The same for the Compute API (workload policies, ComputeResourcePolicyHook); the GKE stand-in
    serves both on one URL.
``quotas_api_endpoint`` / ``quotas_api_transport``
    The same for the Cloud Quotas API (TPU quotas, CloudQuotasHook); the GKE stand-in serves it too.

A connection for the stand-in, as an environment variable::

    AIRFLOW_CONN_GKE_STANDIN='{"conn_type": "google_cloud_platform",
        "extra": {"is_anonymous": true, "container_api_endpoint": "http://127.0.0.1:8123",
                  "compute_api_endpoint": "http://127.0.0.1:8123",
                  "quotas_api_endpoint": "http://127.0.0.1:8123"}}'
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Mapping
from typing import Any, cast

from airflow.providers.google.cloud.hooks.kubernetes_engine import GKEAsyncHook, GKEHook
from airflow.providers.google.common.consts import CLIENT_INFO
from airflow.providers.google.common.hooks.base_google import PROVIDE_PROJECT_ID, GoogleBaseHook
from google.api_core.client_options import ClientOptions
from google.api_core.exceptions import NotFound
from google.cloud import compute_v1
from google.cloud.container_v1 import ClusterManagerAsyncClient, ClusterManagerClient
from google.cloud.container_v1.types import NodePool, Operation, ResourceLabels, UpdateNodePoolRequest

from tpuflow.polling import poll_delays

ACTIVE_OPERATION = (Operation.Status.PENDING, Operation.Status.RUNNING)


def to_rest_json(message: Any) -> dict[str, Any]:
    """A proto-plus message as the GKE REST API writes it (camelCase, enums by name, unset fields left out)."""
    # proto-plus writes a message as a JSON object; json.loads is typed Any
    return cast(
        "dict[str, Any]",
        json.loads(
            type(message).to_json(
                message, use_integers_for_enums=False, always_print_fields_with_no_presence=False, indent=None
            )
        ),
    )


class GKEOperationError(Exception):
    """A GKE operation finished (DONE) with an error."""

    def __init__(self, operation: Operation) -> None:
        self.operation = operation
        self.operation_json = to_rest_json(operation)
        super().__init__(f"operation {operation.name} failed: {operation.error.message or operation.detail}")


class GKENodePoolHook(GKEHook):
    """Create, read, list, relabel and delete GKE node pools and follow their operations (GKEHook's constructor:
    ``gcp_conn_id``, ``location``, ``impersonation_chain``)."""

    # --- connection-driven client set-up ----------------------------------------------------------------
    @property
    def container_api_endpoint(self) -> str | None:
        return self._get_field("container_api_endpoint", None) or None

    @property
    def container_api_transport(self) -> str | None:
        transport = self._get_field("container_api_transport", None)
        if transport:
            return str(transport).lower()
        endpoint = self.container_api_endpoint or ""
        return "rest" if endpoint.startswith(("http://", "https://")) else None

    @property
    def uses_rest_transport(self) -> bool:
        return self.container_api_transport == "rest"

    def container_client_options(self) -> ClientOptions:
        return self.get_client_options(api_endpoint_override=self.container_api_endpoint)

    def get_cluster_manager_client(self) -> ClusterManagerClient:
        if self._client is None:
            self._client = ClusterManagerClient(
                credentials=self.get_credentials(),
                client_info=CLIENT_INFO,
                client_options=self.container_client_options(),
                transport=self.container_api_transport,
            )
        return self._client

    # --- paths --------------------------------------------------------------------------------------
    def cluster_path(self, project_id: str, cluster_name: str) -> str:
        return f"projects/{project_id}/locations/{self.location}/clusters/{cluster_name}"

    def node_pool_path(self, project_id: str, cluster_name: str, node_pool_name: str) -> str:
        return f"{self.cluster_path(project_id, cluster_name)}/nodePools/{node_pool_name}"

    # --- node pools ---------------------------------------------------------------------------------
    def create_node_pool(self, *, project_id: str, cluster_name: str, node_pool: dict[str, Any]) -> Operation:
        """Send one NodePool (REST JSON form, as built by tpuflow.gke.nodepool_spec) and return its Operation."""
        self.log.info("Creating node pool %s in %s", node_pool.get("name"), self.cluster_path(project_id, cluster_name))
        return self.get_cluster_manager_client().create_node_pool(
            parent=self.cluster_path(project_id, cluster_name),
            node_pool=NodePool.from_json(json.dumps(node_pool)),
        )

    def get_node_pool(self, *, project_id: str, cluster_name: str, node_pool_name: str) -> NodePool | None:
        try:
            return self.get_cluster_manager_client().get_node_pool(
                name=self.node_pool_path(project_id, cluster_name, node_pool_name)
            )
        except NotFound:
            return None

    def list_node_pools(self, *, project_id: str, cluster_name: str) -> list[NodePool]:
        response = self.get_cluster_manager_client().list_node_pools(parent=self.cluster_path(project_id, cluster_name))
        return list(response.node_pools)

    def delete_node_pool(self, *, project_id: str, cluster_name: str, node_pool_name: str) -> Operation | None:
        """Start deleting a node pool; None when it does not exist."""
        self.log.info("Deleting node pool %s", self.node_pool_path(project_id, cluster_name, node_pool_name))
        try:
            return self.get_cluster_manager_client().delete_node_pool(
                name=self.node_pool_path(project_id, cluster_name, node_pool_name)
            )
        except NotFound:
            self.log.info("Node pool %s does not exist", node_pool_name)
            return None

    def set_node_pool_resource_labels(
        self, *, project_id: str, cluster_name: str, node_pool_name: str, labels: Mapping[str, str]
    ) -> Operation:
        """Replace the pool's GCE resourceLabels with ``labels`` (nodePools.update; GKE relabels the pool's VMs
        in place) and return the Operation. The whole set: a label left out is removed."""
        name = self.node_pool_path(project_id, cluster_name, node_pool_name)
        self.log.info("Setting the resource labels of node pool %s", name)
        return self.get_cluster_manager_client().update_node_pool(
            request=UpdateNodePoolRequest(name=name, resource_labels=ResourceLabels(labels=dict(labels)))
        )

    # --- operations ---------------------------------------------------------------------------------
    def get_operation(self, operation_name: str, project_id: str = PROVIDE_PROJECT_ID) -> Operation:
        # GKEHook's version, with a short name accepted as well as a full path.
        short = operation_name.rsplit("/", 1)[-1]
        return super().get_operation(short, project_id=project_id)

    def find_running_operation(self, *, project_id: str, cluster_name: str, node_pool_name: str) -> Operation | None:
        """The unfinished operation on a node pool (e.g. a create started by an earlier try of the task)."""
        response = self.get_cluster_manager_client().list_operations(
            parent=f"projects/{project_id}/locations/{self.location}"
        )
        suffix = f"/clusters/{cluster_name}/nodePools/{node_pool_name}"
        for operation in response.operations:
            if operation.status in ACTIVE_OPERATION and operation.target_link.endswith(suffix):
                return operation
        return None

    @staticmethod
    def raise_for_operation_error(operation: Operation) -> Operation:
        """GKE marks a failed operation DONE; the failure is only in ``operation.error``."""
        if operation.error.code or operation.error.message or list(operation.nodepool_conditions):
            raise GKEOperationError(operation)
        return operation

    def wait_for_node_pool_operation(
        self,
        operation: Operation | str,
        *,
        project_id: str,
        poll_interval: float = 10.0,
        timeout: float | None = None,
    ) -> Operation:
        """Poll until the operation is DONE (looking again soon, then every poll_interval: tpuflow.polling), then
        raise GKEOperationError if it failed."""
        name = operation if isinstance(operation, str) else operation.name
        deadline = None if timeout is None else time.monotonic() + timeout
        delays = poll_delays(poll_interval)
        while True:
            current = self.get_operation(name, project_id=project_id)
            if current.status == Operation.Status.DONE:
                return self.raise_for_operation_error(current)
            if current.status not in ACTIVE_OPERATION:
                raise GKEOperationError(current)
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"GKE operation {name} still {current.status.name} after {timeout} s")
            time.sleep(next(delays))


class GKENodePoolAsyncHook(GKEAsyncHook):
    """GKEAsyncHook whose client honours the connection's endpoint and transport extras."""

    sync_hook_class = GKENodePoolHook

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # GKEAsyncHook does not hand the location to its sync hook; get_operation there needs it.
        self._hook_kwargs["location"] = self.location

    async def _get_client(self) -> ClusterManagerAsyncClient:
        if self._client is None:
            sync_hook = await self.get_sync_hook()
            self._client = ClusterManagerAsyncClient(
                credentials=sync_hook.get_credentials(),
                client_info=CLIENT_INFO,
                client_options=sync_hook.container_client_options(),
            )
        return self._client

    async def get_operation(self, operation_name: str, project_id: str = PROVIDE_PROJECT_ID) -> Operation:
        sync_hook: GKENodePoolHook = await self.get_sync_hook()
        if sync_hook.uses_rest_transport:
            # container_v1 has no asyncio REST transport (ClusterManagerAsyncClient is gRPC only), so a
            # connection configured for REST (e.g. the local stand-in) polls with the sync client in a thread.
            return await asyncio.to_thread(sync_hook.get_operation, operation_name, project_id)
        return await super().get_operation(operation_name=operation_name, project_id=project_id)


def _transport_for(endpoint: str | None, named: Any) -> str | None:
    if named:
        return str(named).lower()
    return "rest" if (endpoint or "").startswith(("http://", "https://")) else None


class ComputeResourcePolicyHook(GoogleBaseHook):
    """Regional Compute resource policies (the workload policies of multi-host tpu7x pools) and their
    operations, on the google provider's credentials path (GoogleBaseHook's constructor: ``gcp_conn_id``,
    ``impersonation_chain``). Inserts and deletes return the raw regional Operation (``*_unary``): the
    provisioning loop polls it, never a blocking ``result()``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._policies_client: compute_v1.ResourcePoliciesClient | None = None
        self._operations_client: compute_v1.RegionOperationsClient | None = None

    @property
    def compute_api_endpoint(self) -> str | None:
        return self._get_field("compute_api_endpoint", None) or None

    @property
    def compute_api_transport(self) -> str | None:
        return _transport_for(self.compute_api_endpoint, self._get_field("compute_api_transport", None))

    def _client_kwargs(self) -> dict[str, Any]:
        return {
            "credentials": self.get_credentials(),
            "client_info": CLIENT_INFO,
            "client_options": self.get_client_options(api_endpoint_override=self.compute_api_endpoint),
            "transport": self.compute_api_transport,
        }

    def get_resource_policies_client(self) -> compute_v1.ResourcePoliciesClient:
        if self._policies_client is None:
            self._policies_client = compute_v1.ResourcePoliciesClient(**self._client_kwargs())
        return self._policies_client

    def get_region_operations_client(self) -> compute_v1.RegionOperationsClient:
        # Its own client: the one ExtendedOperation builds ignores the endpoint override.
        if self._operations_client is None:
            self._operations_client = compute_v1.RegionOperationsClient(**self._client_kwargs())
        return self._operations_client

    def get_resource_policy(self, *, project_id: str, region: str, name: str) -> compute_v1.ResourcePolicy | None:
        try:
            return self.get_resource_policies_client().get(project=project_id, region=region, resource_policy=name)
        except NotFound:
            return None

    def list_resource_policies(self, *, project_id: str, region: str) -> list[compute_v1.ResourcePolicy]:
        return list(self.get_resource_policies_client().list(project=project_id, region=region))

    def insert_resource_policy(
        self, *, project_id: str, region: str, resource_policy: dict[str, Any]
    ) -> compute_v1.Operation:
        """Send one ResourcePolicy (REST JSON form, as built by tpuflow.gke.workload_policy)."""
        self.log.info(
            "Creating resource policy %s in projects/%s/regions/%s", resource_policy["name"], project_id, region
        )
        return self.get_resource_policies_client().insert_unary(
            project=project_id,
            region=region,
            resource_policy_resource=compute_v1.ResourcePolicy.from_json(json.dumps(resource_policy)),
        )

    def delete_resource_policy(self, *, project_id: str, region: str, name: str) -> compute_v1.Operation | None:
        """Start deleting a resource policy; None when it does not exist."""
        self.log.info("Deleting resource policy %s in projects/%s/regions/%s", name, project_id, region)
        try:
            return self.get_resource_policies_client().delete_unary(
                project=project_id, region=region, resource_policy=name
            )
        except NotFound:
            return None

    def get_region_operation(self, *, project_id: str, region: str, name: str) -> compute_v1.Operation:
        return self.get_region_operations_client().get(project=project_id, region=region, operation=name)


class CloudQuotasHook(GoogleBaseHook):
    """Quota limits from the Cloud Quotas API (``cloudquotas.googleapis.com``): the TPU chip quotas of
    current generations are only there, not in Compute's regional quota view. GoogleBaseHook's
    constructor (``gcp_conn_id``, ``impersonation_chain``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._client: Any = None

    def get_quotas_client(self) -> Any:
        from google.cloud import cloudquotas_v1

        if self._client is None:
            endpoint = self._get_field("quotas_api_endpoint", None) or None
            self._client = cloudquotas_v1.CloudQuotasClient(
                credentials=self.get_credentials(),
                client_info=CLIENT_INFO,
                client_options=self.get_client_options(api_endpoint_override=endpoint),
                transport=_transport_for(endpoint, self._get_field("quotas_api_transport", None)),
            )
        return self._client

    def get_quota_info(self, *, project_id: str, quota_id: str, service: str = "compute.googleapis.com") -> Any:
        """One QuotaInfo; None when the service has no quota of that id."""
        name = f"projects/{project_id}/locations/global/services/{service}/quotaInfos/{quota_id}"
        try:
            return self.get_quotas_client().get_quota_info(name=name)
        except NotFound:
            return None
