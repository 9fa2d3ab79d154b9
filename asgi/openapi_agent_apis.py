"""/openapi.json shapes for the Responses and Messages routes: their custom field kinds,
replies and (for Messages) Anthropic's error object. Nested items are declared loosely
(an object, a string) where the validator checks more than a schema can say, so that the
document never calls invalid what the server accepts; the server's 400 names the rest."""
from __future__ import annotations

from .agent_fields import MAX_TOOLS
from .schema import MAX_MESSAGES, MAX_STOP_LENGTH, MAX_STOP_STRINGS

OBJECT = {"type": "object"}
STRING = {"type": "string"}
INTEGER = {"type": "integer"}

KINDS = {
    "responses_input": {"anyOf": [{"type": "string", "minLength": 1},
                                  {"type": "array", "minItems": 1, "maxItems": MAX_MESSAGES, "items": OBJECT}]},
    "responses_tools": {"type": "array", "maxItems": MAX_TOOLS, "items": {
        "type": "object", "required": ["type"], "properties": {"type": STRING}}},
    "responses_tool_choice": {"anyOf": [{"enum": ["none", "auto", "required"]}, OBJECT]},
    "responses_text": OBJECT,
    "responses_reasoning": OBJECT,
    "openai_metadata": {"type": "object", "maxProperties": 16, "propertyNames": {"maxLength": 64},
                        "additionalProperties": {"type": "string", "maxLength": 512}},
    "string_list": {"type": "array", "items": STRING},
    "anthropic_messages": {"type": "array", "minItems": 1, "maxItems": MAX_MESSAGES, "items": {
        "type": "object", "required": ["role", "content"], "properties": {
            "role": {"enum": ["user", "assistant"]},
            "content": {"anyOf": [STRING, {"type": "array", "items": {"anyOf": [
                {"type": "object", "required": ["type", "text"], "properties": {"type": {"const": "text"},
                                                                               "text": STRING}},
                {"type": "object", "required": ["type"], "properties": {"type": {"enum": [
                    "tool_use", "tool_result", "thinking", "redacted_thinking"]}}}]}}]}}}},
    "anthropic_system": {"anyOf": [STRING, {"type": "array", "items": OBJECT}]},
    "anthropic_tools": {"type": "array", "maxItems": MAX_TOOLS, "items": {
        "type": "object", "required": ["name", "input_schema"]}},
    "anthropic_tool_choice": {"type": "object", "required": ["type"], "properties": {
        "type": {"enum": ["auto", "any", "tool", "none"]}}},
    "anthropic_thinking": {"type": "object", "required": ["type"], "properties": {
        "type": {"enum": ["enabled", "adaptive", "disabled"]}}},
    "anthropic_metadata": OBJECT,
    "anthropic_output_config": OBJECT,
    "anthropic_stop": {"type": "array", "maxItems": MAX_STOP_STRINGS, "items": {
        "type": "string", "minLength": 1, "maxLength": MAX_STOP_LENGTH}},
}

RESPONSE_REPLY = {"type": "object", "required": ["id", "object", "created_at", "status", "model", "output", "usage"],
                  "properties": {"id": STRING, "object": {"const": "response"}, "created_at": INTEGER,
                                 "status": {"enum": ["completed", "incomplete"]}, "model": STRING,
                                 "output": {"type": "array", "items": {"type": "object", "required": ["type"]}},
                                 "usage": {"type": "object", "required": ["input_tokens", "output_tokens"]}}}
MESSAGE_REPLY = {"type": "object", "required": ["id", "type", "role", "model", "content", "stop_reason", "usage"],
                 "properties": {"id": STRING, "type": {"const": "message"}, "role": {"const": "assistant"},
                                "model": STRING, "content": {"type": "array", "items": {
                                    "type": "object", "required": ["type"]}},
                                "stop_reason": {"enum": ["end_turn", "max_tokens", "stop_sequence", "tool_use"]},
                                "stop_sequence": {"type": ["string", "null"]},
                                "usage": {"type": "object", "required": ["input_tokens", "output_tokens"]}}}
TOKEN_COUNT_REPLY = {"type": "object", "required": ["input_tokens"], "properties": {"input_tokens": INTEGER}}

ANTHROPIC_ERROR = {"type": "object", "required": ["type", "error"], "properties": {
    "type": {"const": "error"}, "error": {
        "type": "object", "required": ["type", "message"], "additionalProperties": False, "properties": {
            "type": {"enum": ["invalid_request_error", "authentication_error", "permission_error", "not_found_error",
                              "request_too_large", "rate_limit_error", "api_error", "overloaded_error"]},
            "message": {"type": "string", "minLength": 1}}}}}
ANTHROPIC_STATUSES = ((400, "invalid_request_error: a wrong value, type or shape, an unsupported field"),
                      (401, "authentication_error: missing or wrong key (x-api-key or Bearer)"),
                      (413, "request_too_large"), (415, "invalid_request_error: wrong content type"),
                      (429, "rate_limit_error: queue full; see Retry-After"),
                      (503, "overloaded_error: model loading, worker failed or draining"))
