"""Exceptions of kallot. Expected outcomes ("does not fit") are ``status.Status`` values, not these.

Every exception kallot raises derives from ``KallotError`` so shells can catch at their loop
boundary. ``InvariantViolation`` is a bug; ``ConfigError`` is bad user input at an edge.
"""


class KallotError(Exception):
    """Base of every kallot exception."""


class ConfigError(KallotError):
    """Bad user input: names the field, the value and what was expected."""

    def __init__(self, field: str, value: object, expected: str) -> None:
        self.field = field
        self.value = value
        self.expected = expected
        super().__init__(f"{field}: got {value!r}, expected {expected}")


class InvariantViolation(KallotError):
    """The core detected an impossible state (a bug): never raised for user input."""
