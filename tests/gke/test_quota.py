"""The GKE pipeline's check_params reads the project's TPU quota (Cloud Quotas API, through the real
client against the GKE stand-in) and refuses slices the quota can never hold before anything is created."""

from __future__ import annotations

from typing import Any

import pytest
from support.airflow_context import task_context
from support.gke_standin import CONN_ID, PROJECT, ZONE

from tpuflow.errors import UserInputError
from tpuflow.gke.quota import QuotaRef, quota_refs, quota_value
from tpuflow.pipeline.gke import CheckGkeParamsOperator

PREEMPTIBLE_V6E = "PREEMPTIBLE-TPU-V6E-per-project-region"
FAMILY = "TPUS-PER-TPU-FAMILY-per-project-region"
REGION = "us-east5"


def params(**overrides: Any) -> dict[str, Any]:
    from tpuflow.pipeline.gke import gke_pipeline_params

    return {**{name: p.value for name, p in gke_pipeline_params().items()}, **overrides}


def check(capacity: str = "on-demand", fallback: Any = (), **overrides: Any) -> tuple[dict[str, Any], list[str]]:
    op = CheckGkeParamsOperator(
        task_id="check_params", gcp_conn_id=CONN_ID, project_id=PROJECT, location=ZONE,
        capacity=capacity, fallback_capacity=fallback,
    )  # fmt: skip
    said: list[str] = []
    op.log.info = lambda msg, *args: said.append(msg % args if args else msg)  # type: ignore[method-assign]
    context = {**task_context(dag_id="tpu_llm_pipeline_gke", task_id="check_params"), "params": params(**overrides)}
    return op.execute(context), said


def test_slices_above_the_preemptible_quota_fail_naming_num_slices_before_any_pool(gke):
    gke.quotas.set(PREEMPTIBLE_V6E, 16, region=REGION)
    checked, said = check("spot", accelerator="TPU-V6E", topology="4x4", num_slices=1)
    assert checked["num_slices"] == 1 and any("holds one slice of 16 chips" in line for line in said)

    with pytest.raises(UserInputError) as err:
        check("spot", accelerator="TPU-V6E", topology="4x4", num_slices=2)
    message = str(err.value)
    assert message.startswith("params.num_slices=2 is invalid: the run needs 32 v6e chips at once (2 slices of 16")
    assert f"{PREEMPTIBLE_V6E} allows 16 (spot)" in message and "in us-east5" in message
    assert "\n" not in message
    assert gke.node_pools() == []
    quota_reads = {r["path"] for r in gke.requests if "quotaInfos" in r["path"]}
    assert quota_reads == {f"/v1/projects/{PROJECT}/locations/global/services/compute.googleapis.com/quotaInfos/"
                           f"{PREEMPTIBLE_V6E}"}  # fmt: skip


def test_on_demand_reads_the_family_quota_of_its_region_and_family(gke):
    gke.quotas.set(FAMILY, 16, region=REGION, tpu_family="CT6E")
    gke.quotas.set(FAMILY, 4096, region="us-central1", tpu_family="CT6E")  # another region's grant
    with pytest.raises(UserInputError, match=rf"{FAMILY} allows 16 \(on-demand\)"):
        check("on-demand", num_slices=2)
    # the serve slice is checked too: its shape alone above the quota
    gke.quotas.set(FAMILY, 8, region=REGION, tpu_family="CT6E")
    with pytest.raises(UserInputError, match=r"^params.topology='4x4' is invalid: the run needs 16 v6e chips"):
        check("on-demand", num_slices=1)


def test_a_fallback_or_the_standard_quota_with_room_is_enough(gke):
    gke.quotas.set(PREEMPTIBLE_V6E, 0)  # every region
    gke.quotas.set(FAMILY, 64, region=REGION, tpu_family="CT6E")
    # flex-start spends the preemptible quota, or the standard one when that has no room
    check("flex-start", num_slices=2)
    # spot alone cannot; spot falling back to on-demand can
    with pytest.raises(UserInputError, match=r"PREEMPTIBLE-TPU-V6E-per-project-region allows 0 \(spot\)"):
        check("spot", num_slices=2)
    _, said = check("spot", ["on-demand"], num_slices=2)
    assert any("on-demand capacity holds 2 slices of 16 chips" in line for line in said)
    # a reservation spends no quota
    check("reservation:my-res", num_slices=4)


def test_a_quota_the_api_does_not_have_is_left_to_gke(gke):
    _, said = check("on-demand", accelerator="TPU-V5P", topology="2x2x2", num_slices=1)
    assert any("not checked" in line for line in said)


def test_without_a_project_nothing_is_read(gke):
    op = CheckGkeParamsOperator(task_id="check_params", gcp_conn_id=CONN_ID, project_id="", location=ZONE)
    op.execute({**task_context(task_id="check_params"), "params": params(num_slices=2)})
    assert not [r for r in gke.requests if "quotaInfos" in r["path"]]


def test_the_most_specific_entry_gives_the_limit():
    from google.cloud import cloudquotas_v1 as q

    def entry(value: int, **dims: str) -> Any:
        return q.DimensionsInfo(dimensions=dims, details=q.QuotaDetails(value=value))

    info = q.QuotaInfo(
        dimensions_infos=[entry(1536), entry(32, region="us-east5"), entry(8, region="us-east5", tpu_family="CT6E")]
    )
    assert quota_value(info, "us-east5", "CT6E") == 8
    assert quota_value(info, "us-east5", "TPU7X") == 32
    assert quota_value(info, "europe-west4", None) == 1536
    assert quota_value(q.QuotaInfo(dimensions_infos=[entry(32, region="us-east5")]), "us-east1", None) is None
    assert quota_refs("v6e", "reservation") == ()
    assert quota_refs("v6e", "spot") == (QuotaRef(PREEMPTIBLE_V6E),)
    assert quota_refs("v5p", "on-demand") == (None,)
