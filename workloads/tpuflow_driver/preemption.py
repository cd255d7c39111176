"""A preemption notice, checked from a train loop: save once inside the notice, then take no further step.

Ray Train (2.60) already learns of a reclaim: a node drained with reason PREEMPTION and a deadline (what
`tpuflow local preempt --notice` does, and what the TPU worker pods' preStop hook does on GKE when a spot
VM gets its termination notice) reaches every worker through ``ray.train.get_preemption_info()``; at the
deadline Ray Train restarts the worker group from the latest reported checkpoint, counting it against
``FailureConfig.max_preemption_failures`` rather than ``max_failures``. What Ray leaves to the loop is
when to look and what to do, which is all this module is::

    from tpuflow_driver.preemption import PreemptionNotice

    def train_loop_per_worker(config):
        notice = PreemptionNotice()
        for step in range(start, num_steps):
            train_step()
            if notice.arrived():               # every worker, every step: a collective
                save_and_report_checkpoint()   # ray.train.report(..., checkpoint=...) on every worker
                notice.hold()                  # a step taken now would be computed again after the restart

``hold`` waits for the reclaim (Ray Train stops the worker at the deadline); if the worker is still alive
``grace_s`` after the deadline (a drain that never became a kill), it returns and training goes on.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

# Ray Train waits this long for a deadline-less notice (ray.train.v2 DEFAULT_PREEMPTION_DEADLINE_S)
NO_DEADLINE_S = 120.0


class PreemptionNotice:
    """Asks Ray Train for a preemption notice every ``every`` calls of `arrived`; says True once per attempt.

    ``ray.train.get_preemption_info`` is a barrier across the workers, so every worker must call `arrived`
    equally often: the decision it returns is the same on every worker, at the same step.
    """

    def __init__(
        self,
        every: int = 1,
        grace_s: float = 60.0,
        get_info: Callable[[], Any] | None = None,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if every < 1:
            raise ValueError(f"every must be >= 1, got {every}")
        self.every, self.grace_s = every, grace_s
        self._get_info, self._sleep, self._clock = get_info, sleep, clock
        self._calls = 0
        self.info: Any = None  # the PreemptionInfo, once one arrived

    def arrived(self) -> bool:
        if self.info is not None:
            return False
        self._calls += 1
        if self._calls % self.every:
            return False
        if self._get_info is None:
            import ray.train

            self._get_info = ray.train.get_preemption_info
        info = self._get_info()
        if info is None:
            return False
        self.info = info
        return True

    def seconds_left(self) -> float | None:
        """Seconds until the reclaim deadline (None: no notice, or one without a deadline)."""
        deadline_ms = getattr(self.info, "deadline_ms", None)
        return None if deadline_ms is None else deadline_ms / 1000.0 - self._clock()

    def hold(self) -> None:
        """Wait out the notice: Ray Train stops this worker at the deadline and restarts from the checkpoint."""
        left = self.seconds_left()
        until = self._clock() + (NO_DEADLINE_S if left is None else max(left, 0.0)) + self.grace_s
        while (remaining := until - self._clock()) > 0:
            self._sleep(min(remaining, 1.0))
