"""/openapi.json, generated from the same field declarations the validator uses."""
from __future__ import annotations

from functools import lru_cache

from tinyloop import __version__

from .agent_fields import OPENAPI_KINDS
from .fields import (
    CHAT,
    COMPLETION,
    LMSTUDIO_EXTRAS,
    NATIVE,
    NATIVE_SPECULATIVE,
    NATIVE_TREE,
)
from .messages_fields import MESSAGES, PROMPT
from .openapi_agent_apis import (
    ANTHROPIC_ERROR,
    ANTHROPIC_STATUSES,
    KINDS,
    MESSAGE_REPLY,
    RESPONSE_REPLY,
    TOKEN_COUNT_REPLY,
)
from .responses_fields import RESPONSES
from .schema import MAX_STOP_LENGTH, MAX_STOP_STRINGS

# Shapes that overlap (an empty array is both a string array and an id array) use anyOf:
# oneOf would declare `[]` invalid, which the server accepts.
TEXT = {"type": "string", "minLength": 1}
TOKEN_IDS = {"type": "array", "items": {"type": "integer", "minimum": 0}, "minItems": 1}
STOP_STRING = {"type": "string", "minLength": 1, "maxLength": MAX_STOP_LENGTH}
STOP_STRINGS = {"type": "array", "items": STOP_STRING, "maxItems": MAX_STOP_STRINGS}
KIND_SCHEMAS = {
    "string": {"type": "string"},
    "integer": {"type": "integer"},
    "number": {"type": "number"},
    "boolean": {"type": "boolean"},
    "object": {"type": "object"},
    "stop": {"anyOf": [STOP_STRING, STOP_STRINGS]},
    "native_stop": {"anyOf": [STOP_STRING, STOP_STRINGS,
                              {"type": "array", "items": {"type": "integer", "minimum": 0}, "maxItems": 1024}]},
    "native_prompt": {"anyOf": [TEXT, TOKEN_IDS]},
    "completion_prompt": {"anyOf": [TEXT, TOKEN_IDS, {"type": "array", "items": TEXT, "minItems": 1, "maxItems": 1}]},
    "stream_options": {"type": "object", "properties": {"include_usage": {"type": "boolean"}},
                       "additionalProperties": False},
    "loops": {"anyOf": [{"type": "integer", "minimum": 1, "maximum": 64}, {"type": "string", "enum": ["auto"]}]},
}
KIND_SCHEMAS.update(OPENAPI_KINDS)
KIND_SCHEMAS.update(KINDS)
ERROR = {"type": "object", "required": ["error"], "properties": {"error": {
    "type": "object", "required": ["message", "type", "param", "code"], "additionalProperties": False,
    "properties": {"message": {"type": "string", "minLength": 1}, "type": {"type": "string"},
                   "param": {"type": ["string", "null"]}, "code": {"type": ["string", "null"]}}}}}


def _schema(fields: dict) -> dict:
    properties, required = {}, []
    for name, field in fields.items():
        prop = dict(KIND_SCHEMAS[field.kind])
        if field.default is not None:
            prop["default"] = field.default
        if field.low is not None:
            prop["minimum"] = field.low
        if field.high is not None:
            prop["maximum"] = field.high
        if field.choices:
            prop["enum"] = list(field.choices)
        if not field.required:
            prop = _nullable(prop)            # null means "absent": the default applies
        if field.doc:
            prop["description"] = field.doc
        properties[name] = prop
        if field.required:
            required.append(name)
    return {"type": "object", "properties": properties, "required": required, "additionalProperties": False}


def _nullable(prop: dict) -> dict:
    if "anyOf" in prop:
        return {**prop, "anyOf": [*prop["anyOf"], {"type": "null"}]}
    if "type" not in prop:                    # a oneOf, a const, an enum of mixed types
        return {"anyOf": [prop, {"type": "null"}]}
    out = {**prop, "type": [prop["type"], "null"]}
    if "enum" in out:
        out["enum"] = [*out["enum"], None]
    return out


def _post(summary: str, fields: dict, reply: dict, errors: dict | None = None, streams: bool = True) -> dict:
    content = {"application/json": {"schema": reply}}
    if streams:
        content["text/event-stream"] = {"schema": SSE_EVENT}
    ok = {"description": "JSON, or server-sent events when stream is true" if streams else "JSON",
          "content": content}
    return {"post": {"summary": summary,
                     "requestBody": {"required": True, "content": {"application/json": {"schema": _schema(fields)}}},
                     "responses": {"200": ok, **(errors or _errors())}}}


def _anthropic_post(summary: str, fields: dict, reply: dict, streams: bool = True) -> dict:
    """A Messages route: errors in Anthropic's shape, never 422 (a shape error is a 400); the
    key as x-api-key or a bearer token."""
    error = {"content": {"application/json": {"schema": ANTHROPIC_ERROR}}}
    operation = _post(summary, fields, reply, {str(code): {"description": text, **error}
                                               for code, text in ANTHROPIC_STATUSES}, streams)
    operation["post"]["security"] = [{"x_api_key": []}, {"bearer": []}]
    return operation


def _get(summary: str, reply: dict, content_type: str = "application/json", failing: tuple = ()) -> dict:
    """failing: statuses other than 200 this route answers with `reply`'s shape (/health's 503)."""
    ok = {"content": {content_type: {"schema": reply}}}
    responses = {"200": {"description": "OK", **ok}, **_errors()}
    for code in failing:
        responses[str(code)] = {"description": "not ready", **ok}
    return {"get": {"summary": summary, "responses": responses}}


def _errors(shapes: int = 422) -> dict:
    """shapes: the status of a wrong type or shape (400 on /v1/responses, as OpenAI's API)."""
    error = {"content": {"application/json": {"schema": ERROR}}}
    invalid = "invalid value or unsupported field" + (", wrong type or shape" if shapes == 400 else "")
    statuses = ((400, invalid), (401, "missing or wrong API key"), (413, "body too large"),
                (415, "wrong content type"), (422, "wrong type or shape"), (429, "queue full; see Retry-After"),
                (503, "model loading, worker failed or draining"))
    return {str(code): {"description": text, **error} for code, text in statuses if code != 422 or shapes == 422}


def _object(required: dict, **optional) -> dict:
    return {"type": "object", "required": list(required), "properties": {**required, **optional}}


SSE_EVENT = {"type": "object", "required": ["data"], "properties": {"data": {"type": "string"}}}
INT, STR, NUM, OBJ = {"type": "integer"}, {"type": "string"}, {"type": "number"}, {"type": "object"}
FINISH = {"type": "string", "enum": ["stop", "length"]}
USAGE = _object({"prompt_tokens": INT, "completion_tokens": INT, "total_tokens": INT})
EXTENDED = {"stats": OBJ, "model_info": OBJ, "runtime": OBJ}
CHAT_REPLY = _object({"id": STR, "object": {"const": "chat.completion"}, "created": INT, "model": STR,
                      "choices": {"type": "array", "minItems": 1, "items": _object({
                          "index": INT, "finish_reason": FINISH,
                          "message": _object({"role": {"const": "assistant"}, "content": STR})})},
                      "usage": USAGE}, **EXTENDED)
COMPLETION_REPLY = _object({"id": STR, "object": {"const": "text_completion"}, "created": INT, "model": STR,
                            "choices": {"type": "array", "minItems": 1, "items": _object({
                                "index": INT, "text": STR, "finish_reason": FINISH})},
                            "usage": USAGE}, **EXTENDED)
NATIVE_REPLY = _object({"tokens": {"type": "array", "items": INT}, "text": STR, "finish_reason": FINISH,
                        "stats": OBJ})
MODELS_REPLY = _object({"object": {"const": "list"}, "data": {"type": "array", "items": _object({
    "id": STR, "object": {"const": "model"}, "created": INT, "owned_by": STR})}})
HEALTH_REPLY = _object({"status": {"type": "string", "enum": ["ready", "loading", "worker_failed", "draining"]},
                        "model": {"type": ["string", "null"]}}, reason=STR)


@lru_cache(maxsize=1)
def openapi_document() -> dict:
    extended_chat = {**CHAT, **LMSTUDIO_EXTRAS}
    extended_completion = {**COMPLETION, **LMSTUDIO_EXTRAS}
    return {
        "openapi": "3.1.0",
        "info": {"title": "TinyLoop", "version": __version__,
                 "description": "Inference server for weight-shared looped transformers."},
        "components": {"securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"},
                                           "x_api_key": {"type": "apiKey", "in": "header", "name": "x-api-key"}}},
        "security": [{"bearer": []}],
        "paths": {
            "/v1/models": _get("List the served model", MODELS_REPLY),
            "/v1/chat/completions": _post("Chat completion (OpenAI)", CHAT, CHAT_REPLY),
            "/v1/completions": _post("Text completion (OpenAI)", COMPLETION, COMPLETION_REPLY),
            "/v1/responses": _post("Model response (OpenAI Responses API; store and previous_response_id "
                                   "refused)", RESPONSES, RESPONSE_REPLY, _errors(shapes=400)),
            "/v1/messages": _anthropic_post("Message (Anthropic Messages API)", MESSAGES, MESSAGE_REPLY),
            "/v1/messages/count_tokens": _anthropic_post("Prompt tokens of a Messages request, as usage.input_tokens "
                                                         "counts them", PROMPT, TOKEN_COUNT_REPLY, streams=False),
            "/api/v0/models": _get("List the served model, with LM Studio-style details", MODELS_REPLY),
            "/api/v0/chat/completions": _post("Chat completion with TinyLoop knobs and stats", extended_chat,
                                              CHAT_REPLY),
            "/api/v0/completions": _post("Text completion with TinyLoop knobs and stats", extended_completion,
                                         COMPLETION_REPLY),
            "/generate": _post("Native generation", NATIVE, NATIVE_REPLY),
            "/generate/speculative": _post("Native self-speculative generation", NATIVE_SPECULATIVE, NATIVE_REPLY),
            "/generate/tree_speculative": _post("Native tree-speculative generation", NATIVE_TREE, NATIVE_REPLY),
            "/health": _get("Readiness: ready (200); loading, worker_failed or draining (503)", HEALTH_REPLY,
                            failing=(503,)),
            "/metrics": _get("Prometheus metrics", STR, "text/plain"),
            "/openapi.json": _get("This document", OBJ),
        },
    }
