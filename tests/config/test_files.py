"""Reading a user's file: each way it cannot be read is one ConfigError line."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from kallot.config import scheduler
from kallot.config.files import read_text
from kallot.core.errors import ConfigError


def test_text_is_read_and_a_byte_order_mark_dropped(tmp_path: Path) -> None:
    p = tmp_path / "a.yaml"
    p.write_bytes(b"\xef\xbb\xbfkey: value\n")
    assert read_text(p, "--config") == "key: value\n"


@pytest.mark.parametrize(
    ("make", "why"),
    [
        pytest.param(lambda p: None, "a readable file (No such file or directory)", id="missing"),
        pytest.param(lambda p: p.mkdir(), "a readable file (Is a directory)", id="directory"),
        pytest.param(
            lambda p: p.write_bytes(b"ok: 1\nbad: \xc3\x28\n"),
            "a readable file of UTF-8 text (line 2 has byte 0xc3)",
            id="not-utf8",
        ),
    ],
)
def test_what_cannot_be_read_is_one_line_naming_field_and_path(
    tmp_path: Path, make: Callable[[Path], object], why: str
) -> None:
    p = tmp_path / "f.yaml"
    make(p)
    with pytest.raises(ConfigError) as err:
        read_text(p, "--config")
    assert str(err.value) == f"--config: got '{p}', expected {why}"


def test_a_scheduler_configuration_that_is_not_text(tmp_path: Path) -> None:
    # It used to be a UnicodeDecodeError traceback from Path.read_text.
    p = tmp_path / "kallot.yaml"
    p.write_bytes(b"\x00\x01garbage\xff\xfe")
    with pytest.raises(ConfigError, match=r"^--config: got .*, expected a readable file of UTF-8"):
        scheduler.load(p)
