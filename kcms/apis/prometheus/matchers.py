"""PromQL label matchers as prometheus-adapter writes them, and the Go regexp rules its config uses.

A request's ``metricLabelSelector`` (custom metrics) or ``labelSelector`` (external metrics) becomes
PromQL matchers by prometheus-adapter's table (``pkg/naming/metrics_query.go``), which this module
follows exactly so that a migrated HPA selects the same series:

=================  =====================  ===========================================
selector           one value              several values (joined with ``|``)
=================  =====================  ===========================================
``k=v``, ``k==v``  ``k="v"``              (not possible in a parsed selector)
``k!=v``           ``k!="v"``             (not possible)
``k in (...)``     ``k=~"v"``             ``k=~"a|b"``
``k notin (...)``  ``k!~"v"``             ``k!~"a|b"``
``k`` (exists)     ``k!=""``              --
``!k``             ``k=""``               --
``k>N``, ``k<N``   refused: :class:`QueryBuildError` ("operator not supported")
=================  =====================  ===========================================

Values go into the regex unescaped, as in the adapter (its comment: "gives the user a little more
control"): a Kubernetes label value may contain ``.``, which in ``=~`` matches any character, so
``k in (a.b)`` also selects ``k="axb"``. Requirements come sorted by key and set values sorted, as
apimachinery's ``labels.Selector`` hands them out. Values are double-quoted with Go's ``%q`` rules
(:func:`go_quote`), which PromQL string literals accept.

The resource matchers for object names follow the same helper: one name ``pod="a"``, several
``pod=~"a|b"`` (names unescaped, joined with ``|``).

Regexps in the config (``seriesFilters``, ``name.matches``) are Go RE2 syntax; :func:`compile_go_regexp`
compiles them with Python's ``re`` after refusing what RE2 refuses and Python would accept
(backreferences, lookaround, possessive quantifiers), and :func:`go_expand` is Go's
``Regexp.ExpandString`` for ``name.as``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from kcms.selectors import LabelSelector, Requirement

__all__ = [
    "QueryBuildError",
    "compile_go_regexp",
    "go_expand",
    "go_quote",
    "label_eq",
    "label_matches",
    "label_neq",
    "label_not_matches",
    "names_matcher",
    "selector_parts",
]


class QueryBuildError(ValueError):
    """A query cannot be built for this request: an unsupported selector operator (``client_error``
    true: the request's fault, answer 400 BadRequest), or a rule that cannot serve it -- no label for
    the resource or for namespaces, a template that fails on these values (``client_error`` false:
    the configuration's fault, answer 404/503). Never a 500."""

    def __init__(self, message: str, *, client_error: bool = False) -> None:
        super().__init__(message)
        self.client_error = client_error


# ------------------------------------------------------------------------------------------------
# quoting and the four matcher forms (prometheus-adapter pkg/client/helpers.go)

_SIMPLE_ESCAPES = {
    "\a": r"\a",
    "\b": r"\b",
    "\f": r"\f",
    "\n": r"\n",
    "\r": r"\r",
    "\t": r"\t",
    "\v": r"\v",
    "\\": r"\\",
    '"': r"\"",
}


_PLAIN = re.compile(r"[ !#-\[\]-~]*")  # printable ASCII but '"' and '\\'


def go_quote(text: str) -> str:
    """``text`` as Go's ``strconv.Quote`` / ``%q`` writes it: printable characters as they are, the usual
    backslash escapes, ``\\xNN`` / ``\\uNNNN`` / ``\\UNNNNNNNN`` for the rest. PromQL reads the result
    back to ``text``."""
    if _PLAIN.fullmatch(text):  # names and label values: nothing to escape (the common, hot case)
        return f'"{text}"'
    out = ['"']
    for ch in text:
        if ch in _SIMPLE_ESCAPES:
            out.append(_SIMPLE_ESCAPES[ch])
        elif ch.isprintable() or ch == " ":
            out.append(ch)
        else:
            code = ord(ch)
            if code < 0x80:
                out.append(f"\\x{code:02x}")
            elif 0xD800 <= code <= 0xDFFF:
                out.append("\\ufffd")  # a lone surrogate is not valid UTF-8: Go writes the replacement
            elif code < 0x10000:
                out.append(f"\\u{code:04x}")
            else:
                out.append(f"\\U{code:08x}")
    out.append('"')
    return "".join(out)


def label_eq(label: str, value: str) -> str:
    return f"{label}={go_quote(value)}"


def label_neq(label: str, value: str) -> str:
    return f"{label}!={go_quote(value)}"


def label_matches(label: str, expr: str) -> str:
    return f"{label}=~{go_quote(expr)}"


def label_not_matches(label: str, expr: str) -> str:
    return f"{label}!~{go_quote(expr)}"


def names_matcher(label: str, names: Sequence[str]) -> str:
    """The matcher for the objects a request names: ``label="a"`` for one, ``label=~"a|b"`` for several."""
    target = "|".join(names)
    return label_matches(label, target) if len(names) > 1 else label_eq(label, target)


# ------------------------------------------------------------------------------------------------
# selector -> matchers


def _requirement_values(req: Requirement) -> list[str]:
    values = getattr(req, "values", ())
    if isinstance(values, str):
        return [values]
    return sorted(set(values))


def _requirement_matcher(req: Requirement) -> tuple[str, str]:
    """(matcher text, the ``LabelValuesByName`` value) for one requirement, by the adapter's table."""
    op = req.operator
    key = req.key
    if op in (">", "<"):
        raise QueryBuildError(f"operator not supported by query builder: {key}{op}", client_error=True)
    if not key:
        raise QueryBuildError("label name not specified in selector", client_error=True)
    values = _requirement_values(req)
    if op in ("exists", "!"):
        if values:
            raise QueryBuildError(f"operator {op!r} does not take values", client_error=True)
        return (label_neq(key, "") if op == "exists" else label_eq(key, "")), ""
    if not values:
        raise QueryBuildError(f"malformed selector: {key} {op} has no value", client_error=True)
    target = "|".join(values)
    if len(values) == 1:
        form = {
            "=": label_eq,
            "==": label_eq,
            "!=": label_neq,
            "in": label_matches,
            "notin": label_not_matches,
        }[op]
    else:
        form = label_matches if op in ("=", "==", "in") else label_not_matches
    return form(key, target), target


def selector_parts(selector: LabelSelector | None) -> list[tuple[str, str, str]]:
    """``(label, matcher, joined values)`` for each requirement of ``selector``, sorted by label as
    apimachinery's ``Requirements()`` returns them. Raises :class:`QueryBuildError` for ``>``/``<``."""
    if selector is None:
        return []
    reqs = sorted(selector.requirements, key=lambda r: r.key)
    out = []
    for req in reqs:
        text, joined = _requirement_matcher(req)
        out.append((req.key, text, joined))
    return out


# ------------------------------------------------------------------------------------------------
# Go regexps

# Constructs Python's re accepts and RE2 refuses (RE2 rejects them at compile time; accepting them
# would make a config valid here that prometheus-adapter refuses to start with).
_NOT_RE2 = re.compile(r"\(\?[=!]|\(\?<[=!]|\\[1-9]|\(\?P=|[*+?}][+]|\(\?>")


def compile_go_regexp(pattern: str) -> re.Pattern[str]:
    """Compile a Go (RE2) regexp with Python's ``re``: raises ``ValueError`` naming the problem.

    Go's ``\\z`` is Python's ``\\Z``; ``$`` without ``(?m)`` is end of text in Go, so it becomes an
    end-of-text assertion (Python's ``$`` also matches before a final newline); POSIX classes such as
    ``[[:alpha:]]`` become their ASCII ranges (Python would read them as plain characters); ``\\d``,
    ``\\w``, ``\\s``, ``\\b`` are ASCII as in Go. Named groups ``(?P<n>...)`` and ``(?<n>...)`` are
    both accepted. What Python cannot express (``\\pL``, ``\\Q...\\E``, flags in the middle of a
    pattern) is a ``ValueError``, never a different match."""
    stripped = re.sub(r"\\\\", "", pattern)
    bad = _NOT_RE2.search(stripped)
    if bad:
        raise ValueError(f"invalid or unsupported Perl syntax: `{bad.group()}`")
    translated = _translate_go(pattern)
    try:
        return re.compile(translated, re.ASCII)
    except re.error as exc:
        raise ValueError(f"error parsing regexp: {exc}") from None
    except RecursionError:
        raise ValueError("error parsing regexp: nested too deeply") from None


def _translate_go(pattern: str) -> str:
    out: list[str] = []
    i = 0
    in_class = False
    multiline = False
    while i < len(pattern):
        c = pattern[i]
        if c == "\\" and i + 1 < len(pattern):
            nxt = pattern[i + 1]
            if nxt == "z" and not in_class:
                out.append(r"\Z")
            elif nxt == "Z" and not in_class:
                raise ValueError(r"invalid escape sequence: `\Z`")
            else:
                out.append(pattern[i : i + 2])
            i += 2
            continue
        if in_class:
            if pattern.startswith("[:", i):
                close = pattern.find(":]", i + 2)
                name = pattern[i + 2 : close] if close > 0 else ""
                if name not in _POSIX_CLASSES:
                    raise ValueError(
                        f"invalid character class range: `{pattern[i : close + 2 if close > 0 else i + 2]}`"
                    )
                out.append(_POSIX_CLASSES[name])
                i = close + 2
                continue
            if c == "]":
                in_class = False
            out.append("\\[" if c == "[" else c)  # a "[" in a class is a literal in Go
            i += 1
            continue
        if c == "[":
            in_class = True
            out.append(c)
            # a ']' right after '[' or '[^' is a literal in both dialects
            j = i + 1
            if pattern.startswith("^", j):
                out.append("^")
                j += 1
            if pattern.startswith("]", j):
                out.append(r"\]")
                j += 1
            i = j
            continue
        if pattern.startswith("(?", i):
            m = re.match(r"\(\?([imsU-]*)(:|\))", pattern[i:])
            if m and "m" in m.group(1).split("-")[0]:
                multiline = True
            if m and "U" in m.group(1):
                raise ValueError("the (?U) flag (ungreedy) is not supported")
            if (
                pattern.startswith("(?<", i)
                and not pattern.startswith("(?<=", i)
                and not pattern.startswith("(?<!", i)
            ):
                out.append("(?P<")
                i += 3
                continue
        if c == "$" and not multiline:
            out.append(r"(?!(?s:.))")  # end of text only, unlike Python's "$"
            i += 1
            continue
        out.append(c)
        i += 1
    return "".join(out)


_POSIX_CLASSES = {
    "alnum": "0-9A-Za-z",
    "alpha": "A-Za-z",
    "ascii": "\\x00-\\x7f",
    "blank": "\\t ",
    "cntrl": "\\x00-\\x1f\\x7f",
    "digit": "0-9",
    "graph": "!-~",
    "lower": "a-z",
    "print": " -~",
    "punct": "!-/:-@\\[-`{-~",
    "space": "\\t\\n\\v\\f\\r ",
    "upper": "A-Z",
    "word": "0-9A-Za-z_",
    "xdigit": "0-9A-Fa-f",
}

_NAME_CHARS = re.compile(r"[A-Za-z0-9_]+")


def go_expand(template: str, match: re.Match[str]) -> str:
    """Go's ``Regexp.ExpandString(nil, template, src, match)``: ``$1``, ``${1}``, ``$name``, ``${name}``,
    ``$$``; the name in ``$name`` is as long as possible (``$1x`` is ``${1x}``); an unknown or unmatched
    group expands to nothing; a ``$`` not followed by a name stays as it is."""
    out: list[str] = []
    i = 0
    names = match.re.groupindex
    while i < len(template):
        c = template[i]
        if c != "$":
            out.append(c)
            i += 1
            continue
        rest = template[i + 1 :]
        if rest.startswith("$"):
            out.append("$")
            i += 2
            continue
        if rest.startswith("{"):
            close = rest.find("}")
            name = rest[1:close] if close > 0 else ""
            if not name or not _NAME_CHARS.fullmatch(name):
                out.append("$")
                i += 1
                continue
            consumed = close + 1
        else:
            m = _NAME_CHARS.match(rest)
            if not m:
                out.append("$")
                i += 1
                continue
            name = m.group()
            consumed = len(name)
        i += 1 + consumed
        if name.isdigit() and len(name) < 10 and (len(name) == 1 or name[0] != "0"):
            # Go reads at most 9 digits, without a leading zero, as a group number; anything else
            # is a name, and no group can be named by digits: it expands to nothing
            index = int(name)
            if 0 <= index <= (match.re.groups):
                out.append(match.group(index) or "")
        elif name in names:
            out.append(match.group(name) or "")
    return "".join(out)
