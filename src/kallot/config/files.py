"""Reading a user's file at the edge: one ConfigError line, never a traceback.

Where it sits: every shell that reads a file a user names (the scheduler's ``--config``, the
agent's ``--kubeconfig`` and inventory, the report's ``--prices``, the simulator's traces)
reads it through ``read_text``, so a missing file, a directory and a file that is not text all
get the same kind of message.
"""

from __future__ import annotations

from pathlib import Path

from kallot.core.errors import ConfigError


def read_text(path: Path, field: str, what: str = "a readable file") -> str:
    """The text of ``path`` (UTF-8; a leading byte-order mark, as spreadsheets write, dropped).
    Raises ConfigError naming ``field``, the path and ``what`` was expected, with why not."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ConfigError(field, str(path), f"{what} ({exc.strerror or exc})") from None
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        bad = data[exc.start]
        raise ConfigError(
            field, str(path), f"{what} of UTF-8 text (line {line} has byte 0x{bad:02x})"
        ) from None
