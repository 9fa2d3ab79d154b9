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

KIND_SCHEMAS = {
    "string": {"type": "string"},
    "integer": {"type": "integer"},
    "number": {"type": "number"},
    "boolean": {"type": "boolean"},
    "object": {"type": "object"},
    "stop": {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}, "maxItems": 16}]},
    "native_stop": {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}},
                              {"type": "array", "items": {"type": "integer"}}]},
    "native_prompt": {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "integer"}}]},
    "completion_prompt": {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "integer"}},
                                    {"type": "array", "items": {"type": "string"}, "maxItems": 1}]},
    "messages": {"type": "array", "items": {"type": "object", "required": ["role", "content"], "properties": {
        "role": {"type": "string", "enum": ["system", "developer", "user", "assistant"]},
        "content": {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "object"}}]},
        "name": {"type": "string"}}}},
    "stream_options": {"type": "object", "properties": {"include_usage": {"type": "boolean"}}},
}
KIND_SCHEMAS.update(OPENAPI_KINDS)
ERROR = {"type": "object", "properties": {"error": {"type": "object", "properties": {
    "message": {"type": "string"}, "type": {"type": "string"}, "param": {"type": ["string", "null"]},
    "code": {"type": ["string", "null"]}}}}}


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
        if field.doc:
            prop["description"] = field.doc
        properties[name] = prop
        if field.required:
            required.append(name)
    return {"type": "object", "properties": properties, "required": required, "additionalProperties": False}


def _post(summary: str, fields: dict) -> dict:
    return {"post": {"summary": summary,
                     "requestBody": {"required": True, "content": {"application/json": {"schema": _schema(fields)}}},
                     "responses": _responses("JSON, or text/event-stream when stream is true")}}


def _get(summary: str) -> dict:
    return {"get": {"summary": summary, "responses": _responses("JSON")}}


def _responses(ok: str) -> dict:
    error = {"content": {"application/json": {"schema": ERROR}}}
    return {"200": {"description": ok}, **{str(code): {"description": text, **error} for code, text in (
        (400, "invalid value or unsupported field"), (401, "missing or wrong API key"),
        (413, "body too large"), (415, "wrong content type"), (422, "wrong type or shape"),
        (429, "queue full; see Retry-After"), (503, "model loading or worker failed"))}}


@lru_cache(maxsize=1)
def openapi_document() -> dict:
    extended_chat = {**CHAT, **LMSTUDIO_EXTRAS}
    extended_completion = {**COMPLETION, **LMSTUDIO_EXTRAS}
    return {
        "openapi": "3.1.0",
        "info": {"title": "TinyLoop", "version": __version__,
                 "description": "Inference server for weight-shared looped transformers."},
        "components": {"securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}},
        "security": [{"bearer": []}],
        "paths": {
            "/v1/models": _get("List the served model"),
            "/v1/chat/completions": _post("Chat completion (OpenAI)", CHAT),
            "/v1/completions": _post("Text completion (OpenAI)", COMPLETION),
            "/api/v0/models": _get("List the served model, with LM Studio-style details"),
            "/api/v0/chat/completions": _post("Chat completion with TinyLoop knobs and stats", extended_chat),
            "/api/v0/completions": _post("Text completion with TinyLoop knobs and stats", extended_completion),
            "/generate": _post("Native generation", NATIVE),
            "/generate/speculative": _post("Native self-speculative generation", NATIVE_SPECULATIVE),
            "/generate/tree_speculative": _post("Native tree-speculative generation", NATIVE_TREE),
            "/health": _get("Readiness: ready (200), loading or worker_failed (503)"),
            "/metrics": _get("Prometheus metrics"),
            "/openapi.json": _get("This document"),
        },
    }
