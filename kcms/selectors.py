"""Kubernetes label selectors and field selectors (the ``labelSelector`` / ``fieldSelector`` query syntax).

Label selectors follow ``k8s.io/apimachinery/pkg/labels.Parse``: comma-separated requirements, each one of
``key=value``, ``key==value``, ``key!=value``, ``key in (v1,v2)``, ``key notin (v1,v2)``, ``key`` (exists),
``!key`` (does not exist), ``key>N`` / ``key<N`` (integer comparison). Whitespace between tokens is ignored.
Keys are qualified names (optional DNS-subdomain prefix and ``/``, then a name of at most 63 characters);
values are empty or at most 63 characters of ``[A-Za-z0-9._-]`` starting and ending with an alphanumeric.
``str(selector)`` is the canonical text: requirements sorted by key, set values sorted.

Field selectors follow ``k8s.io/apimachinery/pkg/fields.ParseSelector``: comma-separated ``field=value``,
``field==value`` or ``field!=value`` terms; ``\\``, ``\\,`` and ``\\=`` escape characters in values.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "object_filter",
    "FieldRequirement",
    "FieldSelector",
    "LabelSelector",
    "Requirement",
    "SelectorError",
    "parse_field_selector",
    "parse_label_selector",
]


class SelectorError(ValueError):
    """A selector that cannot be parsed or is not allowed here."""


_NAME_RE = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?", re.ASCII)
_DNS1123_SUBDOMAIN_RE = re.compile(
    r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*", re.ASCII
)
_INT_RE = re.compile(r"[+-]?[0-9]+", re.ASCII)
_INT64_DIGITS = 19  # 2**63 has 19 digits: longer numbers are out of range, not parsed at all


def _int64(text: str) -> int | None:
    """``text`` as an int64 (apimachinery's ``strconv.ParseInt(v, 10, 64)``), or None.

    The length is checked before ``int()``: a client's 5 000-digit number must neither cost
    quadratic time nor hit Python's digit limit (a ValueError that is not a SelectorError)."""
    if not _INT_RE.fullmatch(text) or len(text.lstrip("+-").lstrip("0")) > _INT64_DIGITS:
        return None
    value = int(text)
    return value if -(2**63) <= value < 2**63 else None


def _shown(text: str, limit: int = 100) -> str:
    """``repr(text)``, cut to ``limit`` characters: error messages stay bounded."""
    if len(text) <= limit:
        return repr(text)
    return f"{text[:limit]!r}...({len(text)} characters)"


def validate_label_key(key: str) -> str | None:
    """Return why ``key`` is not a valid label key (a qualified name), or ``None`` if it is."""
    prefix, slash, name = key.rpartition("/")
    if slash:
        if not prefix:
            return f"prefix part of {_shown(key)} must be non-empty"
        if len(prefix) > 253:
            return f"prefix part of {_shown(key)} must be no more than 253 characters"
        if not _DNS1123_SUBDOMAIN_RE.fullmatch(prefix):
            return f"prefix part of {_shown(key)} must be a lowercase RFC 1123 subdomain"
    if not name:
        return f"name part of {_shown(key)} must be non-empty"
    if len(name) > 63:
        return f"name part of {_shown(key)} must be no more than 63 characters"
    if not _NAME_RE.fullmatch(name):
        return (
            f"name part of {_shown(key)} must consist of alphanumeric characters, '-', '_' or '.', "
            "and must start and end with an alphanumeric character"
        )
    return None


def validate_label_value(value: str) -> str | None:
    """Return why ``value`` is not a valid label value, or ``None`` if it is (the empty value is valid)."""
    if not value:
        return None
    if len(value) > 63:
        return f"values[0][{_shown(value)}]: must be no more than 63 characters"
    if not _NAME_RE.fullmatch(value):
        return (
            f"invalid label value: {_shown(value)}: a valid label must be an empty string or consist of "
            "alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character"
        )
    return None


@dataclass(frozen=True, slots=True)
class Requirement:
    """One label requirement. ``operator`` is one of ``= == != in notin exists ! > <``."""

    key: str
    operator: str
    values: tuple[str, ...] = ()  # sorted, without duplicates

    def matches(self, labels: Mapping[str, str]) -> bool:
        """Whether ``labels`` satisfy this requirement (apimachinery semantics)."""
        op = self.operator
        if op == "exists":
            return self.key in labels
        if op == "!":
            return self.key not in labels
        value = labels.get(self.key)
        if op in ("=", "==", "in"):
            return value is not None and value in self.values
        if op in ("!=", "notin"):
            return value is None or value not in self.values
        # > and <: both sides must be integers (apimachinery parses label values as int64)
        have = None if value is None else _int64(value)
        want = _int64(self.values[0])
        if have is None or want is None:
            return False
        return have > want if op == ">" else have < want

    def __str__(self) -> str:
        op = self.operator
        if op == "exists":
            return self.key
        if op == "!":
            return "!" + self.key
        if op in ("in", "notin"):
            return f"{self.key} {op} ({','.join(self.values)})"
        return f"{self.key}{op}{self.values[0]}"


@dataclass(frozen=True, slots=True)
class LabelSelector:
    """A parsed label selector: the AND of its requirements (none: matches everything)."""

    requirements: tuple[Requirement, ...] = ()

    @property
    def empty(self) -> bool:
        """True if the selector has no requirement and so matches every object."""
        return not self.requirements

    def matches(self, labels: Mapping[str, str]) -> bool:
        """Whether ``labels`` satisfy every requirement."""
        for r in self.requirements:
            if not r.matches(labels):
                return False
        return True

    def __str__(self) -> str:
        return ",".join(str(r) for r in self.requirements)


# ---------------------------------------------------------------- label selector lexer and parser

_TOKEN_RE = re.compile(r"\s*(?:(!=|==|=|!|<|>|\(|\)|,)|([^\s!=<>(),]+))")


def _tokenize(text: str) -> list[tuple[str, str, int]]:
    """Split ``text`` into (kind, literal, position) tokens; kind is "op" or "id"."""
    tokens: list[tuple[str, str, int]] = []
    pos = 0
    n = len(text)
    while pos < n:
        m = _TOKEN_RE.match(text, pos)
        if m is None or m.end() == pos:
            # only trailing whitespace is left
            if text[pos:].strip() == "":
                break
            raise SelectorError(f"unable to parse requirement: unexpected character at position {pos}")
        if m.group(1) is not None:
            tokens.append(("op", m.group(1), m.start(1)))
        elif m.group(2) is not None:
            tokens.append(("id", m.group(2), m.start(2)))
        else:
            break
        pos = m.end()
    return tokens


class _LabelParser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens = _tokenize(text)
        self.i = 0

    def peek(self) -> tuple[str, str, int]:
        if self.i < len(self.tokens):
            return self.tokens[self.i]
        return ("eos", "", len(self.text))

    def take(self) -> tuple[str, str, int]:
        tok = self.peek()
        self.i += 1
        return tok

    def fail(self, msg: str, pos: int) -> SelectorError:
        return SelectorError(f"unable to parse requirement: {msg} (at position {pos} of {_shown(self.text)})")

    def parse(self) -> LabelSelector:
        reqs: list[Requirement] = []
        if not self.tokens:
            return LabelSelector()
        while True:
            reqs.append(self.requirement())
            kind, lit, pos = self.take()
            if kind == "eos":
                break
            if lit != ",":
                raise self.fail(f"found {_shown(lit)}, expected: ',' or end of string", pos)
            if self.peek()[0] == "eos":
                raise self.fail("found end of string, expected: identifier or '!'", len(self.text))
        reqs.sort(key=lambda r: r.key)
        return LabelSelector(tuple(reqs))

    def key(self) -> tuple[str, int]:
        kind, lit, pos = self.take()
        if kind != "id":
            found = "end of string" if kind == "eos" else repr(lit)
            raise self.fail(f"found {found}, expected: identifier", pos)
        why = validate_label_key(lit)
        if why:
            raise self.fail(f"invalid label key {_shown(lit)}: {why}", pos)
        return lit, pos

    def requirement(self) -> Requirement:
        kind, lit, pos = self.peek()
        if kind == "op" and lit == "!":
            self.take()
            key, _ = self.key()
            return Requirement(key, "!")
        key, kpos = self.key()
        kind, lit, pos = self.peek()
        if kind == "eos" or lit == ",":
            return Requirement(key, "exists")
        self.take()
        if kind == "id" and lit in ("in", "notin"):
            values = self.value_set()
            return Requirement(key, lit, tuple(sorted(set(values))))
        if kind != "op" or lit not in ("=", "==", "!=", ">", "<"):
            found = repr(lit)
            raise self.fail(f"found {found}, expected: in, notin, =, ==, !=, gt, lt", pos)
        op = lit
        kind, vlit, vpos = self.peek()
        if kind == "eos" or vlit == ",":
            value = ""
        elif kind == "id":
            self.take()
            value = vlit
        else:
            raise self.fail(f"found {_shown(vlit)}, expected: identifier", vpos)
        if op in (">", "<"):
            if _int64(value) is None:
                raise self.fail(
                    f"for 'Gt', 'Lt' operators, the value must be an integer, not {_shown(value, 40)}", vpos
                )
        else:
            why = validate_label_value(value)
            if why:
                raise self.fail(why, vpos)
        return Requirement(key, op, (value,))

    def value_set(self) -> list[str]:
        kind, lit, pos = self.take()
        if lit != "(":
            raise self.fail(f"found {_shown(lit)}, expected: '('", pos)
        values: list[str] = []
        expect_value = True
        while True:
            kind, lit, pos = self.take()
            if kind == "eos":
                raise self.fail("found end of string, expected: ')'", pos)
            if lit == ")":
                if expect_value:
                    values.append("")
                break
            if lit == ",":
                if expect_value:
                    values.append("")
                expect_value = True
                continue
            if kind == "id" and expect_value:
                why = validate_label_value(lit)
                if why:
                    raise self.fail(why, pos)
                values.append(lit)
                expect_value = False
                continue
            raise self.fail(f"found {_shown(lit)}, expected: ',' or ')'", pos)
        return values


def parse_label_selector(text: str) -> LabelSelector:
    """Parse a label selector; the empty (or all-blank) string selects everything.

    Raises :class:`SelectorError` naming the problem and its position.
    """
    if not isinstance(text, str):
        raise SelectorError(f"label selector must be a string, not {type(text).__name__}")
    return _LabelParser(text).parse()


# ---------------------------------------------------------------- field selectors


@dataclass(frozen=True, slots=True)
class FieldRequirement:
    """One field term: ``field op value`` with ``op`` one of ``=``, ``==``, ``!=``."""

    field: str
    operator: str
    value: str

    def __str__(self) -> str:
        escaped = self.value.replace("\\", "\\\\").replace(",", "\\,").replace("=", "\\=")
        return f"{self.field}{self.operator}{escaped}"


@dataclass(frozen=True, slots=True)
class FieldSelector:
    """A parsed field selector: the AND of its terms (none: matches everything)."""

    requirements: tuple[FieldRequirement, ...] = ()

    @property
    def empty(self) -> bool:
        """True if the selector has no term and so matches every object."""
        return not self.requirements

    def matches(self, fields: Mapping[str, str]) -> bool:
        """Whether ``fields`` satisfy every term (a missing field counts as the empty string)."""
        for r in self.requirements:
            have = fields.get(r.field, "")
            if (have == r.value) == (r.operator == "!="):
                return False
        return True

    def required_value(self, field: str) -> str | None:
        """The value an ``=``/``==`` term requires of ``field`` (for point lookups), or ``None``."""
        for r in self.requirements:
            if r.field == field and r.operator != "!=":
                return r.value
        return None

    def __str__(self) -> str:
        return ",".join(str(r) for r in self.requirements)


def _split_unescaped(text: str, sep: str) -> list[str]:
    parts: list[str] = []
    start = 0
    i = 0
    n = len(text)
    while i < n:
        c = text[i]
        if c == "\\":
            i += 2
            continue
        if c == sep:
            parts.append(text[start:i])
            start = i + 1
        i += 1
    parts.append(text[start:])
    return parts


def _unescape_field_value(value: str, selector: str) -> str:
    out: list[str] = []
    i = 0
    n = len(value)
    while i < n:
        c = value[i]
        if c == "\\":
            if i + 1 >= n or value[i + 1] not in "\\,=":
                raise SelectorError(
                    f"invalid field selector {_shown(selector)}: invalid escape sequence in {_shown(value)}"
                )
            out.append(value[i + 1])
            i += 2
            continue
        if c in ",=":
            raise SelectorError(
                f"invalid field selector {_shown(selector)}: unescaped {c!r} in value {_shown(value)}"
            )
        out.append(c)
        i += 1
    return "".join(out)


def parse_field_selector(text: str, allowed: set[str] | frozenset[str]) -> FieldSelector:
    """Parse a field selector whose fields must all be in ``allowed``.

    Raises :class:`SelectorError` for bad syntax or a field that is not supported (naming it).
    """
    if not isinstance(text, str):
        raise SelectorError(f"field selector must be a string, not {type(text).__name__}")
    reqs: list[FieldRequirement] = []
    for part in _split_unescaped(text, ","):
        if not part.strip():
            continue
        # the first operator in the term splits it; "!=" and "==" before "="
        idx = -1
        op = ""
        i = 0
        while i < len(part):
            c = part[i]
            if c == "\\":
                i += 2
                continue
            if c == "!" and part.startswith("!=", i):
                idx, op = i, "!="
                break
            if c == "=":
                idx, op = i, "==" if part.startswith("==", i) else "="
                break
            i += 1
        if idx < 0:
            raise SelectorError(f"invalid field selector {_shown(text)}: can't understand {_shown(part)}")
        field = part[:idx].strip()
        value = _unescape_field_value(part[idx + len(op) :].strip(), text)
        if field not in allowed:
            raise SelectorError(f"field label not supported: {_shown(field)}")
        reqs.append(FieldRequirement(field, op, value))
    return FieldSelector(tuple(reqs))


def object_filter(
    labels: LabelSelector, fields: FieldSelector, namespaced: bool
) -> Callable[[Any], bool] | None:
    """The filter of a ``labelSelector`` and a ``fieldSelector`` (``metadata.name``,
    ``metadata.namespace``) over inventory records (``.labels``, ``.name``, ``.namespace``: pods
    when ``namespaced``, nodes otherwise); None when both accept everything."""
    if labels.empty and fields.empty:
        return None

    def keep(obj: Any) -> bool:
        if not labels.empty and not labels.matches(obj.labels):
            return False
        return fields.empty or fields.matches(
            {"metadata.name": obj.name, "metadata.namespace": obj.namespace if namespaced else ""}
        )

    return keep
