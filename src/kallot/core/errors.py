"""Exceptions of kallot. Expected outcomes ("does not fit") are ``status.Status`` values, not these.

Every exception kallot raises derives from ``KallotError`` so shells can catch at their loop
boundary. ``InvariantViolation`` is a bug; ``ConfigError`` is bad user input at an edge.
"""

from __future__ import annotations


class KallotError(Exception):
    """Base of every kallot exception."""


# A value longer than this is cut in messages (a 60 KB annotation must not fill logs and Events).
MAX_VALUE_CHARS = 200


def shown(value: object) -> str:
    """``repr(value)``, cut to ``MAX_VALUE_CHARS`` with the full length said."""
    text = repr(value)
    if len(text) <= MAX_VALUE_CHARS:
        return text
    return f"{text[:MAX_VALUE_CHARS]}... ({len(text)} characters)"


class ConfigError(KallotError):
    """Bad user input: names the field, the value (cut when long) and what was expected."""

    def __init__(self, field: str, value: object, expected: str) -> None:
        self.field = field
        self.value = value
        self.expected = expected
        super().__init__(f"{field}: got {shown(value)}, expected {expected}")

    def __reduce__(self) -> tuple[type[ConfigError], tuple[str, object, str]]:
        # Raised in a worker process it must come back whole (Exception pickles ``args``).
        return (type(self), (self.field, self.value, self.expected))


class InvariantViolation(KallotError):
    """The core detected an impossible state (a bug): never raised for user input."""
