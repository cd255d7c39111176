"""How often a wait looks again: soon at first, then every ``poll_interval``.

Many waits end seconds after they start (a RayCluster whose pods stop at once, a node pool operation GKE finishes
quickly, an object already in the state asked for), others take minutes (a TPU slice's create). A fixed interval
makes the first kind last a whole interval; polling fast throughout makes the second kind cost many reads. The
looks come 1, 2, 4, ... seconds apart, doubling until ``poll_interval``: a few more reads for a long wait, and a
short one ends within about twice its own length.
"""

from __future__ import annotations

from collections.abc import Iterator

FIRST_LOOK_S = 1.0


def poll_delays(poll_interval: float) -> Iterator[float]:
    """The delays between looks: ``FIRST_LOOK_S``, then doubling, never above ``poll_interval``."""
    delay = min(FIRST_LOOK_S, poll_interval)
    while True:
        yield delay
        delay = min(delay * 2, poll_interval)
