"""An optional bearer token on a Serve endpoint, checked by the application itself.

The application receives the token's SHA-256 digest (hex) in its args, never the token: a Serve config
is readable by anyone who can read the Ray dashboard or the RayService object. A request passes when its
``Authorization: Bearer <token>`` header hashes to that digest; the digests are compared in constant time
(hmac.compare_digest). No digest configured: every request passes (the endpoint is open, as before).
"""

from __future__ import annotations

import hashlib
import hmac
import re

ARG = "token_sha256"  # the application arg that carries the digest
_DIGEST_RE = re.compile(r"^[0-9a-f]{64}$")
CHALLENGE = {"WWW-Authenticate": 'Bearer realm="tpuflow-serve"'}


def token_digest(token: str) -> str:
    """The hex SHA-256 digest of ``token`` (what the application's args carry)."""
    return hashlib.sha256(token.encode()).hexdigest()


def checked_digest(value: object) -> str | None:
    """``value`` as a digest arg (None: no token required); ValueError names the arg on anything else."""
    if value is None or value == "":
        return None
    if not isinstance(value, str) or not _DIGEST_RE.match(value):
        raise ValueError(f"args.{ARG} must be the hex SHA-256 digest of the token (64 hex digits), not the token")
    return value


def authorized(authorization: str | None, digest: str | None) -> bool:
    """Whether a request with this ``Authorization`` header may use an endpoint guarded by ``digest``."""
    if digest is None:
        return True
    scheme, _, presented = (authorization or "").partition(" ")
    if scheme.lower() != "bearer" or not presented.strip():
        return False
    return hmac.compare_digest(token_digest(presented.strip()), digest)
