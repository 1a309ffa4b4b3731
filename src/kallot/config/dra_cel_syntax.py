"""CEL source rewrites and token scans for ``config.dra_cel`` (the selector compiler).

Where it sits: between a selector's text and the ``cel`` crate (``rewrite`` runs them all).
``TOKEN`` splits an expression into tokens (strings whole). The crate lacks some of CEL's
syntax and of kube-scheduler's environment; each rewrite turns a form into one it has, with
helpers registered from ``config.dra_cel_lib``: optional selection (``rewrite_optional``: ``has()``
/ ``in``, or ``_opt_select`` / ``_opt_index`` for a real optional), optional literal entries
(``rewrite_optional_entries``), ``cel.bind`` (``rewrite_bind``), namespaced functions
(``sets.contains(`` -> ``sets_contains(``), two-variable comprehensions (``rewrite_two_var``),
``sortBy`` / ``optMap`` / ``optFlatMap`` (``rewrite_receiver_macros``), ``string()`` of an IP or
CIDR (``wrap_string_calls``), ``size()`` in code points (``rewrite_size``) and timestamp
getters with a time zone (``rewrite_zoned_getters``). ``config.dra_cel``
also uses the tokens for its cost estimate and its check of called functions.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Container

from kallot.config.dra_cel_lib import NAMESPACED

TOKEN = re.compile(
    # Raw strings (no escapes), then strings with escapes, each triple-quoted or not: a string
    # must be one token, or a macro inside one would be counted, or one outside it hidden.
    r"""(?:[bB]?[rR]|[rR][bB])(?:'{3}[\s\S]*?'{3}|"{3}[\s\S]*?"{3}|'[^'\n]*'|"[^"\n]*")"""
    r"""|[bB]?(?:'{3}(?:\\[\s\S]|[^\\])*?'{3}|"{3}(?:\\[\s\S]|[^\\])*?"{3}"""
    r"""|'(?:\\.|[^'\\\n])*'|"(?:\\.|[^"\\\n])*")"""
    r"|[A-Za-z_][A-Za-z0-9_]*"  # identifiers, keywords
    r"|\d[\w.]*"  # numbers (loosely: the parser has already accepted them)
    r"|&&|\|\||==|!=|<=|>=|\S"  # operators, punctuation
)
OPEN = {"(": ")", "[": "]", "{": "}"}
CLOSE = frozenset(OPEN.values())


def is_name(tok: str) -> bool:
    return bool(tok) and (tok[0].isalpha() or tok[0] == "_") and tok not in {"in"}


_WORDY = re.compile(r"[\w'\"]")


def _join(tokens: list[str]) -> str:
    out = ""
    for tok in tokens:
        # A space only between two word-like tokens (``a in b``); strings are whole tokens.
        if out and _WORDY.match(out[-1]) and _WORDY.match(tok[0]):
            out += " "
        out += tok
    return out


def matching(tokens: list[str], i: int, step: int) -> int:
    """The index of the bracket matching ``tokens[i]`` (``step`` -1 walks back)."""
    depth = 0
    while 0 <= i < len(tokens):
        tok = tokens[i]
        if tok in OPEN or tok in CLOSE:
            opening = tok in OPEN
            depth += 1 if opening == (step > 0) else -1
            if depth == 0:
                return i
        i += step
    raise ValueError("unbalanced brackets")


def _receiver_start(tokens: list[str], j: int) -> int:
    """Where the member/index/call chain ending at ``tokens[j]`` starts."""
    while True:
        if tokens[j] in CLOSE:
            j = matching(tokens, j, -1)
            if j > 0 and (is_name(tokens[j - 1]) or tokens[j - 1] in CLOSE):
                j -= 1
                continue
        elif not is_name(tokens[j]) and tokens[j][0] not in "'\"0123456789":
            raise ValueError(f"no receiver before {tokens[j]!r}")  # a literal is a receiver
        if j >= 2 and tokens[j - 1] == ".":
            j -= 2
            continue
        return j


def rewrite_optional(expression: str) -> str:
    """CEL's optional syntax as the ``cel`` crate understands it (it has ``has()`` and ``in``,
    not optionals): ``E.?a.?b`` then ``.orValue(D)`` / ``.hasValue()`` / ``.value()``, and
    ``E[?k]`` the same way, become ``(has(E.a) && has(E.a.b) ? E.a.b : (D))``,
    ``(has(E.a) && has(E.a.b))`` and ``E.a.b``; any other use becomes
    ``_opt_select(_opt_select(E, 'a'), 'b')`` (``_opt_index`` for ``[?k]``), an optional value
    of the crate. Optional list and map literal entries (``[?x]``, ``{?k: v}``) stay and fail
    to compile."""
    while True:
        tokens = TOKEN.findall(expression)
        at = next(
            (
                i
                for i in range(1, len(tokens) - 1)
                if tokens[i + 1] == "?" and tokens[i] in (".", "[")
            ),
            None,
        )
        if at is None:
            return expression
        start = _receiver_start(tokens, at - 1)
        path = _join(tokens[start:at])
        conds: list[str] = []
        opt = path  # the same chain through _opt_select / _opt_index (config.dra_cel_lib)
        i = at
        while i + 1 < len(tokens) and tokens[i + 1] == "?" and tokens[i] in (".", "["):
            if tokens[i] == ".":
                if i + 2 >= len(tokens) or not is_name(tokens[i + 2]):
                    return expression
                conds.append(f"has({path}.{tokens[i + 2]})")
                path = f"{path}.{tokens[i + 2]}"
                opt = f"_opt_select({opt}, '{tokens[i + 2]}')"
                i += 3
            else:
                close = matching(tokens, i, 1)
                key = _join(tokens[i + 2 : close])
                conds.append(f"({key}) in {path}")
                path = f"{path}[{key}]"
                opt = f"_opt_index({opt}, {key})"
                i = close + 1
        cond = " && ".join(conds)
        if tokens[i : i + 2] == [".", "orValue"] and tokens[i + 2 : i + 3] == ["("]:
            close = matching(tokens, i + 2, 1)
            default = _join(tokens[i + 3 : close])
            new = f"(({cond}) ? {path} : ({default}))"
        elif tokens[i : i + 4] == [".", "hasValue", "(", ")"]:
            new, close = f"({cond})", i + 3
        elif tokens[i : i + 4] == [".", "value", "(", ")"]:
            new, close = f"({path})", i + 3
        else:
            # Any other use (``.or(...)``, ``.optMap``, passed on): a real optional value.
            new, close = opt, i - 1
        expression = _join([*tokens[:start], new, *tokens[close + 1 :]])


def rewrite_namespaced(expression: str) -> str:
    """``sets.contains(`` -> ``sets_contains(`` (the crate has no namespaced functions)."""
    for dotted, (name, _) in NAMESPACED.items():
        if dotted in expression:
            expression = re.sub(rf"(?<![\w.]){re.escape(dotted)}\s*\(", f"{name}(", expression)
    return expression


MAX_BOUND_CHARS = 4 * 10_240  # a rewritten cel.bind may repeat its value: at most 4x the limit


def _top_commas(tokens: list[str], start: int, close: int) -> list[int]:
    depth, out = 0, []
    for j in range(start, close):
        tok = tokens[j]
        depth += tok in OPEN
        depth -= tok in CLOSE
        if tok == "," and depth == 0:
            out.append(j)
    return out


def rewrite_bind(expression: str) -> str:
    """``cel.bind(x, init, body)`` (``ext.Bindings``) as ``body`` with every free ``x`` replaced
    by ``(init)``: the same value (CEL expressions have no side effects), the innermost bind
    first. Left as it is (then refused as an unknown function) when ``body`` rebinds ``x``
    (a macro or a nested bind of the same name) or the result would exceed
    ``MAX_BOUND_CHARS``."""
    while True:
        tokens = TOKEN.findall(expression)
        at = None
        for i in range(len(tokens) - 3):
            if tokens[i : i + 4] == ["cel", ".", "bind", "("] and (i == 0 or tokens[i - 1] != "."):
                at = i  # the last one: innermost (or later) first
        if at is None:
            return expression
        close = matching(tokens, at + 3, 1)
        commas = _top_commas(tokens, at + 4, close)
        if len(commas) != 2 or commas[0] != at + 5 or not is_name(tokens[at + 4]):
            return expression
        var = tokens[at + 4]
        init = _join(tokens[commas[0] + 1 : commas[1]])
        body = tokens[commas[1] + 1 : close]
        out: list[str] = []
        for j, tok in enumerate(body):
            if (
                tok == var
                and j + 1 < len(body)
                and body[j + 1] == ","
                and j >= 2
                and body[j - 1] == "("
            ):
                return expression  # a macro rebinding the name
            if tok == var and (j == 0 or body[j - 1] != "."):
                out.append(f"({init})")
            else:
                out.append(tok)
        new = _join([*tokens[:at], "(", *out, ")", *tokens[close + 1 :]])
        if len(new) > MAX_BOUND_CHARS:
            return expression
        expression = new


# Two-variable comprehensions (cel-go ext.TwoVarComprehensions) -> one-variable macros over
# ``_keys(R)`` (a list's indexes or a map's keys), the value read back as ``(R)[key]``.
TWO_VAR = frozenset(
    {
        "all",
        "exists",
        "existsOne",
        "exists_one",
        "transformList",
        "transformMap",
        "transformMapEntry",
    }
)
_fresh = [0]


def _args(tokens: list[str], open_at: int) -> tuple[int, list[list[str]]]:
    close = matching(tokens, open_at, 1)
    commas = [open_at, *_top_commas(tokens, open_at + 1, close), close]
    return close, [tokens[a + 1 : b] for a, b in itertools.pairwise(commas)]


def _rebinds(body: list[str], names: set[str]) -> bool:
    """Whether a macro (or a bind) inside ``body`` binds one of ``names`` again."""
    return any(
        tok in names and j >= 1 and body[j - 1] == "(" and j + 1 < len(body) and body[j + 1] == ","
        for j, tok in enumerate(body)
    )


def _subst(body: list[str], repl: dict[str, str]) -> str:
    out = [
        repl[tok] if tok in repl and (j == 0 or body[j - 1] != ".") else tok
        for j, tok in enumerate(body)
    ]
    return _join(out)


def _last_method_call(
    tokens: list[str], names: Container[str], accept: Callable[[str, list[list[str]]], bool]
) -> tuple[int, int, list[list[str]]] | None:
    """The last ``.name(args)`` in ``tokens`` with ``name`` in ``names`` and ``accept(name,
    args)``: (index of the name, index of its closing parenthesis, its arguments). The last one
    is the innermost, so rewriting it first keeps the outer calls' arguments whole."""
    found = None
    for i in range(1, len(tokens) - 2):
        if tokens[i - 1] == "." and tokens[i] in names and tokens[i + 1] == "(":
            close, args = _args(tokens, i + 1)
            if accept(tokens[i], args):
                found = (i, close, args)
    return found


def rewrite_two_var(expression: str) -> str:
    """``R.all(i, v, P)`` as ``_keys(R).all(k, P')`` with ``i`` -> ``k`` (a fresh name) and
    ``v`` -> ``(R)[k]``; ``exists``, ``existsOne`` the same; ``transformList`` as ``map`` (after
    ``filter`` with four arguments); ``transformMap`` / ``transformMapEntry`` through
    ``_pairs_map`` / ``_entries_map`` (cel-go's ``@mapInsert``: a duplicate key is an error).
    The innermost (last) first; left as it is when a macro inside rebinds ``i`` or ``v``."""
    while True:
        tokens = TOKEN.findall(expression)
        found = _last_method_call(
            tokens,
            TWO_VAR,
            lambda name, args: (
                len(args)
                in ((3,) if name in {"all", "exists", "existsOne", "exists_one"} else (3, 4))
                and all(len(a) == 1 and is_name(a[0]) for a in args[:2])
            ),
        )
        if found is None:
            return expression
        i, close, args = found
        name = tokens[i]
        start = _receiver_start(tokens, i - 2)
        recv = _join(tokens[start : i - 1])
        iv, vv = args[0][0], args[1][0]
        if any(_rebinds(a, {iv, vv}) for a in args[2:]):
            return expression
        _fresh[0] += 1
        k = f"_kv{_fresh[0]}"
        repl = {iv: k, vv: f"({recv})[{k}]"}
        body = [_subst(a, repl) for a in args[2:]]
        keys = f"_keys({recv})"
        if name in {"all", "exists"}:
            new = f"{keys}.{name}({k}, {body[0]})"
        elif name in {"existsOne", "exists_one"}:
            new = f"{keys}.exists_one({k}, {body[0]})"
        else:
            src = f"{keys}.filter({k}, {body[0]})" if len(body) == 2 else keys
            out = body[-1]
            if name == "transformList":
                new = f"{src}.map({k}, {out})"
            elif name == "transformMap":
                new = f"_pairs_map({src}.map({k}, [{k}, {out}]))"
            else:
                new = f"_entries_map({src}.map({k}, {out}))"
        expression = _join([*tokens[:start], "(", new, ")", *tokens[close + 1 :]])


def rewrite_receiver_macros(expression: str) -> str:
    """``R.sortBy(x, K)`` (ext.Lists v2) as ``_sort_by(R, R.map(x, K))``; ``O.optMap(x, E)`` as
    ``(O.hasValue() ? optional.of(E[x := O.value()]) : optional.none())``, ``optFlatMap``
    the same without ``optional.of``."""
    names = {"sortBy", "optMap", "optFlatMap"}
    while True:
        tokens = TOKEN.findall(expression)
        found = _last_method_call(
            tokens,
            names,
            lambda _name, args: len(args) == 2 and len(args[0]) == 1 and is_name(args[0][0]),
        )
        if found is None:
            return expression
        i, close, args = found
        start = _receiver_start(tokens, i - 2)
        recv = _join(tokens[start : i - 1])
        var, body = args[0][0], args[1]
        if tokens[i] == "sortBy":
            new = f"_sort_by({recv}, ({recv}).map({var}, {_join(body)}))"
        else:
            if _rebinds(body, {var}):
                return expression
            value = _subst(body, {var: f"({recv}).value()"})
            if tokens[i] == "optMap":
                value = f"optional.of({value})"
            new = f"(({recv}).hasValue() ? {value} : optional.none())"
        expression = _join([*tokens[:start], "(", new, ")", *tokens[close + 1 :]])


def wrap_string_calls(expression: str) -> str:
    """``string(x)`` as ``_untag(string(x))``: the crate's ``string`` cannot be replaced, and an
    IP or CIDR is a tagged string (``config.dra_cel_net``) whose text is the upstream answer."""
    tokens = TOKEN.findall(expression)
    out: list[str] = []
    closers: list[int] = []
    for j, tok in enumerate(tokens):
        if (
            tok == "string"
            and j + 1 < len(tokens)
            and tokens[j + 1] == "("
            and (j == 0 or tokens[j - 1] != ".")
        ):
            out += ["_untag", "("]
            closers.append(matching(tokens, j + 1, 1))
        out.append(tok)
        while closers and closers[-1] == j:
            closers.pop()
            out.append(")")
    return _join(out)


def rewrite_size(expression: str) -> str:
    """``size(x)`` and ``x.size()`` as ``_size(x)``: the crate counts a string's UTF-8 bytes,
    CEL (and upstream) its code points (``'×'.size() == 1``)."""
    while True:
        tokens = TOKEN.findall(expression)
        at = next(
            (
                i
                for i in range(1, len(tokens) - 2)
                if tokens[i - 1] == "." and tokens[i : i + 3] == ["size", "(", ")"]
            ),
            None,
        )
        if at is None:
            break
        start = _receiver_start(tokens, at - 2)
        recv = _join(tokens[start : at - 1])
        expression = _join([*tokens[:start], "_size", "(", recv, ")", *tokens[at + 3 :]])
    tokens = TOKEN.findall(expression)
    return _join(
        [
            "_size"
            if tok == "size"
            and j + 1 < len(tokens)
            and tokens[j + 1] == "("
            and (j == 0 or tokens[j - 1] != ".")
            else tok
            for j, tok in enumerate(tokens)
        ]
    )


def _enclosing(tokens: list[str], i: int) -> int:
    depth = 0
    for j in range(i - 1, -1, -1):
        if tokens[j] in CLOSE:
            depth += 1
        elif tokens[j] in OPEN:
            if depth == 0:
                return j
            depth -= 1
    return -1


def rewrite_optional_entries(expression: str) -> str:
    """Optional entries of list and map literals: ``[a, ?b]`` as
    ``optional_unwrap([optional.of(a), b])`` and ``{k: v, ?k2: o}`` as
    ``_opt_map([[k, optional.of(v)], [k2, o]])`` (an entry only where the optional has a
    value). The innermost literal first."""
    while True:
        tokens = TOKEN.findall(expression)
        found = None
        for i in range(1, len(tokens)):
            if tokens[i] != "?" or tokens[i - 1] not in ("[", "{", ","):
                continue
            o = _enclosing(tokens, i)
            prev = tokens[o - 1] if o > 0 else ""
            literal = tokens[o] == "{" or (
                tokens[o] == "[" and not (prev in CLOSE or is_name(prev))
            )
            if o >= 0 and literal:
                found = o
        if found is None:
            return expression
        o = found
        close, items = _args(tokens, o)
        out = []
        for item in items:
            opt = bool(item) and item[0] == "?"
            body = item[1:] if opt else item
            if tokens[o] == "[":
                out.append(_join(body) if opt else f"optional.of({_join(body)})")
                continue
            depth, at = 0, -1
            for j, tok in enumerate(body):
                depth += tok in OPEN
                depth -= tok in CLOSE
                if tok == ":" and depth == 0:
                    at = j
                    break
            if at < 0:
                return expression
            key, value = _join(body[:at]), _join(body[at + 1 :])
            out.append(f"[{key}, {value if opt else f'optional.of({value})'}]")
        joined = ", ".join(out)
        new = f"optional_unwrap([{joined}])" if tokens[o] == "[" else f"_opt_map([{joined}])"
        expression = _join([*tokens[:o], new, *tokens[close + 1 :]])


def rewrite(expression: str) -> str:
    """The expression as the crate compiles it: every rewrite above, in order. A rewrite that
    cannot place a token (a receiver it cannot find) stops there and leaves the rest for the
    crate to refuse, in one line."""
    source = expression
    try:
        if "?" in source:
            source = rewrite_optional(rewrite_optional_entries(source))
        source = rewrite_namespaced(rewrite_bind(source) if "bind" in source else source)
        source = rewrite_two_var(source) if "," in source else source
        if "sortBy" in source or "optMap" in source or "optFlatMap" in source:
            source = rewrite_receiver_macros(source)
        source = wrap_string_calls(source) if "string" in source else source
        source = rewrite_size(source) if "size" in source else source
        source = rewrite_zoned_getters(source) if "get" in source else source
    except ValueError:
        return source
    return source


GETTERS = frozenset(
    {
        "getFullYear", "getMonth", "getDate", "getDayOfMonth", "getDayOfWeek", "getDayOfYear",
        "getHours", "getMinutes", "getSeconds", "getMilliseconds",
    }
)  # fmt: skip


def rewrite_zoned_getters(expression: str) -> str:
    """``t.getHours('+01:00')`` (a timestamp getter with a time zone, which the crate lacks) as
    ``_ts_get(t, 'getHours', '+01:00')``; the getters without an argument stay the crate's."""
    while True:
        tokens = TOKEN.findall(expression)
        found = _last_method_call(
            tokens, GETTERS, lambda _name, args: len(args) == 1 and bool(args[0])
        )
        if found is None:
            return expression
        i, close, (arg,) = found
        start = _receiver_start(tokens, i - 2)
        recv = _join(tokens[start : i - 1])
        new = f"_ts_get({recv}, '{tokens[i]}', {_join(arg)})"
        expression = _join([*tokens[:start], new, *tokens[close + 1 :]])
