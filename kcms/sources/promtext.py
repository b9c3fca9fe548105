"""A strict, general parser for one line of the Prometheus text exposition format (version 0.0.4).

It is the careful slow path behind the fast decoders: it handles blanks between tokens, escaped label
values (``\\\\``, ``\\"``, ``\\n``), any label order and an optional trailing comma. It never evaluates a
value: it returns the value and timestamp text, and :func:`parse_value` / :func:`parse_timestamp` check them.
"""

from __future__ import annotations

import re

__all__ = ["LineError", "parse_sample_line", "parse_timestamp", "parse_value"]


class LineError(ValueError):
    """A line that is not a valid sample line."""


_METRIC_NAME_RE = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*", re.ASCII)
_LABEL_NAME_RE = re.compile(r"[ \t]*([a-zA-Z_][a-zA-Z0-9_]*)[ \t]*=[ \t]*\"", re.ASCII)
_FLOAT_RE = re.compile(
    r"[+-]?(?:(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|[Ii]nf|[Ii]nfinity|NaN|nan)", re.ASCII
)
_INT_RE = re.compile(r"-?[0-9]+", re.ASCII)
_TAIL_RE = re.compile(r"[ \t]+([^ \t]+)(?:[ \t]+([^ \t]+))?[ \t]*")
_BLANKS = " \t"
_ESCAPES = {"\\": "\\", '"': '"', "n": "\n"}


def parse_value(text: str) -> float:
    """A sample value as a float (may be NaN or infinite); ``ValueError`` if it is not a Go float."""
    if not _FLOAT_RE.fullmatch(text):
        raise ValueError(f"invalid sample value {text!r}")
    return float(text)


def parse_timestamp(text: str) -> int:
    """A sample timestamp in milliseconds; ``ValueError`` if it is not a 64-bit integer."""
    if not _INT_RE.fullmatch(text) or len(text) > 20:
        raise ValueError(f"invalid timestamp {text!r}")
    ms = int(text)
    if not -(2**63) <= ms < 2**63:
        raise ValueError(f"timestamp out of range {text!r}")
    return ms


def _label_value(line: str, i: int) -> tuple[str, int]:
    """Read a quoted label value whose opening quote ends just before ``i``; return it and the index after it."""
    out: list[str] = []
    start = i
    n = len(line)
    while True:
        q = line.find('"', i)
        b = line.find("\\", i, q if q >= 0 else n)
        if q < 0:
            raise LineError("unterminated label value")
        if b < 0:
            out.append(line[start:q])
            return "".join(out), q + 1
        out.append(line[start:b])
        if b + 1 >= n:
            raise LineError("unterminated escape sequence")
        esc = _ESCAPES.get(line[b + 1])
        if esc is None:
            raise LineError(f"invalid escape sequence '\\{line[b + 1]}'")
        out.append(esc)
        i = start = b + 2


def parse_sample_line(line: str) -> tuple[str, dict[str, str], str, str | None]:
    """Split a sample line into (metric name, labels, value text, timestamp text or None).

    Raises :class:`LineError` if the line is not a well-formed sample line. Comment and blank lines
    are the caller's business.
    """
    i = 0
    n = len(line)
    while i < n and line[i] in _BLANKS:
        i += 1
    m = _METRIC_NAME_RE.match(line, i)
    if m is None:
        raise LineError("invalid metric name")
    name = m.group()
    i = j = m.end()
    while i < n and line[i] in _BLANKS:
        i += 1
    labels: dict[str, str] = {}
    if i < n and line[i] != "{":
        i = j
    elif i < n:
        i += 1
        while True:
            while i < n and line[i] in _BLANKS:
                i += 1
            if i < n and line[i] == "}":
                i += 1
                break
            lm = _LABEL_NAME_RE.match(line, i)
            if lm is None:
                raise LineError("invalid label name")
            key = lm.group(1)
            value, i = _label_value(line, lm.end())
            if key in labels:
                raise LineError(f"duplicate label {key!r}")
            labels[key] = value
            while i < n and line[i] in _BLANKS:
                i += 1
            if i < n and line[i] == ",":
                i += 1
                continue
            if i < n and line[i] == "}":
                i += 1
                break
            raise LineError("expected ',' or '}' after a label value")
    t = _TAIL_RE.fullmatch(line, i)
    if t is None:
        raise LineError("expected a value and an optional timestamp after a blank")
    return name, labels, t.group(1), t.group(2)
