"""The chip-hour ledger: per slice a run held, chips x (deleted - created), and how much of it trained.

A slice is billed from the moment its node pool starts being created until its delete finishes, so
GKE spans run from the CREATE_NODE_POOL operation's ``startTime`` to the DELETE_NODE_POOL
operation's ``endTime`` (GKE's own clock, not Airflow's). Local spans are the simulated cluster's
start and stop. Prices are optional and never guessed: a generation without a price gets no money.
Pure module.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from tpuflow.errors import UserInputError

LEDGER_TASK_ID = "chip_ledger"
PRICES_VARIABLE = "tpuflow_chip_hour_prices"
LEDGER_FILE = "ledger.json"


def rfc3339_to_unix(text: str) -> float:
    """GKE's ``2026-12-01T12:00:00.123456Z`` (or with an offset) as unix seconds."""
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def pool_span(operations: Iterable[Mapping[str, Any]], pool: str) -> tuple[float | None, float | None]:
    """(first create's start, last finished delete's end) of one node pool, from GKE operations (REST JSON).

    A create that ended in an error (a zone's stockout or quota: its TPU VMs never ran) bills nothing: a zone
    failover's slice is billed from the create that got its nodes, and a pool that never got any is not billed.
    """
    suffix = f"/nodePools/{pool}"
    created: float | None = None
    deleted: float | None = None
    for op in operations:
        if not str(op.get("targetLink", "")).endswith(suffix):
            continue
        kind = op.get("operationType", "")
        if kind == "CREATE_NODE_POOL" and op.get("startTime") and not op.get("error"):
            start = rfc3339_to_unix(op["startTime"])
            created = start if created is None else min(created, start)
        elif kind == "DELETE_NODE_POOL" and op.get("status") == "DONE" and op.get("endTime") and not op.get("error"):
            end = rfc3339_to_unix(op["endTime"])
            deleted = end if deleted is None else max(deleted, end)
    return created, deleted


def pool_ready(operations: Iterable[Mapping[str, Any]], pool: str) -> float | None:
    """When the node pool's latest create finished (its nodes ready), from GKE operations (REST JSON)."""
    suffix = f"/nodePools/{pool}"
    ends = [
        rfc3339_to_unix(op["endTime"])
        for op in operations
        if str(op.get("targetLink", "")).endswith(suffix)
        and op.get("operationType") == "CREATE_NODE_POOL"
        and op.get("status") == "DONE"
        and op.get("endTime")
        and not op.get("error")
    ]
    return max(ends, default=None)


def reclaimed_at(ready: float | None, deleted: float | None, max_run_s: float | None, now: float) -> float | None:
    """When GKE ended a pool's nodes at its ``maxRunDuration`` (NodeConfig: each node is deleted that long after
    it started), if that came before the pool's delete (``deleted`` None: not deleted by ``now``); None: it did
    not. The nodes started by the time the create finished (``ready``), so this never ends a bill early."""
    if ready is None or not max_run_s:
        return None
    at = ready + float(max_run_s)
    return at if at < (deleted if deleted is not None else now) else None


def slice_entry(
    role: str,
    generation: str,
    chips: int,
    created_at: float | None,
    deleted_at: float | None,
    *,
    pools: Iterable[str] = (),
    now: float | None = None,
    reclaimed: float | None = None,
) -> dict[str, Any]:
    """One slice's line of the ledger; a slice not yet deleted is billed up to ``now`` and marked open, one whose
    nodes GKE ended at its maxRunDuration (``reclaimed``, before its delete) up to then."""
    now = time.time() if now is None else now
    end = deleted_at if deleted_at is not None else now
    if reclaimed is not None:
        end = min(end, reclaimed)
    seconds = 0.0 if created_at is None else max(0.0, end - created_at)
    line = {
        "role": role,
        "generation": generation,
        "chips": int(chips),
        "pools": list(pools),
        "created_at": created_at,
        "deleted_at": deleted_at,
        "open": created_at is not None and deleted_at is None and reclaimed is None,
        "seconds": round(seconds, 3),
        "chip_hours": round(chips * seconds / 3600.0, 6),
    }
    if reclaimed is not None:
        line["reclaimed_at"] = reclaimed  # billed until then: GKE's maxRunDuration took the nodes, not a teardown
    return line


Price = float | dict[str, float]  # per chip-hour: one price, or per zone ("*": any other zone)


def _check_price(field: str, price: Any) -> float:
    if isinstance(price, bool) or not isinstance(price, int | float) or not math.isfinite(price) or price < 0:
        raise UserInputError(field, price, "give a price per chip-hour, a finite number >= 0")
    return float(price)


def check_prices(value: Any) -> dict[str, Price]:
    """The Variable ``tpuflow_chip_hour_prices``: JSON {generation: price per chip-hour}; a generation's price may be
    per zone, ``{"us-east5-b": 2.97, "*": 3.1}`` ("*": every other zone); empty: no prices. Each price is a finite
    number >= 0 (JSON's NaN and Infinity are not prices)."""
    from tpuflow.tpu import resolve_generation

    if value in (None, "", {}):
        return {}
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            raise UserInputError(
                PRICES_VARIABLE, value, 'give JSON like {"v6e": 2.97, "v5p": 4.2} (price per chip-hour)'
            ) from None
    if not isinstance(value, Mapping):
        raise UserInputError(PRICES_VARIABLE, value, 'give a JSON object like {"v6e": 2.97} (price per chip-hour)')
    prices: dict[str, Price] = {}
    for name, price in value.items():
        try:
            generation = resolve_generation(str(name)).name
        except UserInputError:
            raise UserInputError(PRICES_VARIABLE, name, "name a TPU generation (v4, v5e, v5p, v6e, tpu7x)") from None
        if isinstance(price, Mapping):
            prices[generation] = {
                str(zone): _check_price(f"{PRICES_VARIABLE}[{name}][{zone}]", p) for zone, p in price.items()
            }
        else:
            prices[generation] = _check_price(f"{PRICES_VARIABLE}[{name}]", price)
    return prices


def slice_price(prices: Mapping[str, Price], generation: str, zone: str | None) -> float | None:
    """The price per chip-hour of a slice of ``generation`` in ``zone`` (where it landed); None: none set."""
    price = prices.get(generation)
    if not isinstance(price, Mapping):
        return price
    return price.get(zone or "", price.get("*"))


def build_ledger(
    slices: list[dict[str, Any]],
    *,
    training_seconds: float | None = None,
    training_chips: int = 0,
    prices: Mapping[str, Price] | None = None,
    currency: str = "USD",
) -> dict[str, Any]:
    """The run's ledger: its slices, the total, the training part and (with prices) the money (a slice's price is
    its generation's in the zone it landed in, its ``zone``)."""
    billed = round(sum(s["chip_hours"] for s in slices), 6)
    training = round(training_chips * (training_seconds or 0.0) / 3600.0, 6)
    ledger: dict[str, Any] = {
        "slices": slices,
        "chip_hours": billed,
        "training_chip_hours": training,
        "training_seconds": training_seconds,
        # billed per chip-hour that trained: 1.0 means no chip idled
        "chip_hours_ratio": round(billed / training, 3) if training > 0 else None,
        "open": any(s["open"] for s in slices),
    }
    prices = dict(prices or {})
    if prices:
        priced = []
        for s in slices:
            price = slice_price(prices, s["generation"], s.get("zone"))
            if price is not None:
                s["cost"] = round(s["chip_hours"] * price, 4)
                priced.append(s)
        ledger["currency"] = currency
        # only when every slice has a price: a partial sum would look like the whole bill
        ledger["cost"] = round(sum(s["cost"] for s in priced), 4) if len(priced) == len(slices) else None
    return ledger
