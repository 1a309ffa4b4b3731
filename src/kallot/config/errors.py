"""Turn pydantic validation errors into kallot ConfigErrors naming field, value and expectation."""

from __future__ import annotations

from pydantic import ValidationError

from kallot.core.errors import ConfigError


def config_error(exc: ValidationError, *, prefix: str = "") -> ConfigError:
    """The first error of ``exc`` as a ConfigError (field path, offending value, expectation)."""
    err = exc.errors()[0]
    loc = ".".join(str(p) for p in err.get("loc", ()))
    field = f"{prefix}.{loc}" if prefix and loc else (prefix or loc or "<root>")
    return ConfigError(field, err.get("input"), err.get("msg", "a valid value"))
