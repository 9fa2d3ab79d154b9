"""Bearer-key authentication. The key comes from TINYLOOP_API_KEY, else from a key file
generated once with mode 0600 in the state directory. The key is never logged.

A key file that cannot be read, or that group or others may read (a key others can read
is not a secret), or a state directory where the key cannot be written, stops the
server at startup with a KeyFileError saying which and what to do."""
from __future__ import annotations

import hmac
import os
import secrets
import stat
from pathlib import Path

from tinyloop.errors import TinyLoopError

KEY_FILE = "api-key"


class KeyFileError(TinyLoopError):
    """The API key file or its directory is unusable; the server refuses to start."""


def load_or_create_key(state_dir: Path) -> tuple[str, Path]:
    """The key in state_dir/api-key, created (0600, directory 0700) if absent."""
    path = state_dir / KEY_FILE
    try:
        state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError as exc:
        raise KeyFileError(f"cannot create the state directory {state_dir} for the API key file: "
                           f"{exc.strerror or exc}; set TINYLOOP_STATE_DIR to a writable directory "
                           "or TINYLOOP_API_KEY") from None
    key = _read_key(path)
    if key:
        return key, path
    key = "tl-" + secrets.token_urlsafe(32)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(key + "\n")
        os.chmod(path, 0o600)
    except OSError as exc:
        raise KeyFileError(f"cannot write the API key file {path}: {exc.strerror or exc}; the state "
                           "directory must be writable (set TINYLOOP_STATE_DIR, or TINYLOOP_API_KEY)") from None
    return key, path


def _read_key(path: Path) -> str | None:
    """The key stored at path ("" or None: none yet); KeyFileError if unusable."""
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise KeyFileError(f"cannot read the API key file {path}: {exc.strerror or exc}") from None
    if not stat.S_ISREG(mode):
        raise KeyFileError(f"the API key file {path} is not a regular file; remove it (a new key is "
                           "generated) or set TINYLOOP_API_KEY")
    if mode & 0o077:
        raise KeyFileError(f"the API key file {path} is readable by others (mode {stat.S_IMODE(mode):04o}): "
                           f"a key others can read is not a secret; run `chmod 600 {path}` (and rotate "
                           "the key if others may have read it)")
    try:
        return path.read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise KeyFileError(f"cannot read the API key file {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise KeyFileError(f"the API key file {path} is not UTF-8 text; remove it (a new key is "
                           "generated) or set TINYLOOP_API_KEY") from None


def authorized(headers: list, key: str) -> bool:
    """Whether the Authorization header carries the key; compared in constant time
    (hmac.compare_digest), so the time taken does not reveal how much of a guess matched."""
    for name, value in headers:
        if name == b"authorization":
            scheme, _, token = value.decode("latin-1").partition(" ")
            return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), key.encode())
    return False


def x_api_key(headers: list) -> bytes | None:
    """The `x-api-key` header's value (how the Anthropic SDK sends its key), or None."""
    for name, value in headers:
        if name == b"x-api-key":
            return value
    return None


def authorized_anthropic(headers: list, key: str) -> bool:
    """The Messages routes take the key as `x-api-key` or as a bearer token. Every key the
    request presents must be right: a wrong x-api-key beside a right bearer token is
    refused, so a client never learns that one of its keys is wrong by being let in."""
    sent = x_api_key(headers)
    has_bearer = any(name == b"authorization" for name, _ in headers)
    if sent is None:
        return authorized(headers, key)
    right = hmac.compare_digest(sent.decode("latin-1").strip().encode(), key.encode())
    return right and (not has_bearer or authorized(headers, key))
