"""Kubernetes' IP, CIDR and URL CEL libraries and cel-go's ``format`` for DRA selectors.

Where it sits: beside ``config.dra_cel_lib`` (its ``EXTENSIONS`` take these in); ``config.dra_cel``
registers them with every compiled selector. Upstream: k8s.io/apiserver/pkg/cel/library
``ip.go``, ``cidr.go``, ``urls.go`` and cel-go ``ext/formatting.go`` (``ext.Strings`` v2). An IP,
a CIDR or a URL is a string with a private prefix (as ``config.dra_cel`` tags versions and
quantities), so ``==`` compares them by their canonical form. Addresses follow Go's ``netip``
(no zones, no IPv4-mapped IPv6; ``isGlobalUnicast`` is Go's, which counts private ranges);
URLs are parsed with ``urllib.parse`` under Go's ``url.ParseRequestURI`` rule (an absolute URI
or an absolute path), which agrees with Go on ordinary URLs, not on every malformed one.
"""

from __future__ import annotations

import datetime
import ipaddress
import math
import re
from decimal import Decimal
from typing import Any, NoReturn
from urllib.parse import parse_qs, quote, urlsplit

IP = "\x00ip:"
CIDR = "\x00cidr:"
URL = "\x00url:"

Addr = ipaddress.IPv4Address | ipaddress.IPv6Address


def _fail(msg: str) -> NoReturn:
    raise ValueError(msg)


def _parse_ip(text: str) -> Addr:
    if "%" in text:
        _fail(f"IP address {text!r} with zone value is not allowed")
    try:
        addr = ipaddress.ip_address(text)
    except ValueError:
        return _fail(f"IP Address {text!r} parse error during conversion from string")
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        _fail(f"IPv4-mapped IPv6 address {text!r} is not allowed")
    return addr


def _ip_of(x: Any) -> Addr:
    if isinstance(x, str) and x.startswith(IP):
        return ipaddress.ip_address(x[len(IP) :])
    return _fail(f"expected an IP address, got {x!r}")


def ip(text: str) -> str:
    return IP + str(_parse_ip(text))


def is_ip(text: str) -> bool:
    try:
        _parse_ip(text)
    except ValueError:
        return False
    return True


def ip_is_canonical(text: str) -> bool:
    return str(_parse_ip(text)) == text


def _global_unicast(a: Addr) -> bool:
    # Go's netip.Addr.IsGlobalUnicast: not unspecified, loopback, multicast, link-local or
    # the IPv4 broadcast address (private ranges are global unicast in Go).
    if a.is_unspecified or a.is_loopback or a.is_multicast or a.is_link_local:
        return False
    return a != ipaddress.IPv4Address("255.255.255.255")


def _link_local_multicast(a: Addr) -> bool:
    if isinstance(a, ipaddress.IPv4Address):
        return a in ipaddress.ip_network("224.0.0.0/24")
    return a.is_multicast and (a.packed[1] & 0x0F) == 0x02


def _parse_cidr(text: str) -> ipaddress.IPv4Interface | ipaddress.IPv6Interface:
    addr, slash, bits = text.partition("/")
    if not slash or not bits.isdigit() or (len(bits) > 1 and bits[0] == "0") or "%" in addr:
        _fail(f"network address parse error during conversion from string: {text!r}")
    try:
        iface = ipaddress.ip_interface(text)
        ipaddress.ip_address(addr)  # ip_interface accepts forms netip.ParsePrefix refuses
    except ValueError:
        return _fail(f"network address parse error during conversion from string: {text!r}")
    if isinstance(iface, ipaddress.IPv6Interface) and iface.ip.ipv4_mapped is not None:
        _fail(f"IPv4-mapped IPv6 address {text!r} is not allowed")
    return iface


def _cidr_of(x: Any) -> ipaddress.IPv4Interface | ipaddress.IPv6Interface:
    if isinstance(x, str) and x.startswith(CIDR):
        return ipaddress.ip_interface(x[len(CIDR) :])
    return _fail(f"expected a CIDR, got {x!r}")


def _cidr_text(iface: ipaddress.IPv4Interface | ipaddress.IPv6Interface) -> str:
    return f"{CIDR}{iface.ip}/{iface.network.prefixlen}"


def cidr(text: str) -> str:
    return _cidr_text(_parse_cidr(text))


def is_cidr(text: str) -> bool:
    try:
        _parse_cidr(text)
    except ValueError:
        return False
    return True


def contains_ip(c: Any, x: Any) -> bool:
    addr = _parse_ip(x) if isinstance(x, str) and not x.startswith(IP) else _ip_of(x)
    net = _cidr_of(c).network
    return addr.version == net.version and addr in net


def contains_cidr(c: Any, x: Any) -> bool:
    other = _parse_cidr(x) if isinstance(x, str) and not x.startswith(CIDR) else _cidr_of(x)
    net = _cidr_of(c).network
    inner = other.network
    return (
        inner.version == net.version
        and inner.prefixlen >= net.prefixlen
        and inner.network_address in net
    )


def masked(c: Any) -> str:
    net = _cidr_of(c).network
    return f"{CIDR}{net.network_address}/{net.prefixlen}"


def _url_of(x: Any) -> str:
    if isinstance(x, str) and x.startswith(URL):
        return x[len(URL) :]
    return str(_fail(f"expected a URL, got {x!r}"))


_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*:")


def _parse_url(text: str) -> str:
    # Go's url.ParseRequestURI: an absolute URI (scheme:...) or an absolute path; no spaces
    # or control characters; a port of digits only.
    bad = not text or any(ord(c) < 0x21 or ord(c) == 0x7F for c in text)
    if not bad and not _SCHEME.match(text) and not text.startswith("/"):
        bad = True
    if not bad:
        try:
            parts = urlsplit(text)
            parts.port  # noqa: B018 -- raises on a port that is not a number
        except ValueError:
            bad = True
    if bad:
        _fail(f"URL parse error during conversion from string: {text!r}")
    return URL + text


def url(text: str) -> str:
    return _parse_url(text)


def is_url(text: str) -> bool:
    try:
        _parse_url(text)
    except ValueError:
        return False
    return True


def _host(x: Any) -> str:
    return urlsplit(_url_of(x)).netloc.rpartition("@")[2]


def _hostname(x: Any) -> str:
    host = _host(x)
    if host.startswith("["):
        return host[1 : host.find("]")]
    return host.rpartition(":")[0] if ":" in host else host


def _port(x: Any) -> str:
    host = _host(x)
    tail = host[host.find("]") + 1 :] if host.startswith("[") else host
    return tail.rpartition(":")[2] if ":" in tail else ""


def _escaped_path(x: Any) -> str:
    return quote(urlsplit(_url_of(x)).path, safe="/!$&'()*+,;=:@-._~%")


def _query(x: Any) -> dict[str, list[str]]:
    return parse_qs(urlsplit(_url_of(x)).query, keep_blank_values=True)


# --- cel-go ext.Strings v2 ``format`` (ext/formatting.go, the pre-v4 formatter) ---


def _type_name(x: Any) -> str:
    if isinstance(x, bool):
        return "bool"
    return {int: "int", float: "double", str: "string", bytes: "bytes", list: "list"}.get(
        type(x), "map" if isinstance(x, dict) else type(x).__name__
    )


def _as_string(x: Any, quoted: bool = False) -> str:
    if isinstance(x, bool):
        return "true" if x else "false"
    if x is None:
        return "null"
    if isinstance(x, list):
        return "[" + ", ".join(_as_string(v, True) for v in x) + "]"
    if isinstance(x, dict):
        pairs = sorted((_as_string(k, True), _as_string(v, True)) for k, v in x.items())
        return "{" + ", ".join(f"{k}:{v}" for k, v in pairs) + "}"
    if isinstance(x, float):
        if not quoted:  # a double on its own: CEL's string(); inside a list or map: %.6f
            return _float_string(x)
        special = _float_string(x) if math.isinf(x) or math.isnan(x) else None
        return f'"{special}"' if special else f"{x:.6f}"
    if isinstance(x, bytes):
        text = x.decode("utf-8", "replace")
        return f"b{_go_quote(text)}" if quoted else text
    if isinstance(x, datetime.datetime | datetime.timedelta):
        return _time_string(x, quoted)
    text = str(x)
    return _go_quote(text) if quoted and isinstance(x, str) else text


def _go_quote(s: str) -> str:
    out = s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\t", "\\t")
    return f'"{out}"'


def _float_string(x: float) -> str:
    """Go's ``strconv.FormatFloat(x, 'g', -1, 64)`` (CEL's ``string(double)``): the shortest
    digits, in exponent form when the exponent is below -4 or at least 6."""
    if math.isnan(x):
        return "NaN"
    if math.isinf(x):
        return "+Inf" if x > 0 else "-Inf"
    if x == 0:
        return "-0" if math.copysign(1, x) < 0 else "0"
    sign, digits, exp = Decimal(repr(x)).normalize().as_tuple()
    assert isinstance(exp, int)
    text = "".join(map(str, digits))
    e = len(text) + exp - 1
    minus = "-" if sign else ""
    if e < -4 or e >= 6:
        mant = text[0] + ("." + text[1:] if len(text) > 1 else "")
        return f"{minus}{mant}e{'-' if e < 0 else '+'}{abs(e):02d}"
    if exp >= 0:
        return minus + text + "0" * exp
    point = len(text) + exp
    return (
        minus
        + (text[:point] if point > 0 else "0")
        + "."
        + "0" * max(0, -point)
        + text[max(point, 0) :]
    )


def _time_string(x: datetime.datetime | datetime.timedelta, quoted: bool) -> str:
    if isinstance(x, datetime.datetime):
        text = x.isoformat().replace("+00:00", "Z")
        if "." in text:  # Go's RFC3339Nano: fractional seconds without trailing zeros
            head, _, tail = text.partition(".")
            zone = tail.lstrip("0123456789")
            digits = tail[: len(tail) - len(zone)].rstrip("0")
            text = head + ("." + digits if digits else "") + zone
        return f'timestamp("{text}")' if quoted else text
    micros = x // datetime.timedelta(microseconds=1)
    whole, part = divmod(abs(micros), 1_000_000)
    text = ("-" if micros < 0 else "") + str(whole) + (f".{part:06d}".rstrip("0") if part else "")
    return f'duration("{text}s")' if quoted else f"{text}s"


def _grouped(text: str) -> str:
    # golang.org/x/text's printer (English) groups the integer part by thousands.
    sign = "-" if text.startswith("-") else ""
    whole, dot, frac = text.lstrip("-").partition(".")
    if whole.isdigit():
        whole = f"{int(whole):,}"
    return sign + whole + dot + frac


def _float_arg(x: Any, clause: str) -> float:
    if isinstance(x, str) and x in ("NaN", "Infinity", "-Infinity"):
        return float(x.replace("Infinity", "inf"))
    if not isinstance(x, float):
        _fail(
            f"error during formatting: {clause} clause can only be used on doubles, "
            f"was given {_type_name(x)}"
        )
    return float(x)


_SUPERSCRIPT = str.maketrans(
    "0123456789", "\u2070\u00b9\u00b2\u00b3\u2074\u2075\u2076\u2077\u2078\u2079"
)


def _special(v: float) -> str | None:
    # golang.org/x/text's printer writes infinities as the symbol.
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "\u221e" if v > 0 else "-\u221e"
    return None


def _clause(verb: str, precision: int | None, x: Any) -> str:
    def integral(name: str) -> int:
        if isinstance(x, bool) or not isinstance(x, int):
            _fail(
                f"error during formatting: {name} clause can only be used on integers, "
                f"was given {_type_name(x)}"
            )
        return int(x)

    if verb == "s":
        return _as_string(x)
    if verb == "d":
        return str(integral("decimal"))
    if verb == "f":
        v = _float_arg(x, "fixed-point")
        return _special(v) or _grouped(f"{v:.{6 if precision is None else precision}f}")
    if verb == "e":
        # golang.org/x/text's printer, no locale: "2.718280×10⁰⁰" (superscript exponent;
        # cel-go passes the precision as a width, so it is always 6 digits).
        v = _float_arg(x, "scientific")
        width = 6 if precision is None else precision
        special = _special(v)
        if special:
            return special.rjust(width)
        mantissa, _, exp = f"{v:.6e}".partition("e")
        sign = "\u207b" if exp.startswith("-") else ""
        digits = exp.lstrip("+-").translate(_SUPERSCRIPT)
        return f"{mantissa}\u00d710{sign}{digits}".rjust(width)
    if verb == "b":
        if isinstance(x, bool):
            return "1" if x else "0"
        return format(integral("binary"), "b")
    if verb in "xX":
        if isinstance(x, str | bytes):
            raw = x.encode() if isinstance(x, str) else x
            text = raw.hex()
        else:
            text = format(integral("hex"), "x")
        return text.upper() if verb == "X" else text
    if verb == "o":
        return format(integral("octal"), "o")
    return str(_fail(f'could not parse formatting clause: unrecognized formatting clause "{verb}"'))


def format_string(fmt: str, args: list[Any]) -> str:
    out: list[str] = []
    i = n = 0
    while i < len(fmt):
        if fmt[i] != "%":
            out.append(fmt[i])
            i += 1
            continue
        if fmt[i + 1 : i + 2] == "%":
            out.append("%")
            i += 2
            continue
        if n >= len(args):
            _fail(f"index {n} out of range")
        if i + 1 >= len(fmt):
            _fail("unexpected end of string")
        j = i + 1
        precision = None
        if fmt[j] == ".":
            k = j + 1
            while k < len(fmt) and fmt[k].isascii() and fmt[k].isdigit():
                k += 1
            if k >= len(fmt):
                _fail(
                    "could not parse formatting clause: could not find end of precision specifier"
                )
            precision = int(fmt[j + 1 : k]) if k > j + 1 else _fail("error while parsing precision")
            j = k
        out.append(_clause(fmt[j], precision, args[n]))
        i = j + 1
        n += 1
    return "".join(out)


NET: dict[str, Any] = {
    "ip": ip,
    "isIP": is_ip,
    "family": lambda a: _ip_of(a).version,
    "isUnspecified": lambda a: _ip_of(a).is_unspecified,
    "isLoopback": lambda a: _ip_of(a).is_loopback,
    "isLinkLocalMulticast": lambda a: _link_local_multicast(_ip_of(a)),
    "isLinkLocalUnicast": lambda a: (not _ip_of(a).is_multicast) and _ip_of(a).is_link_local,
    "isGlobalUnicast": lambda a: _global_unicast(_ip_of(a)),
    "cidr": cidr,
    "isCIDR": is_cidr,
    "containsIP": contains_ip,
    "containsCIDR": contains_cidr,
    "prefixLength": lambda c: _cidr_of(c).network.prefixlen,
    "masked": masked,
    "url": url,
    "isURL": is_url,
    "getScheme": lambda u: urlsplit(_url_of(u)).scheme,
    "getHost": _host,
    "getHostname": _hostname,
    "getPort": _port,
    "getEscapedPath": _escaped_path,
    "getQuery": _query,
    "format": format_string,
}


def ip_of_cidr(c: Any) -> str:
    """``cidr.ip()``: the address as written (unmasked)."""
    return IP + str(_cidr_of(c).ip)


def to_string(x: Any) -> str:
    """``string(ip)`` / ``string(cidr)``; any other value is left to the crate's ``string``."""
    for tag in (IP, CIDR):
        if isinstance(x, str) and x.startswith(tag):
            return x[len(tag) :]
    if isinstance(x, str) and x.startswith(URL):
        return x[len(URL) :]
    raise TypeError("not a tagged value")
