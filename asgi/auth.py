"""Bearer-key authentication. The key comes from TINYLOOP_API_KEY, else from a key file
generated once with mode 0600 in the state directory. The key is never logged."""
from __future__ import annotations

import hmac
import os
import secrets
from pathlib import Path

KEY_FILE = "api-key"


def load_or_create_key(state_dir: Path) -> tuple[str, Path]:
    """The key in state_dir/api-key, created (0600, directory 0700) if absent."""
    state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = state_dir / KEY_FILE
    try:
        key = path.read_text().strip()
        if key:
            return key, path
    except FileNotFoundError:
        pass
    key = "tl-" + secrets.token_urlsafe(32)
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
    fd = os.open(path, flags, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(key + "\n")
    os.chmod(path, 0o600)
    return key, path


def authorized(headers: list, key: str) -> bool:
    for name, value in headers:
        if name == b"authorization":
            scheme, _, token = value.decode("latin-1").partition(" ")
            return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), key.encode())
    return False
