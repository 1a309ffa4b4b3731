"""Turn pydantic validation errors into kallot ConfigErrors naming field, value and expectation.

Where it sits: every configuration document kallot validates with pydantic (the scheduler's
configuration, the agent's inventory and model files, the device record) reports through
here, so no pydantic wording ("Field required", "Input should be ...") reaches a user.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from kallot.core.errors import ConfigError

# pydantic's error types -> what kallot says was expected (``ctx`` filled in).
_EXPECTED = {
    "missing": "a value (the field is required)",
    "greater_than_equal": "a number >= {ge}",
    "greater_than": "a number > {gt}",
    "less_than_equal": "a number <= {le}",
    "less_than": "a number < {lt}",
    "string_too_short": "a text of at least {min_length} character(s)",
    "string_too_long": "a text of at most {max_length} characters",
    "too_short": "at least {min_length} item(s)",
    "too_long": "at most {max_length} items",
    "int_parsing": "an integer",
    "int_type": "an integer",
    "int_from_float": "an integer",
    "float_parsing": "a number",
    "float_type": "a number",
    "bool_parsing": "true or false",
    "bool_type": "true or false",
    "string_type": "a text",
    "dict_type": "a mapping (key: value lines)",
    "model_type": "a mapping (key: value lines)",
    "model_attributes_type": "a mapping (key: value lines)",
    "list_type": "a list",
    "tuple_type": "a list",
    "set_type": "a list",
    "enum": "one of {expected}",
    "string_pattern_mismatch": "a text matching {pattern}",
}


def expected(err: Mapping[str, Any], *, docs: str = "") -> str:
    """pydantic's message as the 'expected ...' half of a kallot error line (``docs``: where
    the fields are documented, named for a field that does not exist)."""
    kind, msg = str(err.get("type", "")), str(err.get("msg", "a valid value"))
    if kind == "extra_forbidden":
        return f"no such field (see {docs})" if docs else "no such field"
    ctx = err.get("ctx") or {}
    if kind in _EXPECTED:
        try:
            return _EXPECTED[kind].format(**ctx)
        except (KeyError, IndexError):
            pass
    if kind == "literal_error":
        return msg.removeprefix("Input should be ")
    msg = msg.removeprefix("Value error, ").removeprefix("Assertion failed, ")
    msg = msg.removeprefix("Input should be ")
    return msg[:1].lower() + msg[1:]


def location(err: Mapping[str, Any]) -> str:
    """The field path of one pydantic error (``a.0.b``), without the validator-branch names
    pydantic inserts (``function-after[...]``)."""
    parts = [str(p) for p in err.get("loc", ())]
    return ".".join(p for p in parts if "[" not in p)


def config_error(exc: ValidationError, *, prefix: str = "", docs: str = "") -> ConfigError:
    """The first error of ``exc`` as a ConfigError (field path, offending value, expectation)."""
    err = exc.errors()[0]
    loc = location(err)
    field = f"{prefix}.{loc}" if prefix and loc else (prefix or loc or "the document")
    value = err.get("input") if err.get("type") != "missing" else None
    return ConfigError(field, value, expected(err, docs=docs))
