"""Deploy Ray Serve applications through the dashboard and smoke-test the endpoint."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

from airflow.sdk import BaseOperator

from tpuflow.arguments import ArgumentCheck, ArgumentChecks
from tpuflow.errors import UserInputError
from tpuflow.events import raise_for_event
from tpuflow.links import StoredUrlLink
from tpuflow.ray.cluster_source import check_url_of_source, cluster_source_task, trusted_cluster
from tpuflow.ray.connection import check_cluster
from tpuflow.ray.links import RayDashboardLink
from tpuflow.tpu.slice_argument import resolve_slice
from tpuflow.validation import check_seconds
from tpuflow.work_spans import SERVING, push_open_span

if TYPE_CHECKING:
    from airflow.sdk import Context, XComArg
    from pydantic import JsonValue

    from tpuflow.serve.hooks import RayServeHook
    from tpuflow.tpu import TpuSlice
    from tpuflow.tpu.slice_argument import SliceArgument

ON_KILL_ACTIONS = ("delete", "keep")


class RayServeEndpointLink(StoredUrlLink):
    name = "Serve Endpoint"
    key = "ray_serve_endpoint"


class RayServeDeploymentFailedError(RuntimeError):
    """A deployed endpoint did not answer as expected within its deadline."""


class RayServeDeployOperator(ArgumentChecks, BaseOperator):
    """PUT a Serve config (what KubeRay's RayService controller does) and wait until every app is RUNNING.

    Returns ``{"serve_url", "routes": {app: route_prefix}}``. A DEPLOY_FAILED or UNHEALTHY app fails
    the task (retried) with Serve's messages; an app still DEPLOYING at ``deploy_timeout`` fails it
    with the deployments that are stuck and the usual causes.

    :param serve_config: body for PUT /api/serve/applications/ (see tpuflow.serve.config); templated.
    :param cluster: the cluster-start task's XCom (dashboard_url, serve_url, ...); templated.
    :param ray_conn_id: Airflow connection (type ``ray``; extra ``serve_url``) naming the dashboard, when
        ``cluster`` is not given.
    :param tpu_slice: the slice the model is served on (tpuflow.tpu.slice_argument), optional: a TpuSlice
        (``TpuSlice.from_spec("v6e", "4x4")``), its ``to_dict()``, or ``{"accelerator", "topology",
        "machine_type"?, "num_slices"?}`` whose values may be templates; None: no TPU placement. On a multi-host slice, an application whose args
        leave out its placement (accelerator_type, accelerator_config.topology, chips_per_host; each
        inline LLMConfig's accelerator_type / accelerator_config) gets it from the slice, logged; a
        declared value the slice contradicts is rejected. Before anything is deployed, a replica asking
        for more TPU than a host has, and more replicas than the slices (or hosts) hold are rejected
        too; templated.
    :param deploy_timeout: seconds to wait for RUNNING before failing with what is stuck and why.
    :param poll_interval: seconds between status polls.
    :param deferrable: wait in the triggerer (default) instead of the worker.
    :param on_kill_action: what killing the task (marking it failed or success, or clearing it) does to
        the applications, while it waits in the worker and while it is deferred. "delete" (default):
        delete the applications this task created (absent before its deploy), and only when every
        application on the cluster is one of them (Serve deletes all at once); an app it merely updated
        keeps serving. "keep": leave everything serving.
    :param serve_token_conn_id: an Airflow Connection whose password is the endpoint's bearer token
        (optional). Every application gets the token's SHA-256 digest as ``args.token_sha256`` (never the
        token) and must check it (e.g. with tpuflow_driver.endpoint_token, as the demo's app does): requests
        without ``Authorization: Bearer <token>`` get 401. Give the smoke test the same connection.
    """

    template_fields: Sequence[str] = ("serve_config", "cluster", "tpu_slice")
    template_fields_renderers = {"serve_config": "json", "cluster": "json"}
    operator_extra_links = (RayServeEndpointLink(), RayDashboardLink())
    ui_color = "#ffe7c2"

    def __init__(
        self,
        *,
        serve_config: dict[str, Any] | XComArg,
        cluster: dict[str, Any] | XComArg | None = None,
        ray_conn_id: str | None = None,
        tpu_slice: SliceArgument | str | None = None,
        deploy_timeout: float = 600.0,
        poll_interval: float = 2.0,
        deferrable: bool = True,
        on_kill_action: str = "delete",
        serve_token_conn_id: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        # Template fields: an XComArg or a template here is rendered to the value before execute, and the attributes
        # are typed as the rendered values
        self.serve_config = cast("dict[str, Any]", serve_config)
        self.serve_token_conn_id = serve_token_conn_id
        self.cluster = cast("dict[str, Any] | None", cluster)
        self._cluster_source = cluster_source_task(cluster)  # whose XCom it is: where and how come from that task
        self.ray_conn_id = ray_conn_id
        self.tpu_slice = cast("SliceArgument | None", tpu_slice)
        self.deploy_timeout = deploy_timeout
        self.poll_interval = poll_interval
        self.deferrable = deferrable
        self.on_kill_action = on_kill_action
        # What on_kill deletes: the applications this task created, while the worker waits for them.
        self._owned: list[str] | None = None

    def argument_checks(self) -> list[ArgumentCheck]:
        return [
            *super().argument_checks(),
            ((), self._check_waiting),  # never templated
            ((self.cluster,), lambda: check_cluster(self.cluster, self.ray_conn_id)),
            ((self.serve_config,), self._check_serve_config),
            ((self.tpu_slice,), self._tpu_slice),
            ((self.serve_config, self.tpu_slice), self._placed_config),
        ]

    def _check_waiting(self) -> None:
        if self.on_kill_action not in ON_KILL_ACTIONS:
            raise UserInputError("on_kill_action", self.on_kill_action, f"use one of {', '.join(ON_KILL_ACTIONS)}")
        check_seconds("deploy_timeout", self.deploy_timeout)
        check_seconds("poll_interval", self.poll_interval)

    def _check_serve_config(self) -> None:
        if not (
            isinstance(self.serve_config, dict)
            and isinstance(self.serve_config.get("applications"), list)
            and self.serve_config["applications"]
        ):
            raise UserInputError(
                "serve_config",
                self.serve_config,
                'give the Serve config as a dict with its "applications" (see tpuflow.serve.config.serve_config)',
            )

    def _placed_config(self, *, log: bool = False) -> dict[str, Any]:
        """The Serve config with each multi-host app's placement derived from tpu_slice where its args
        leave it out (never a declared value rewritten), checked to fit the slice."""
        from tpuflow.serve.config import check_tpu_placement, derived_placement, place_on_slice

        tpu = self._tpu_slice()
        placed = place_on_slice(self.serve_config, tpu)
        check_tpu_placement(placed, tpu)
        for line in derived_placement(self.serve_config, placed, tpu) if log else []:
            self.log.info("%s", line)
        return placed

    def _tpu_slice(self) -> TpuSlice | None:
        """The slice ``tpu_slice`` names (None: none given), or one line naming ``tpu_slice.<key>``."""
        if self.tpu_slice is None:
            return None

        return resolve_slice(self.tpu_slice)

    def hook(self) -> RayServeHook:
        from tpuflow.serve.hooks import RayServeHook

        return RayServeHook(ray_conn_id=self.ray_conn_id, cluster=self.cluster or None)

    def execute(self, context: Context) -> Any:
        from tpuflow.serve.config import application_names

        self.validate_arguments()
        self.cluster = trusted_cluster(self, self.cluster, self._cluster_source, context)
        push_open_span(context, SERVING)
        hook = self.hook()
        RayDashboardLink.persist(context, url=f"{hook.dashboard_url}/#/serve")
        RayServeEndpointLink.persist(context, url=hook.serve_url)
        names = application_names(self.serve_config)
        created = self._absent_apps(hook, names) if self.on_kill_action == "delete" else []
        self.log.info("Deploying Serve applications %s to %s", names, hook.dashboard_url)
        self._owned = created
        hook.deploy_applications(self._config_to_deploy())
        wait = {"app_names": names, "timeout": self.deploy_timeout, "poll_interval": self.poll_interval}
        if self.deferrable:
            self.execute_async(context, wait, created)
        return self.execute_sync(context, wait)

    def execute_async(self, context: Context, wait: dict[str, Any], created: list[str]) -> None:
        """Defer: RayServeApplicationsTrigger waits in the triggerer (and deletes ``created`` if killed)."""
        from tpuflow.serve.triggers import RayServeApplicationsTrigger
        from tpuflow.triggers import task_end

        self.defer(
            trigger=RayServeApplicationsTrigger(
                cluster=self.cluster or None,
                ray_conn_id=self.ray_conn_id,
                delete_on_kill=created or None,
                # nothing is left to do once the apps are RUNNING: the trigger ends the task with its value
                end_task=task_end(self, self._deployed()),
                **wait,
            ),
            method_name="execute_complete",
        )

    def execute_sync(self, context: Context, wait: dict[str, Any]) -> Any:
        """Wait in this worker: the trigger's own wait, run here."""
        from tpuflow.serve.waits import wait_for_applications

        try:
            event = asyncio.run(wait_for_applications(self.hook(), started_at=time.time(), log=self.log, **wait))
        finally:
            self._owned = None
        return self.execute_complete(context, dict(event))

    def execute_complete(self, context: Context, event: dict[str, Any]) -> dict[str, Any]:
        """The deployment's outcome, for both paths: the trigger's event, or the same event from execute_sync."""
        raise_for_event(event, "Serve deployment")
        deployed = self._deployed()
        self.log.info("Serve applications RUNNING: %s at %s", deployed["routes"], deployed["serve_url"])
        return deployed

    def cluster_from_reference(self, reference: Mapping[str, Any], context: Context) -> dict[str, Any]:
        """Where this task's apps answer (tpuflow.ray.cluster_source): its cluster's serve_url, re-derived from that
        cluster's start task, never the serve_url a (rewritable) XCom says."""
        from tpuflow.serve.hooks import RayServeHook

        cluster = self.render_template(self.cluster, context)  # its XCom argument resolved (a mapped one already is)
        trusted = trusted_cluster(self, cluster, self._cluster_source, context)
        return {"serve_url": RayServeHook(ray_conn_id=self.ray_conn_id, cluster=trusted).serve_url}

    def _deployed(self) -> dict[str, Any]:
        """The task's value once its applications are RUNNING: where they answer."""
        routes = {a["name"]: a.get("route_prefix", "/") for a in self.serve_config.get("applications", [])}
        return {"serve_url": self.hook().serve_url, "routes": routes}

    def _config_to_deploy(self) -> dict[str, Any]:
        """The Serve config placed on tpu_slice (what was derived is logged), with the bearer token's digest
        in every application's args when one is asked for."""
        config = self._placed_config(log=True)
        if not self.serve_token_conn_id:
            return config
        from tpuflow.serve.endpoint_token import serve_token, token_digest, with_token_digest

        digest = token_digest(serve_token(self.serve_token_conn_id))
        self.log.info(
            "Endpoint guarded by the bearer token of connection %r (apps get its digest)", self.serve_token_conn_id
        )
        return with_token_digest(config, digest)

    def _absent_apps(self, hook: RayServeHook, names: list[str]) -> list[str]:
        """The apps this deploy creates (not on the cluster before its PUT); [] when that is unknown."""
        try:
            present = (hook.get_serve_details() or {}).get("applications") or {}
        except Exception as err:  # Serve not answering yet; without knowing, a kill deletes nothing
            self.log.info("Could not list Serve applications before deploying (%s)", err)
            return []
        return [n for n in names if n not in present]

    def on_kill(self) -> None:
        """Killed while waiting in the worker (not deferred): delete the apps this task created.

        Same rule as RayServeApplicationsTrigger.on_kill: only when every app on the cluster is one of them.
        """
        if not self._owned:
            return
        from tpuflow.serve.status import deletable_on_kill

        hook = self.hook()
        if deletable_on_kill(hook.get_serve_details(), self._owned):
            self.log.warning("Task killed: deleting Serve applications %s", self._owned)
            hook.delete_applications()


# Answers of an endpoint that is not serving the route yet (besides 5xx): asked again until the timeout.
_NOT_READY = (404, 408, 425, 429)


def _answer(text: str) -> JsonValue:
    """A passed smoke test's answer for XCom: the decoded JSON, or the text of an endpoint that is not JSON (its
    decode error must not read as "not answering yet": requests' JSONDecodeError is a RequestException)."""
    try:
        return cast("JsonValue", json.loads(text))
    except ValueError:
        return text


class ServeEndpointSmokeTestOperator(ArgumentChecks, BaseOperator):
    """POST a request to a deployed endpoint and check the answer contains what it should.

    An endpoint that is not answering yet (connection refused, a timeout, 404 before the route is
    published, 429, 5xx) is asked again for ``timeout`` seconds: proxies can accept traffic a moment
    after the app is RUNNING, and a replica's first request compiles its forward. An answer (200) without
    the expected text fails at once: asking again would only repeat it. Returns the endpoint's JSON answer.

    :param url: the endpoint, e.g. "{{ ti.xcom_pull(task_ids='deploy')['serve_url'] }}/app/v1/completions";
        templated.
    :param payload: the JSON body to POST; templated.
    :param expect: text the answer must contain; templated.
    :param timeout: seconds to keep asking an endpoint that does not answer yet.
    :param serve_token_conn_id: an Airflow Connection whose password is the endpoint's bearer token (the
        deploy task's): sent as ``Authorization: Bearer <token>``. A 401/403 answer fails at once.
    """

    template_fields: Sequence[str] = ("url", "payload", "expect")
    template_fields_renderers = {"payload": "json"}

    def __init__(
        self,
        *,
        url: str,
        payload: dict[str, Any],
        expect: str,
        timeout: float = 180.0,
        serve_token_conn_id: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.url = url
        self._url_source = cluster_source_task(url)  # the deploy task whose XCom the URL is templated from
        self.serve_token_conn_id = serve_token_conn_id
        self.payload = payload
        self.expect = expect
        self.timeout = timeout

    def argument_checks(self) -> list[ArgumentCheck]:
        return [
            *super().argument_checks(),
            ((), lambda: check_seconds("timeout", self.timeout)),  # never templated
            ((self.url,), self._check_url),
            ((self.expect,), self._check_expect),
            ((self.payload,), self._check_payload),
        ]

    def _check_url(self) -> None:
        if not (isinstance(self.url, str) and self.url.startswith(("http://", "https://"))):
            raise UserInputError("url", self.url, 'give the endpoint\'s http(s) URL, e.g. "http://host:8000/app"')

    def _check_expect(self) -> None:
        if self.expect is None or str(self.expect) == "":
            raise UserInputError("expect", self.expect, "give the text the answer must contain")

    def _check_payload(self) -> None:
        try:
            json.dumps(self.payload)
        except (TypeError, ValueError):
            raise UserInputError("payload", self.payload, "give a JSON-serialisable body") from None

    def execute(self, context: Context) -> JsonValue:
        import requests

        self.validate_arguments()
        if self.serve_token_conn_id:  # the token goes only to the endpoint the deploy task made
            check_url_of_source(self, self.url, self._url_source, context)
        headers = self._auth_headers()
        deadline = time.time() + self.timeout
        last = ""
        while True:
            try:
                resp = requests.post(self.url, json=self.payload, headers=headers, timeout=60)
                last = f"{resp.status_code}: {resp.text[:1000]}"
                if resp.status_code in (401, 403):
                    raise RayServeDeploymentFailedError(
                        f"endpoint {self.url} refused the request ({last[:200]}): "
                        + (
                            f"the token of connection {self.serve_token_conn_id!r} is not the deploy's"
                            if headers
                            else "it requires a bearer token; pass serve_token_conn_id"
                        )
                    )
                if resp.ok and str(self.expect) in resp.text:
                    self.log.info("Smoke test passed: %s -> %s", json.dumps(self.payload), resp.text[:500])
                    return _answer(resp.text)
                if resp.ok or (resp.status_code not in _NOT_READY and resp.status_code < 500):
                    raise RayServeDeploymentFailedError(
                        f"endpoint {self.url} answered {json.dumps(self.payload)} without {self.expect!r}: {last}"
                    )
                self.log.info("Endpoint not answering yet (%s); asking again", last[:200])
            except requests.RequestException as err:
                last = str(err)
                self.log.info("Endpoint not answering yet (%s); asking again", last[:200])
            if time.time() > deadline:
                raise RayServeDeploymentFailedError(
                    f"endpoint {self.url} did not answer with {self.expect!r} within {self.timeout:.0f}s; last: {last}"
                )
            time.sleep(2)

    def _auth_headers(self) -> dict[str, str]:
        if not self.serve_token_conn_id:
            return {}
        from tpuflow.serve.endpoint_token import bearer_header, serve_token

        return bearer_header(serve_token(self.serve_token_conn_id))
