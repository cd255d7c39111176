"""The tpuflow Airflow plugin: what the UI needs beyond what the DAGs already carry.

Operator extra links (Ray Dashboard, Ray Job, Serve Endpoint, Outputs, GKE Node Pool /
Cluster Nodes / Workloads / Ray Head Pod) need NO registration in Airflow 3.3: the DAG
processor serializes each operator's own `operator_extra_links` as {name: xcom_key}, and the
API server rebuilds them as XComOperatorLink, which reads the URL our StoredUrlLink classes
push to XCom. Verified on 3.3.2 (tests/airflow_services: the task page shows them with this
plugin listing nothing). Registering the classes in `operator_extra_links` bound to their
operators would be worse than useless: plugin links take precedence, and their get_link
then runs inside the API server, where the Task SDK's XCom accessor is unavailable
(ImportError: SUPERVISOR_COMMS) -- the links would come back empty. A provider entry point
does not help either: its "extra-links" only feed `airflow providers links`; the provider
info (operators/tpuflow/provider_info.py) is kept for the "Ray" connection type in the UI's form.

What the plugin adds (operators/tpuflow/ui/app.py, mounted at /tpuflow, login required):
- /tpuflow/outputs/<dag>/<date>/...: a local run's outputs. The local "Outputs" extra link
  points there, because the Airflow 3.3 UI drops extra links that are not http(s) or
  same-origin: a file:// URL would not show on the task page at all.
- /tpuflow/clusters, in the nav as "Ray clusters": the local Ray clusters and their dashboards
  (ports are chosen at run time; keep_endpoint leaves a cluster up after its run).
- /tpuflow/ledger, in the nav as "Chip-hour ledger": chip-hours (and money, with prices) per run.
"""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin

from tpuflow.ui.app import app as tpuflow_app


class TpuflowPlugin(AirflowPlugin):
    name = "tpuflow"
    fastapi_apps = [{"app": tpuflow_app, "url_prefix": "/tpuflow", "name": "tpuflow"}]
    external_views = [
        {
            "name": "Ray clusters",
            "href": "/tpuflow/clusters",
            "destination": "nav",
            "category": "browse",
            "url_route": "tpuflow-ray-clusters",
        },
        {
            "name": "Chip-hour ledger",
            "href": "/tpuflow/ledger",
            "destination": "nav",
            "category": "browse",
            "url_route": "tpuflow-chip-ledger",
        },
    ]
