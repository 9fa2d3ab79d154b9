"""What a JSON schema may say before it is compiled into a grammar.

llguidance names the keywords it does not implement ("not", "if", "uniqueItems", ...),
but passes over keywords it does not know at all, which would silently constrain less
than the client asked. So every keyword must be one of the known ones below; anyOf is
bounded, and so are nesting and size. Annotations are accepted and ignored.
"""
from __future__ import annotations

from tinyloop.errors import RequestError

MAX_ANY_OF = 16            # alternatives in one anyOf / oneOf
MAX_DEPTH = 24             # nested schemas
MAX_NODES = 2000           # schemas in one document

ANNOTATIONS = frozenset({"title", "description", "examples", "default", "$comment", "$schema", "$id",
                         "deprecated", "readOnly", "writeOnly", "strict", "x-guidance"})
# Keywords llguidance compiles into the grammar.
COMPILED = frozenset({"type", "properties", "required", "additionalProperties", "items", "prefixItems",
                      "minItems", "maxItems", "enum", "const", "anyOf", "oneOf", "allOf", "$ref", "$defs",
                      "definitions", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
                      "multipleOf", "minLength", "maxLength", "pattern", "format", "minProperties",
                      "maxProperties", "patternProperties"})
# Child schemas: keyword -> how its value holds them.
_SCHEMA = ("additionalProperties", "items")
_LIST = ("anyOf", "oneOf", "allOf", "prefixItems")
_MAP = ("properties", "$defs", "definitions", "patternProperties")


def check_schema(schema, param: str) -> None:
    """RequestError naming the path of the first keyword or shape we do not accept."""
    if not isinstance(schema, (dict, bool)):
        raise RequestError(f"'{param}' must be a JSON schema object", param)
    count = [0]
    _walk(schema, param, 0, count)


def _walk(schema, where: str, depth: int, count: list) -> None:
    if isinstance(schema, bool):
        return
    if not isinstance(schema, dict):
        raise RequestError(f"'{where}' must be a schema (an object or a boolean)", where)
    count[0] += 1
    if depth > MAX_DEPTH or count[0] > MAX_NODES:
        raise RequestError(f"the schema at '{where}' is too large: at most {MAX_DEPTH} levels of nesting and "
                           f"{MAX_NODES} schemas", where)
    for key, value in schema.items():
        if key in ANNOTATIONS:
            continue
        if key not in COMPILED:
            raise RequestError(f"unsupported JSON schema keyword '{key}' at '{where}'; supported: "
                               f"{', '.join(sorted(COMPILED))} (annotations like title and description "
                               "are accepted)", where)
        if key in _SCHEMA and isinstance(value, (dict, bool)):
            _walk(value, f"{where}.{key}", depth + 1, count)
        elif key in _LIST:
            if not isinstance(value, list) or not value:
                raise RequestError(f"'{where}.{key}' must be a non-empty array of schemas", where)
            if key in ("anyOf", "oneOf") and len(value) > MAX_ANY_OF:
                raise RequestError(f"'{where}.{key}' has {len(value)} alternatives; at most {MAX_ANY_OF} are "
                                   "supported", where)
            for index, child in enumerate(value):
                _walk(child, f"{where}.{key}[{index}]", depth + 1, count)
        elif key in _MAP:
            if not isinstance(value, dict):
                raise RequestError(f"'{where}.{key}' must be an object of schemas", where)
            for name, child in value.items():
                _walk(child, f"{where}.{key}.{name}", depth + 1, count)


def closed_objects(schema):
    """A copy where objects that list properties and say nothing of additionalProperties
    get additionalProperties: false. Output valid for the copy is valid for the original;
    a small model otherwise wanders into invented keys."""
    if isinstance(schema, list):
        return [closed_objects(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {}
    for key, value in schema.items():
        if key in _MAP:
            out[key] = {name: closed_objects(child) for name, child in value.items()} \
                if isinstance(value, dict) else value
        elif key in _SCHEMA or key in _LIST:
            out[key] = closed_objects(value)
        else:
            out[key] = value
    if "properties" in out and "additionalProperties" not in out and "patternProperties" not in out:
        out["additionalProperties"] = False
    return out
