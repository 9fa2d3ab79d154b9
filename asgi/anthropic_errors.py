"""Errors on the Anthropic Messages routes (/v1/messages*), in Anthropic's shape:
{"type": "error", "error": {"type": ..., "message": ...}}.

The rest of the server raises ApiError in the OpenAI shape; app.py sends those through
here when the path is an Anthropic one, so every route keeps one way to refuse. The
Anthropic API answers every malformed request with 400 invalid_request_error (it has no
422), so a shape error (our 422) goes out as a 400; the SDK then raises BadRequestError
for both, as it does against Anthropic's own API.
"""
from __future__ import annotations

from .errors import ApiError

ANTHROPIC_PREFIX = "/v1/messages"

# status -> Anthropic error type (https://docs.anthropic.com/en/api/errors)
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "request_too_large",
    415: "invalid_request_error",
    429: "rate_limit_error",
    503: "overloaded_error",
}


def is_anthropic_path(path: str) -> bool:
    return path == ANTHROPIC_PREFIX or path.startswith(ANTHROPIC_PREFIX + "/")


def anthropic_status(error: ApiError) -> int:
    return 400 if error.status == 422 else error.status


def anthropic_error_type(error: ApiError) -> str:
    return ERROR_TYPES.get(anthropic_status(error), "api_error")


def anthropic_error_body(error: ApiError) -> dict:
    return {"type": "error", "error": {"type": anthropic_error_type(error), "message": error.message}}
