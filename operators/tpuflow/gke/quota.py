"""Does the project's TPU quota hold the run's slices? Asked before anything billable is created.

GKE TPU node pools spend Compute Engine chip quotas, per region. For current generations they are
only in the Cloud Quotas API (the regional quota view of ``compute regions describe`` lists v5e's
alone): v6e spends ``PREEMPTIBLE-TPU-V6E-per-project-region`` when spot, and flex-start and queued
capacity spend it too, falling back to the standard quota when it has no room (Compute's provisioning
models page); on-demand v6e and tpu7x spend the family quota ``TPUS-PER-TPU-FAMILY-per-project-region``
(dimensions ``region`` and ``tpu_family``); v5e has its own pair. Reservations are already paid for.

Only limits are compared (Cloud Quotas reports no usage): slices that together need more chips than
the limit can never be created, and without this check the first slice's pool would be created and
billed before GKE refused the second. Chips other pools already use are GKE's to refuse at create time
(tpuflow.gke.errors, QUOTA). A quota this table does not name, one the API does not have (404), or
one with no value for the region, is not checked here: an unknown id can only weaken the check, never
block a run.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from tpuflow.errors import UserInputError


@dataclass(frozen=True)
class QuotaRef:
    quota_id: str
    tpu_family: str | None = None  # the family quota's tpu_family dimension


_FAMILY = "TPUS-PER-TPU-FAMILY-per-project-region"
STANDARD_QUOTAS: dict[str, QuotaRef] = {
    "v5e": QuotaRef("TPU-LITE-PODSLICE-V5-per-project-region"),
    "v6e": QuotaRef(_FAMILY, "CT6E"),
    "tpu7x": QuotaRef(_FAMILY, "TPU7X"),
}
PREEMPTIBLE_QUOTAS: dict[str, QuotaRef] = {
    "v5e": QuotaRef("PREEMPTIBLE-TPU-LITE-PODSLICE-V5-per-project-region"),
    "v6e": QuotaRef("PREEMPTIBLE-TPU-V6E-per-project-region"),
}


def quota_refs(generation: str, capacity_kind: str) -> tuple[QuotaRef | None, ...]:
    """The quotas a pool of this capacity may spend, any one with room being enough; None: a quota
    this table does not know (the capacity is then not checked). Empty: no quota is spent."""
    if capacity_kind == "reservation":
        return ()
    standard = STANDARD_QUOTAS.get(generation)
    preemptible = PREEMPTIBLE_QUOTAS.get(generation)
    if capacity_kind == "spot":
        return (preemptible,)
    if capacity_kind in ("flex-start", "queued"):
        return (preemptible, standard)
    return (standard,)


def quota_value(info: Any, region: str, tpu_family: str | None) -> int | None:
    """The limit a QuotaInfo gives this region (and family): the most specific entry that matches,
    the entry without dimensions being every region's default. None: no entry applies."""
    wanted = {"region": region, **({"tpu_family": tpu_family} if tpu_family else {})}
    best: tuple[int, int] | None = None
    for entry in info.dimensions_infos:
        dims = dict(entry.dimensions)
        if all(wanted.get(k) == v for k, v in dims.items()):
            if best is None or len(dims) > best[0]:
                best = (len(dims), int(entry.details.value))
    return None if best is None else best[1]


@dataclass(frozen=True)
class QuotaNeed:
    """Chips the run holds at once on one slice shape, and the Param that sets how many."""

    generation: str
    chips: int
    what: str  # e.g. "2 slices of 16 chips (v6e 4x4)"
    field_name: str
    value: Any


def check_tpu_quota(
    get_info: Callable[[str], Any],
    *,
    region: str,
    needs: Sequence[QuotaNeed],
    capacities: Sequence[Any],
    say: Callable[[str], None] = print,
) -> None:
    """Raise UserInputError when, for every capacity the run may fall back to, each quota that capacity
    may spend is known and smaller than what one need asks for. ``get_info(quota_id)``: a QuotaInfo or None."""
    infos: dict[str, Any] = {}

    def limit(ref: QuotaRef) -> int | None:
        if ref.quota_id not in infos:
            infos[ref.quota_id] = get_info(ref.quota_id)
        info = infos[ref.quota_id]
        return None if info is None else quota_value(info, region, ref.tpu_family)

    for need in needs:
        short: list[str] = []
        fits = False
        for capacity in capacities:
            refs = quota_refs(need.generation, capacity.kind)
            limits = [(ref, limit(ref) if ref else None) for ref in refs]
            if not refs or any(value is None for _, value in limits):
                unknown = ", ".join(ref.quota_id if ref else f"(no quota id known for {need.generation})"
                                    for ref, value in limits if value is None)  # fmt: skip
                say(f"TPU quota for {capacity} capacity: not checked ({unknown or 'none spent'}); GKE enforces it")
                fits = True
                break
            if any(value >= need.chips for _, value in limits if value is not None):
                say(f"TPU quota for {capacity} capacity holds {need.what} in {region}")
                fits = True
                break
            short += [f"{ref.quota_id} allows {value} ({capacity})" for ref, value in limits if ref]
        if not fits:
            raise UserInputError(
                need.field_name,
                need.value,
                f"the run needs {need.chips} {need.generation} chips at once ({need.what}) in {region}, but "
                + "; ".join(short)
                + ": ask for fewer slices or a smaller topology, or request more quota "
                "(gcloud quotas preferences create --service=compute.googleapis.com --quota-id=...)",
            )


def run_quota_needs(train: dict[str, Any], serve: dict[str, Any] | None) -> list[QuotaNeed]:
    """What the GKE pipeline holds at once: the training slices together, then the serve slice
    (created after training, when the training slices are being deleted)."""
    n = int(train.get("num_slices", 1))
    shape = f"{train['generation']} {train['topology']}"
    needs = [
        QuotaNeed(
            train["generation"],
            int(train["chips"]) * n,
            f"{n} slices of {train['chips']} chips, {shape}"
            if n > 1
            else f"one slice of {train['chips']} chips, {shape}",
            "params.num_slices" if n > 1 else "params.topology",
            n if n > 1 else train["topology"],
        )
    ]
    if serve:
        needs.append(
            QuotaNeed(
                serve["generation"],
                int(serve["chips"]),
                f"the serve slice of {serve['chips']} chips, {serve['generation']} {serve['topology']}",
                "params.serve_topology",
                serve["topology"],
            )
        )
    return needs
