"""Kubernetes' ``format`` CEL library (1.31) for DRA selectors: named string validations.

Where it sits: beside ``config.dra_cel_lib``, whose ``NAMESPACED`` registers ``format.named`` and
``format.<name>()`` (rewritten to ``format_named`` / ``format_<name>`` before compiling) and
whose ``EXTENSIONS`` registers ``validate``. Upstream: k8s.io/apiserver/pkg/cel/library/format.go
over k8s.io/apimachinery's validation (the messages are apimachinery's, word for word) and
kube-openapi's strfmt. A format is a string with a private prefix; ``validate`` answers
``optional.none()`` for a valid string, else ``optional.of([messages])``.
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Callable
from typing import Any

from kallot.config import dra_cel_crate
from kallot.config.dra_cel_net import is_url

FORMAT = "\x00format:"

_LABEL = "[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_SUBDOMAIN = _LABEL + "(\\." + _LABEL + ")*"
_LABEL_1035 = "[a-z]([-a-z0-9]*[a-z0-9])?"
_KEY = "([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]"
_KEY_MSG = (
    "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an "
    "alphanumeric character"
)
_VALUE_MSG = (
    "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or "
    "'.', and must start and end with an alphanumeric character"
)
_LABEL_MSG = (
    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and "
    "must start and end with an alphanumeric character"
)
_SUBDOMAIN_MSG = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or "
    "'.', and must start and end with an alphanumeric character"
)
_1035_MSG = (
    "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an "
    "alphabetic character, and end with an alphanumeric character"
)
_UUID = re.compile(r"(?i)^[0-9a-f]{8}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{12}$")
_BASE64 = re.compile(
    r"^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=|[A-Za-z0-9+/]{4})$"
)
_TIME = re.compile(r"^([0-9]{2}):([0-9]{2}):([0-9]{2})(.[0-9]+)?(z|([+-][0-9]{2}:[0-9]{2}))$")


def _full(pattern: str, value: str) -> bool:
    return re.fullmatch(pattern, value) is not None


def _regex_error(msg: str, pattern: str, *examples: str) -> str:
    if not examples:
        return f"{msg} (regex used for validation is '{pattern}')"
    shown = " or ".join(f"'{e}', " for e in examples)
    return f"{msg} (e.g. {shown}regex used for validation is '{pattern}')"


def _max_len(n: int, unit: str = "characters") -> str:
    return f"must be no more than {n} {unit}"


def dns1123_label(value: str) -> list[str]:
    errs = []
    if len(value.encode()) > 63:
        errs.append(_max_len(63))
    if not _full(_LABEL, value):
        if _full(_SUBDOMAIN, value):
            errs.append("must not contain dots")
        else:
            errs.append(_regex_error(_LABEL_MSG, _LABEL, "my-name", "123-abc"))
    return errs


def dns1123_subdomain(value: str, unit: str = "characters") -> list[str]:
    errs = []
    if len(value.encode()) > 253:
        errs.append(_max_len(253, unit))
    if not _full(_SUBDOMAIN, value):
        errs.append(_regex_error(_SUBDOMAIN_MSG, _SUBDOMAIN, "example.com"))
    return errs


def dns1035_label(value: str) -> list[str]:
    errs = []
    if len(value.encode()) > 63:
        errs.append(_max_len(63))
    if not _full(_LABEL_1035, value):
        errs.append(_regex_error(_1035_MSG, _LABEL_1035, "my-name", "abc-123"))
    return errs


def qualified_name(value: str) -> list[str]:
    errs: list[str] = []
    parts = value.split("/")
    if len(parts) > 2:
        return [
            "a valid label key "
            + _regex_error(_KEY_MSG, _KEY, "MyName", "my.name", "123-abc")
            + " with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')"
        ]
    name = parts[-1]
    if len(parts) == 2:
        if not parts[0]:
            errs.append("prefix part must be non-empty")
        else:
            errs += ["prefix part " + m for m in dns1123_subdomain(parts[0], "bytes")]
    if not name:
        errs.append("name part must be non-empty")
    elif len(name.encode()) > 63:
        errs.append("name part " + _max_len(63, "bytes"))
    if not _full(_KEY, name):
        errs.append("name part " + _regex_error(_KEY_MSG, _KEY, "MyName", "my.name", "123-abc"))
    return errs


def label_value(value: str) -> list[str]:
    errs = []
    if len(value.encode()) > 63:
        errs.append(_max_len(63, "bytes"))
    if not _full(f"({_KEY})?", value):
        errs.append(_regex_error(_VALUE_MSG, f"({_KEY})?", "MyValue", "my_value", "12345"))
    return errs


def _mask_dash(value: str) -> str:
    # apimachinery's maskTrailingDash (generateName prefixes may end in '-').
    return value[:-2] + "a" if len(value) > 1 and value.endswith("-") else value


def _date(value: str) -> bool:
    if not re.fullmatch(r"\d{4}-\d{2}-\d{2}", value):
        return False
    try:
        datetime.date.fromisoformat(value)
    except ValueError:
        return False
    return True


def _datetime(value: str) -> bool:
    if len(value) < 4:
        return False
    parts = value.lower().split("t")
    if len(parts) < 2 or not _date(parts[0]):
        return False
    m = _TIME.fullmatch(parts[1])
    return m is not None and m[1] <= "23" and m[2] <= "59" and m[3] <= "59"


def _base64(value: str) -> bool:
    return _BASE64.fullmatch(value) is not None


def _uuid(value: str) -> bool:
    return _UUID.fullmatch(value) is not None


def _check(ok: Callable[[str], bool], msg: str) -> Callable[[str], list[str]]:
    return lambda value: [] if ok(value) else [msg]


FORMATS: dict[str, Callable[[str], list[str]]] = {
    "dns1123Label": dns1123_label,
    "dns1123Subdomain": dns1123_subdomain,
    "dns1035Label": dns1035_label,
    "qualifiedName": qualified_name,
    "dns1123LabelPrefix": lambda v: dns1123_label(_mask_dash(v)),
    "dns1123SubdomainPrefix": lambda v: dns1123_subdomain(_mask_dash(v)),
    "dns1035LabelPrefix": lambda v: dns1035_label(_mask_dash(v)),
    "labelValue": label_value,
    "uri": lambda v: [] if is_url(v) else [f'parse "{v}": invalid URI for request'],
    "uuid": _check(_uuid, "does not match the UUID format"),
    "byte": _check(_base64, "invalid base64"),
    "date": _check(_date, "invalid date"),
    "datetime": _check(_datetime, "invalid datetime"),
}


def _opt() -> Any:
    return dra_cel_crate.load().OptionalValue  # the crate's optional type, loaded late


def named(name: str) -> Any:
    return _opt().of(FORMAT + name) if name in FORMATS else _opt().none()


def validate(fmt: Any, value: str) -> Any:
    if not (isinstance(fmt, str) and fmt.startswith(FORMAT)):
        raise ValueError(f"validate() needs a format, got {fmt!r}")
    errs = FORMATS[fmt[len(FORMAT) :]](value)
    return _opt().of(errs) if errs else _opt().none()


def _constant(name: str) -> Callable[[], str]:
    return lambda: FORMAT + name


# ``format.<name>`` -> (registered name, function), for config.dra_cel_lib.NAMESPACED.
NAMESPACED_FORMATS: dict[str, tuple[str, Callable[..., Any]]] = {
    "format.named": ("format_named", named),
    **{f"format.{n}": (f"format_{n}", _constant(n)) for n in FORMATS},
}
