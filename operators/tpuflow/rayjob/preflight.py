"""The slice preflight as a task: a short Ray job (tpuflow_driver.preflight) right before training.

It reserves the training slice(s) with slice_placement_group, places one actor per host and runs
one all-reduce across them with a deadline of seconds. A slice whose hosts cannot reach each other
fails this task, naming the hosts, instead of hanging training's first collective while it bills.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from tpuflow.arguments import ArgumentCheck
from tpuflow.errors import UserInputError
from tpuflow.rayjob.operators import RaySubmitJobOperator
from tpuflow.rayjob.workload_operators import ray_slice
from tpuflow.templating import is_true

if TYPE_CHECKING:
    from airflow.sdk import Context

    from tpuflow.tpu import TpuSlice
    from tpuflow.tpu.slice_argument import SliceArgument

COLLECTIVES = ("jax", "tcp")
# The workload's failure line (tpuflow_driver.preflight.FAILED_MARKER): the task fails with it alone.
FAILED_MARKER = "TPUFLOW_PREFLIGHT_FAILED"


class RaySlicePreflightOperator(RaySubmitJobOperator):
    """Check that every host of the slice(s) answers and that one all-reduce over them gives the
    expected sum, within ``deadline_s`` per step, before training starts.

    Everything else (identity, re-attach, log streaming, kill) is RaySubmitJobOperator's; its
    arguments apply here too, except ``entrypoint``, which this builds. A failed preflight fails
    the task without retries, with one line naming the hosts that did not answer.

    :param tpu_slice: the slice(s) to check (tpuflow.tpu.slice_argument): a TpuSlice
        (``TpuSlice.from_spec("v6e", "4x4")``), its ``to_dict()``, or ``{"accelerator": "TPU-V6E", "topology":
        "4x4", "machine_type"?, "num_slices"?}`` whose values may be templates; its ``num_slices`` identical
        slices are reserved together; templated.
    :param deadline_s: seconds for each step (reservation, roll call, all-reduce).
    :param collective: "jax" (jax.distributed and one jitted sum over every device: what training
        runs first) or "tcp" (the roll call's gather-sum alone, no JAX).
    :param enabled: false (False, "false", "0", "no", "") skips the check and returns ``{"skipped": True}``;
        templated, e.g. "{{ params.preflight }}".
    """

    work_cause = "preflight"
    template_fields: Sequence[str] = (
        *RaySubmitJobOperator.template_fields,
        "tpu_slice",
        "enabled",
    )

    def __init__(
        self,
        *,
        tpu_slice: SliceArgument,
        deadline_s: float = 30.0,
        collective: str = "jax",
        enabled: Any = True,
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("retries", 0)
        super().__init__(**kwargs)
        self.tpu_slice = tpu_slice
        self.deadline_s = deadline_s
        self.collective = collective
        self.enabled = enabled

    def argument_checks(self) -> list[ArgumentCheck]:
        return [
            *super().argument_checks(),
            ((), self._check_deadline_and_collective),  # never templated
            ((self.enabled,), self._check_enabled),
            ((self.tpu_slice,), self._tpu_slice),
        ]

    def _check_deadline_and_collective(self) -> None:
        if (
            isinstance(self.deadline_s, bool)
            or not isinstance(self.deadline_s, int | float)
            or not (1 <= self.deadline_s <= 600)
        ):
            raise UserInputError("deadline_s", self.deadline_s, "give the seconds each step may take, 1 to 600")
        if self.collective not in COLLECTIVES:
            raise UserInputError("collective", self.collective, f"use one of {', '.join(COLLECTIVES)}")

    def _check_enabled(self) -> None:
        if not isinstance(self.enabled, bool | str | int | None):
            raise UserInputError("enabled", self.enabled, "give true or false")

    def _tpu_slice(self) -> TpuSlice:

        return ray_slice(self.tpu_slice)

    def build_spec(self) -> dict[str, Any]:
        return {
            **self._tpu_slice().slice_placement_group_kwargs(),
            "deadline_s": float(self.deadline_s),
            "collective": self.collective,
        }

    def build_entrypoint(self, context: Context) -> list[str]:
        return ["python", "-m", "tpuflow_driver.preflight", "--spec-json", json.dumps(self.build_spec())]

    def build_runtime_env(self) -> dict[str, Any]:
        env = super().build_runtime_env()
        if self._cluster_info().get("backend") == "local":  # simulated hosts run JAX on CPU
            env["env_vars"] = {"JAX_PLATFORMS": "cpu", **env.get("env_vars", {})}
        return env

    def _execute_checked(self, context: Context) -> Any:
        """The job, unless ``enabled`` rendered false (a bad argument fails the task either way)."""
        if not is_true(self.enabled):
            self.log.info("Slice preflight turned off (enabled=%r): training starts unchecked", self.enabled)
            return {"skipped": True}
        return super()._execute_checked(context)

    def execute_complete(self, context: Context, event: dict[str, Any]) -> Any:
        from airflow.sdk.exceptions import AirflowException, AirflowFailException

        try:
            return super().execute_complete(context, event)
        except AirflowException:
            why = failure_line(event)
            if why is None:
                raise
            # A retry would find the same hosts silent: fail at once, with the one line that names them.
            raise AirflowFailException(f"slice preflight failed: {why}") from None


def failure_line(event: Any) -> str | None:
    """The workload's own reason (its TPUFLOW_PREFLIGHT_FAILED line) in a failed job's log tail."""
    if not isinstance(event, Mapping):
        return None
    for line in reversed(str(event.get("log_tail") or "").splitlines()):
        if line.startswith(FAILED_MARKER + " "):
            return line[len(FAILED_MARKER) + 1 :]
    return None
