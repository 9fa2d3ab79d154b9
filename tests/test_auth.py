"""Bearer-key authentication (README "Quick start" and the settings table): every route
needs `Authorization: Bearer <key>`; the key is TINYLOOP_API_KEY, else one generated once
into the state directory (directory 0700, file 0600) and kept across restarts; the key
is never logged."""
import logging
import os
import stat
import string

import pytest
from asgi_client import call, run
from test_server_asgi import ready_app
from test_server_asgi import settings as server_settings

from asgi.auth import authorized, authorized_anthropic, load_or_create_key, x_api_key
from asgi.state import ServerState
from tinyloop.model.testmodels import make_test_model

KEY = "tl-0123456789abcdefghijklmnopqrstuvwxyzABCDEFG"


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("auth") / "tiny.tinyloop"
    make_test_model(path, "tiny-looped", seed=0)
    return path


@pytest.fixture(scope="module")
def app(model_path):
    return ready_app(model_path)


def header(value: str) -> list:
    return [(b"content-type", b"application/json"), (b"authorization", value.encode())]


@pytest.mark.parametrize("value, ok", [
    (f"Bearer {KEY}", True),
    (f"bearer {KEY}", True),                 # the scheme is case-insensitive (RFC 9110)
    (f"Basic {KEY}", False),
    (f"Token {KEY}", False),
    (f"{KEY}", False),
    (f"Bearer{KEY}", False),
    ("Bearer ", False),
    ("Bearer", False),
    ("", False),
    (f"Bearer {KEY[:-1]}", False),           # a prefix of the key
    (f"Bearer {KEY[:3]}", False),
    (f"Bearer {KEY}x", False),
    (f"Bearer {KEY.upper()}", False),
])
def test_only_bearer_with_the_exact_key_is_authorized(value, ok):
    assert authorized(header(value), KEY) is ok


def test_x_api_key_is_read_among_other_headers():
    headers = [(b"host", b"example"), (b"x-api-key", KEY.encode()), (b"accept", b"*/*")]
    assert x_api_key(headers) == KEY.encode()
    assert x_api_key([(b"host", b"example")]) is None


@pytest.mark.parametrize("headers,ok", [
    ([(b"host", b"h"), (b"x-api-key", KEY.encode())], True),                       # x-api-key alone
    ([(b"host", b"h"), (b"x-api-key", b"wrong")], False),
    ([(b"host", b"h"), (b"authorization", f"Bearer {KEY}".encode())], True),       # bearer alone
    ([(b"x-api-key", KEY.encode()), (b"authorization", f"Bearer {KEY}".encode())], True),
    ([(b"x-api-key", b"wrong"), (b"authorization", f"Bearer {KEY}".encode())], False),   # every key must be right
    ([(b"x-api-key", KEY.encode()), (b"authorization", b"Bearer wrong")], False),
    ([(b"host", b"h")], False),
])
def test_the_messages_routes_take_x_api_key_or_bearer_and_every_key_sent_must_be_right(headers, ok):
    assert authorized_anthropic(headers, KEY) is ok


def test_no_authorization_header_is_refused():
    assert authorized([(b"content-type", b"application/json")], KEY) is False


def test_the_generated_key_is_long_random_and_kept_across_restarts(tmp_path):
    state_dir = tmp_path / "state" / "tinyloop"
    key, path = load_or_create_key(state_dir)
    assert path == state_dir / "api-key"
    assert stat.S_IMODE(state_dir.stat().st_mode) == 0o700
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert path.read_text() == key + "\n"
    # 32 random bytes, URL-safe base64: 43 characters after the "tl-" prefix
    assert key.startswith("tl-") and len(key) == 3 + 43
    assert set(key[3:]) <= set(string.ascii_letters + string.digits + "-_")
    again, _ = load_or_create_key(state_dir)             # a restart reads it back
    assert again == key
    other, _ = load_or_create_key(tmp_path / "elsewhere")
    assert other != key


def test_an_existing_key_file_is_used_as_is(tmp_path):
    (tmp_path / "api-key").write_text("my-own-key-from-an-operator\n")
    os.chmod(tmp_path / "api-key", 0o600)
    assert load_or_create_key(tmp_path)[0] == "my-own-key-from-an-operator"


def test_an_empty_key_file_gets_a_new_key(tmp_path):
    (tmp_path / "api-key").write_text("\n")
    # 0700: no access for others (a readable-by-others file is refused, test_faults.py), and
    # not 0600 either, so the new key file's mode comes from the chmod after the write
    (tmp_path / "api-key").chmod(0o700)
    key, path = load_or_create_key(tmp_path)
    assert key.startswith("tl-") and len(key) == 46 and path.read_text() == key + "\n"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_a_restarted_server_accepts_the_same_key(model_path, tmp_path):
    state_dir = tmp_path / "state"
    first = ready_app(model_path, api_key=None, state_dir=state_dir)
    key = (state_dir / "api-key").read_text().strip()
    assert run(call(first, "GET", "/v1/models", key=key)).status == 200
    second = ready_app(model_path, api_key=None, state_dir=state_dir)
    assert run(call(second, "GET", "/v1/models", key=key)).status == 200
    assert run(call(second, "GET", "/v1/models", key=key[:-1])).status == 401


@pytest.mark.parametrize("path", ["/metrics", "/health", "/openapi.json", "/v1/models"])
def test_every_route_needs_the_key(app, path):
    assert run(call(app, "GET", path, key=None)).status == 401
    assert run(call(app, "GET", path, key="test-ke")).status == 401
    assert run(call(app, "GET", path)).status == 200


@pytest.mark.parametrize("from_env", [True, False])
def test_the_key_is_never_logged(tmp_path, caplog, from_env):
    caplog.set_level(logging.DEBUG)
    changes = dict(api_key="secret-key-from-env") if from_env else dict(api_key=None)
    state = ServerState(server_settings(None, state_dir=tmp_path, **changes))
    assert state.key
    logged = "\n".join(record.getMessage() for record in caplog.records)
    assert logged, "the auth source should be logged"
    assert state.key not in logged
    if not from_env:
        assert str(tmp_path / "api-key") in logged           # the path, not the key
