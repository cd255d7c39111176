"""Files that hold a secret (a password, a token, a signing key): private from the first byte.

``write_secret_file`` creates the file 0600 through ``os.open(..., O_CREAT | O_EXCL, 0o600)`` under a fresh
temporary name in the same folder and renames it over the target, so no reader ever sees it with wider
permissions or half written (a chmod after the write leaves a window in which others can read it), and
an existing file is replaced atomically. The folder it lands in is made 0700. Pure module: stdlib only.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

SECRET_FILE_MODE = 0o600
SECRET_DIR_MODE = 0o700


def private_dir(path: Path | str) -> Path:
    """``path`` as a folder only its owner can enter (created, with missing parents, if needed).

    Missing parents are created 0700; parents that exist are left as they are."""
    folder = Path(path)
    # Missing parents too are made here (mkdir(parents=True) would give them the umask's mode); mkdir's
    # mode is masked by the umask, which can only take bits away from 0700: never wider.
    for missing in reversed([folder, *folder.parents]):
        if not missing.exists():
            missing.mkdir(mode=SECRET_DIR_MODE, exist_ok=True)
    info = folder.stat()
    # A folder someone else owns (a shared /tmp) cannot be narrowed; the file itself stays 0600.
    if info.st_mode & 0o777 != SECRET_DIR_MODE and info.st_uid == os.getuid():
        folder.chmod(SECRET_DIR_MODE)
    return folder


def write_secret_file(path: Path | str, data: str | bytes) -> Path:
    """Write ``data`` to ``path``, mode 0600 in a 0700 folder, replacing any file there atomically."""
    target = Path(path)
    private_dir(target.parent)
    payload = data.encode() if isinstance(data, str) else data
    tmp = target.with_name(f".{target.name}.{secrets.token_hex(6)}.tmp")
    fd = os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY | getattr(os, "O_NOFOLLOW", 0), SECRET_FILE_MODE)
    try:
        os.fchmod(fd, SECRET_FILE_MODE)  # exactly 0600 whatever the umask (it can only narrow it)
        with os.fdopen(fd, "wb") as f:
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return target
