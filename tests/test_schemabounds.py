"""The bounds a JSON schema keeps before it becomes a grammar (runner/sample/schemabounds.py)."""

from __future__ import annotations

import pytest

from runner.api import InvalidRequest
from runner.sample.schemabounds import LIMITS, check, repetition


@pytest.mark.parametrize("pattern, times", [
    ("^abc$", 1), ("^a*b+c?$", 1), ("^a{5}$", 5), ("^a{2,7}$", 7), ("^a{9,}$", 9),
    ("^(ab{3}){4}$", 12), ("^((a{2}){3}){5}c{7}$", 30), ("^[{]{4}$", 4), ("^\\{{8}$", 8),
    ("^[a-z]{3}(x|y{10})$", 10), ("^a{,5}$", 1), ("^a{x}$", 1), ("^[]a]{6}$", 6), ("^(a{3}$", 3),
])
def test_repetition_multiplies_through_groups(pattern, times):
    assert repetition(pattern) == times


@pytest.mark.parametrize("schema, keyword", [
    ({"type": "array", "maxItems": 100_000}, '"maxItems" is 100000'),
    ({"type": "array", "minItems": 10**9}, '"minItems" is 1000000000'),
    ({"type": "string", "maxLength": 100_000}, '"maxLength" is 100000'),
    ({"type": "string", "minLength": 1e9}, '"minLength" is 1000000000.0'),
    ({"type": "string", "pattern": "^a{0,100000}$"}, '"pattern" repeats 100000 times'),
    ({"type": "string", "pattern": "^a{1000000000}$"}, '"pattern" repeats 1000000000 times'),
    ({"type": "string", "pattern": "^(a{100}){100}$"}, '"pattern" repeats 10000 times'),
    ({"type": "string", "pattern": "^[" + "x" * 5000 + "]$"}, '"pattern" is 5004 characters'),
    ({"enum": list(range(1001))}, "enum values and anyOf/oneOf branches add up to 1001"),
    ({"type": "object", "properties": {"a": {"anyOf": [{"const": i} for i in range(600)]},
                                       "b": {"oneOf": [{"const": i} for i in range(600)]}}}, "add up to 1200"),
    ({"type": "object", "properties": {f"k{i}": {"type": "integer"} for i in range(300)}}, '"properties" has 300'),
    ({"enum": ["x" * 600_000]}, "over the limit of 524288"),
    # deep in a schema, under every keyword that holds schemas
    ({"type": "array", "items": {"type": "object", "properties": {"a": {"maxLength": 5000}}}}, '"maxLength" is 5000'),
    ({"$defs": {"t": {"prefixItems": [{"not": {"minItems": 2000}}]}}}, '"minItems" is 2000'),
    ({"anyOf": [{"additionalProperties": {"pattern": "^x{2000}$"}}]}, '"pattern" repeats 2000'),
])
def test_over_a_bound_is_refused_naming_the_keyword(schema, keyword):
    with pytest.raises(InvalidRequest) as err:
        check(schema, "format")
    assert str(err.value).startswith("invalid JSON schema in format: ")
    assert keyword in str(err.value)


def test_deep_nesting_is_refused():
    schema: dict = {"type": "string"}
    for _ in range(LIMITS.depth + 1):
        schema = {"type": "array", "items": schema}
    with pytest.raises(InvalidRequest, match="nest deeper than 32 levels"):
        check(schema, "format")


@pytest.mark.parametrize("schema", [
    {"type": "array", "items": {"type": "string", "maxLength": 1000}, "maxItems": 1000},
    {"type": "string", "pattern": "^(a{10}){100}$"},
    {"enum": list(range(1000))},
    {"enum": [{"maxItems": 10**9}]},  # a value, not a keyword
    {"const": {"pattern": "^a{100000}$"}},
    {"type": "object", "properties": {"maxItems": {"type": "integer"}, "pattern": {"type": "string"}}},
    {"type": "integer", "maximum": 10**12},  # a number's range is no repetition
    True,
])
def test_within_the_bounds_passes(schema):
    check(schema, "format")
