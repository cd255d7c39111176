"""Reading a Ray head's Prometheus exposition for the idle watch: no credential sent, bounded in size and time.

Ray's metrics exporter (``--metrics-export-port``; 8080 on KubeRay) takes no token, so the read carries none:
the cluster's bearer token goes to its dashboard only, never to the metrics URL. The answer is read in chunks,
Serve's ``ray_serve_num_*`` lines kept and the rest dropped as it arrives; more than ``max_bytes`` in all, or a
read that takes more than ``timeout`` seconds of wall clock (a trickling answer resets no per-chunk timer),
ends the read with ``MetricsReadError``, which the watch counts as unreadable metrics.
"""

from __future__ import annotations

import asyncio

from tpuflow.serve.idle import SERVE_PREFIX

MAX_METRICS_BYTES = 32 * 1024 * 1024  # a head's exposition is a few hundred kB; a big cluster's a few MB
METRICS_TIMEOUT_S = 10.0
_CHUNK = 64 * 1024


class MetricsReadError(RuntimeError):
    """The metrics answer was not a readable exposition: not 200, too large, or too slow."""


class ServeMetricsReader:
    """Reads ``metrics_url`` (the hook resolves it from the cluster info or the ``ray`` connection)."""

    def __init__(self, metrics_url: str, *, timeout: float = METRICS_TIMEOUT_S, max_bytes: int = MAX_METRICS_BYTES):
        self.metrics_url = metrics_url
        self.timeout = timeout
        self.max_bytes = max_bytes

    async def aread_metrics(self) -> str:
        """Serve's lines of the exposition (``MetricsReadError`` when the answer is unusable)."""
        try:
            async with asyncio.timeout(self.timeout):
                return await self._read()
        except TimeoutError:
            raise MetricsReadError(f"no whole answer from {self.metrics_url} within {self.timeout:g} s") from None

    async def _read(self) -> str:
        import aiohttp

        # a session of its own, without the hook's headers: no Authorization, no cookies, no redirects; and no
        # compression, so the bytes counted are the bytes held (prometheus_client answers plain unless asked)
        async with aiohttp.ClientSession(auto_decompress=False) as session:
            async with session.get(
                self.metrics_url, allow_redirects=False, headers={"Accept-Encoding": "identity"}
            ) as resp:
                if resp.status != 200:
                    raise MetricsReadError(f"{self.metrics_url} answered {resp.status} {resp.reason or ''}".strip())
                if resp.headers.get("Content-Encoding", "identity").lower() != "identity":
                    raise MetricsReadError(f"{self.metrics_url} answered {resp.headers['Content-Encoding']}-encoded")
                kept: list[bytes] = []
                total, pending = 0, bytearray()  # pending: the line not ended yet
                async for chunk in resp.content.iter_chunked(_CHUNK):
                    total += len(chunk)
                    if total > self.max_bytes:
                        raise MetricsReadError(
                            f"the answer of {self.metrics_url} is over {self.max_bytes} bytes; read no further"
                        )
                    end = chunk.rfind(b"\n")  # only the new bytes are searched: no rescan of a long line
                    if end < 0:
                        pending += chunk
                        continue
                    kept.extend(_serve_lines(bytes(pending) + chunk[:end]))
                    pending = bytearray(chunk[end + 1 :])
                kept.extend(_serve_lines(bytes(pending)))
        return b"\n".join(kept).decode("utf-8", errors="replace") + "\n"


def _serve_lines(text: bytes) -> list[bytes]:
    prefix = SERVE_PREFIX.encode()
    return [line for line in text.split(b"\n") if line.startswith(prefix)]
