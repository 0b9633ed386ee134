"""JSON schemas and regexes with a valid instance each: what the grammar tests, the engine comparison
(scripts/bench_grammar_engines.py) and the throughput script share, so the compile times reported
are those of the schemas the tests use.

Every schema but `any_object` is bounded (string lengths, integer ranges, item counts), so even a
random-weight model reaches the grammar's end within a few hundred tokens."""

from __future__ import annotations

from typing import Any

# name -> (schema, a valid instance)
SCHEMAS: dict[str, tuple[dict[str, Any], Any]] = {
    "flat": (
        {
            "type": "object",
            "properties": {
                "name": {"type": "string", "maxLength": 8},
                "age": {"type": "integer", "minimum": 0, "maximum": 120},
                "ok": {"type": "boolean"},
            },
            "required": ["name", "age", "ok"],
            "additionalProperties": False,
        },
        {"name": "Ada", "age": 36, "ok": True},
    ),
    "nested": (
        {
            "type": "object",
            "properties": {
                "user": {
                    "type": "object",
                    "properties": {
                        "id": {"type": "integer", "minimum": 0, "maximum": 999},
                        "tags": {"type": "array", "items": {"type": "string", "maxLength": 6}, "maxItems": 3},
                    },
                    "required": ["id", "tags"],
                    "additionalProperties": False,
                },
                "score": {"type": "integer", "minimum": -10, "maximum": 10},
            },
            "required": ["user", "score"],
            "additionalProperties": False,
        },
        {"user": {"id": 7, "tags": ["a", "b"]}, "score": 5},
    ),
    "enum": (
        {
            "type": "object",
            "properties": {"color": {"enum": ["red", "green", "blue"]}, "size": {"type": "string", "enum": ["S", "M", "L"]}},
            "required": ["color", "size"],
            "additionalProperties": False,
        },
        {"color": "green", "size": "M"},
    ),
    "long_keys": (
        {
            "type": "object",
            "properties": {
                "customer_account_identifier": {"type": "integer", "minimum": 0, "maximum": 99999},
                "preferred_delivery_time_window": {"type": "string", "enum": ["morning", "evening"]},
                "requires_signature_on_delivery": {"type": "boolean"},
                "shipping_address_postal_code": {"type": "string", "maxLength": 8},
            },
            "required": [
                "customer_account_identifier",
                "preferred_delivery_time_window",
                "requires_signature_on_delivery",
                "shipping_address_postal_code",
            ],
            "additionalProperties": False,
        },
        {
            "customer_account_identifier": 42,
            "preferred_delivery_time_window": "morning",
            "requires_signature_on_delivery": False,
            "shipping_address_postal_code": "75001",
        },
    ),
    "array_of_objects": (
        {
            "type": "object",
            "properties": {
                "items": {
                    "type": "array",
                    "minItems": 1,
                    "maxItems": 3,
                    "items": {
                        "type": "object",
                        "properties": {"sku": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{3}$"}, "qty": {"type": "integer", "minimum": 1, "maximum": 99}},
                        "required": ["sku", "qty"],
                        "additionalProperties": False,
                    },
                }
            },
            "required": ["items"],
            "additionalProperties": False,
        },
        {"items": [{"sku": "ABC-123", "qty": 2}]},
    ),
    "any_object": ({"type": "object"}, {"a": [1, 2, {"b": None}]}),
}

# name -> (regex, a full match)
REGEXES: dict[str, tuple[str, str]] = {
    "date": (r"[0-9]{4}-[0-9]{2}-[0-9]{2}", "2024-05-17"),
    "ip": (r"((25[0-5]|2[0-4][0-9]|1?[0-9]?[0-9])\.){3}(25[0-5]|2[0-4][0-9]|1?[0-9]?[0-9])", "192.168.0.1"),
    "choice": (r"(yes|no|maybe)", "maybe"),
    "email": (r"[a-z]{1,10}@[a-z]{1,10}\.(com|org)", "ada@lovelace.org"),
}

# Schemas that compile but that the grammar engine cannot follow (found by a hostile client): each trips one of
# llguidance's parser limits, or allows no token at all, within its first steps. The router refuses them at
# validation (router/guided/grammar_probe.py); the shard ends just their request if one reaches it.
HOSTILE_SCHEMAS: dict[str, dict[str, Any]] = {
    # a row of ~12,000 Earley items at the first key; the limit is 2,000
    "optional_properties": {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(3000)}},
    "many_alternatives": {"anyOf": [
        {"type": "object", "properties": {f"k{i}": {"type": "integer"}}, "required": [f"k{i}"]} for i in range(3000)
    ]},
    # no finite instance: a required property that is the whole schema again (over 50,000 items)
    "required_recursion": {"type": "object", "properties": {"a": {"$ref": "#"}}, "required": ["a"]},
    "self_reference": {"$ref": "#"},  # allows no first token
}

# Passes the validation probe (its first steps are a short free string) and trips the parser's row limit a few
# tokens later, at the inner object of 3,000 optional properties: what only the shard can catch, which then
# ends just this request (Generation.error).
LATE_FAILING_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "a": {"type": "string", "maxLength": 3},
        "b": {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(3000)}},
    },
    "required": ["a", "b"],
    "additionalProperties": False,
}
