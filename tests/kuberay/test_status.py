"""KubeRay status semantics: ready / failed(reason) / waiting(why), per ../shared/kuberay/README.md."""

from __future__ import annotations

from typing import Any

from tpuflow.kuberay.status import raycluster_verdict, rayservice_verdict, stuck_service_diagnosis


def cond(ctype: str, status: bool, reason: str = "", message: str = "") -> dict[str, Any]:
    return {"type": ctype, "status": "True" if status else "False", "reason": reason, "message": message}


def raycluster(status: dict[str, Any] | None, generation: int = 1) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "metadata": {"name": "rc", "generation": generation},
        "spec": {"workerGroupSpecs": [{"replicas": 2, "numOfHosts": 4}]},
    }
    if status is not None:
        obj["status"] = status
    return obj


def ready_status(ready_workers: int = 8, **extra: Any) -> dict[str, Any]:
    return {
        "conditions": [
            cond("RayClusterProvisioned", True, "AllPodRunningAndReadyFirstTime"),
            cond("HeadPodReady", True, "HeadPodRunningAndReady"),
        ],
        "desiredWorkerReplicas": 8,
        "readyWorkerReplicas": ready_workers,
        "observedGeneration": 1,
        **extra,
    }


def test_cluster_without_status_waits_and_suspects_the_operator() -> None:
    verdict = raycluster_verdict(raycluster(None))
    assert verdict.state == "waiting" and "operator" in verdict.reason


def test_cluster_ready_needs_both_conditions_and_all_worker_hosts() -> None:
    assert raycluster_verdict(raycluster(ready_status())).ready
    provisioning = ready_status(0)
    provisioning["conditions"][0] = cond("RayClusterProvisioned", False, "RayClusterPodsProvisioning")
    verdict = raycluster_verdict(raycluster(provisioning))
    assert verdict.state == "waiting" and "RayClusterPodsProvisioning" in verdict.reason and "0/8" in verdict.reason


def test_conditions_stay_true_but_lost_workers_mean_not_ready() -> None:
    verdict = raycluster_verdict(raycluster(ready_status(6)))
    assert verdict.state == "waiting" and "6/8 worker pods ready" in verdict.reason


def test_desired_workers_default_to_replicas_times_hosts() -> None:
    status = ready_status(7)
    del status["desiredWorkerReplicas"]
    assert "7/8" in raycluster_verdict(raycluster(status)).reason


def test_replica_failure_and_suspension_fail() -> None:
    failing = ready_status(0)
    failing["conditions"].append(cond("ReplicaFailure", True, "FailedCreateWorkerPod", "pods forbidden: quota"))
    verdict = raycluster_verdict(raycluster(failing))
    assert verdict.failed and "FailedCreateWorkerPod" in verdict.reason and "quota" in verdict.reason
    assert raycluster_verdict(raycluster(ready_status(conditions=[cond("RayClusterSuspended", True)]))).failed


def test_stale_observed_generation_waits() -> None:
    verdict = raycluster_verdict(raycluster(ready_status(), generation=2))
    assert verdict.state == "waiting" and "generation 2" in verdict.reason


def test_legacy_state_ready_without_conditions() -> None:
    assert raycluster_verdict(
        raycluster({"state": "ready", "desiredWorkerReplicas": 8, "readyWorkerReplicas": 8})
    ).ready
    assert raycluster_verdict(raycluster({"state": "failed", "reason": "head pod crashed"})).failed


def service(
    apps: dict[str, Any] | None = None,
    ready: bool = True,
    endpoints: int = 1,
    reason: str = "",
    active: str = "svc-raycluster-abcde",
    message: str = "",
) -> dict[str, Any]:
    status: dict[str, Any] = {
        "conditions": [cond("Ready", ready, reason or ("NonZeroServeEndpoints" if ready else "Initializing"), message)],
        "numServeEndpoints": endpoints,
        "observedGeneration": 1,
        "activeServiceStatus": {"rayClusterName": active, "applicationStatuses": apps or {}} if active else {},
    }
    if not active:
        status["pendingServiceStatus"] = {"rayClusterName": "svc-raycluster-abcde"}
    return {"metadata": {"name": "svc", "generation": 1}, "status": status}


def app(status: str, message: str = "", **deployments: tuple[str, str]) -> dict[str, Any]:
    return {
        "status": status,
        "message": message,
        "serveDeploymentStatuses": {d: {"status": s, "message": m} for d, (s, m) in deployments.items()},
    }


def test_service_ready_needs_ready_condition_running_apps_and_endpoints() -> None:
    running = {"llm": app("RUNNING", LLMServer=("HEALTHY", ""))}
    assert rayservice_verdict(service(running)).ready
    assert not rayservice_verdict(service(running, endpoints=0)).ready
    assert not rayservice_verdict(service(running, ready=False)).ready
    both = {"llm": app("RUNNING"), "embed": app("DEPLOYING", LLMServer=("UPDATING", ""))}
    verdict = rayservice_verdict(service(both))
    assert verdict.state == "waiting" and "'embed' is DEPLOYING" in verdict.reason


def test_service_mid_upgrade_waits_for_its_pending_cluster() -> None:
    """KubeRay's UpgradeInProgress (both an active and a pending cluster, as ray-operator v1.6.0 sets it): the
    active cluster still answers with the old spec, so the deploy is not done."""
    running = service({"llm": app("RUNNING")})
    running["status"]["pendingServiceStatus"] = {"rayClusterName": "svc-raycluster-fghij"}
    running["status"]["conditions"].append(cond("UpgradeInProgress", True, "BothActivePendingClustersExist", ""))
    verdict = rayservice_verdict(running)
    assert verdict.state == "waiting" and "svc-raycluster-fghij is to replace svc-raycluster-abcde" in verdict.reason
    running["status"]["conditions"][-1] = cond("UpgradeInProgress", False, "NoPendingCluster", "")
    del running["status"]["pendingServiceStatus"]
    assert rayservice_verdict(running).ready


def test_service_waiting_for_its_cluster_says_so() -> None:
    verdict = rayservice_verdict(service(active="", ready=False, endpoints=0))
    assert verdict.state == "waiting" and "svc-raycluster-abcde is not ready" in verdict.reason


def test_deploy_failed_and_unhealthy_fail_fast_naming_app_and_deployment() -> None:
    failed = rayservice_verdict(
        service(
            {
                "llm": app(
                    "DEPLOY_FAILED",
                    "ImportError: no module named serve_app",
                    LLMServer=("DEPLOY_FAILED", "replica crashed"),
                )
            },
            ready=False,
        )
    )
    assert failed.failed and "'llm' is DEPLOY_FAILED" in failed.reason and "ImportError" in failed.reason
    assert "'LLMServer'" in failed.reason
    assert rayservice_verdict(service({"llm": app("UNHEALTHY", LLMServer=("UNHEALTHY", "health check"))})).failed


def test_terminal_ready_reasons_fail() -> None:
    verdict = rayservice_verdict(service(ready=False, reason="ValidationFailed", message="serveConfigV2 is invalid"))
    assert verdict.failed and "serveConfigV2 is invalid" in verdict.reason
    assert rayservice_verdict(service(ready=False, reason="InitializingTimeout")).failed


def test_stuck_diagnosis_names_the_deployment_and_the_likely_cause() -> None:
    scheduling = (
        "Deployment 'LLMServer' in application 'llm' has 1 replicas that have taken more than 30s to be "
        "scheduled. Resources required for each replica: {'TPU': 4}"
    )
    stuck = service({"llm": app("DEPLOYING", LLMServer=("UPDATING", scheduling))}, ready=False, endpoints=0)
    text = stuck_service_diagnosis(stuck)
    assert "deployment 'LLMServer' of application 'llm' is UPDATING" in text
    assert "accelerator_config" in text and "topology" in text
    silent = service({"llm": app("DEPLOYING", LLMServer=("UPDATING", ""))}, ready=False, endpoints=0)
    assert "straddle slices" in stuck_service_diagnosis(silent)
    no_cluster = stuck_service_diagnosis(service(active="", ready=False, endpoints=0), "RayCluster x: 0/4 ready")
    assert "never became ready" in no_cluster and "0/4" in no_cluster


def test_first_deploy_reports_the_pending_clusters_applications() -> None:
    obj = {
        "metadata": {"name": "svc", "generation": 1},
        "status": {
            "conditions": [cond("Ready", False, "Initializing")],
            "numServeEndpoints": 0,
            "observedGeneration": 1,
            "pendingServiceStatus": {
                "rayClusterName": "svc-raycluster-x",
                "applicationStatuses": {
                    "llm": app("DEPLOYING", LLMServer=("UPDATING", "Resources required for each replica: {'TPU': 8}"))
                },
            },
        },
    }
    verdict = rayservice_verdict(obj)
    assert verdict.state == "waiting" and "'llm' is DEPLOYING" in verdict.reason
    assert "deployment 'LLMServer' of application 'llm'" in stuck_service_diagnosis(obj)
