"""Printing: kubectl's table layout and units, JSON and YAML.

`table` lays cells out as kubectl's tab writer does (k8s.io/cli-runtime printers.GetNewTabWriter: Go's
text/tabwriter with minimum width 6 and padding 3, every cell followed by a tab, so every column,
the last one too, is padded), so `kubectl kcms top` prints byte for byte what `kubectl top` prints for
the same objects. The units are kubectl's metricsutil ones: CPU in millicores rounded up
(``Quantity.MilliValue``), memory in whole MiB (``Quantity.Value() / 2^20``), percentages of
allocatable truncated (``int64(float64(milli) / float64(allocatable milli) * 100)``).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from decimal import Decimal, InvalidOperation
from typing import Any, TextIO

import orjson

from kcms.kubectl.client import PluginError, one_line
from kcms.quantity import parse_quantity

MIN_WIDTH = 6
PADDING = 3
UNKNOWN = "<unknown>"
CELL_LIMIT = 300  # characters of one table cell (Kubernetes names: at most 253)
MAX_QUANTITY = 64  # characters: a quantity is a number and a suffix; the longest real ones are ~20


def table(rows: Sequence[Sequence[str]]) -> str:
    """The rows (the header first, if any) as kubectl's tab writer prints them. A cell from a server
    with control characters or terminal escapes is written escaped, and bounded (`CELL_LIMIT`)."""
    if not rows:
        return ""
    rows = [
        [c if c.isprintable() and len(c) <= CELL_LIMIT else one_line(c, CELL_LIMIT) for c in r] for r in rows
    ]
    widths: list[int] = []
    for row in rows:
        for i, cell in enumerate(row):
            w = max(MIN_WIDTH, len(cell) + PADDING)
            if i == len(widths):
                widths.append(w)
            elif w > widths[i]:
                widths[i] = w
    return "".join("".join(cell.ljust(widths[i]) for i, cell in enumerate(row)) + "\n" for row in rows)


def quantity(value: Any, what: str) -> Decimal:
    """A Kubernetes quantity from an API answer; PluginError naming ``what`` when it is not one."""
    if value is None:
        return Decimal(0)  # an absent resource reads as zero, as in Go's ResourceList
    if not isinstance(value, str):
        raise PluginError(f"{what}: the quantity {one_line(repr(value), 60)} is not a string")
    if len(value) > MAX_QUANTITY:
        raise PluginError(f"{what}: {one_line(value, 60)} is not a quantity (over {MAX_QUANTITY} characters)")
    try:
        q = parse_quantity(value)
    except (ValueError, InvalidOperation):
        raise PluginError(f"{what}: {one_line(value, 60)} is not a quantity") from None
    if not q.is_finite():
        raise PluginError(f"{what}: {one_line(value, 60)} is not a quantity")
    return q


def milli(q: Decimal) -> int:
    """Go's Quantity.MilliValue(): thousandths, rounded up."""
    return math.ceil(q * 1000)


def cpu_cell(q: Decimal) -> str:
    return f"{milli(q)}m"


def memory_cell(q: Decimal) -> str:
    return f"{int(math.ceil(q)) // (1 << 20)}Mi" if q >= 0 else f"{-(int(math.ceil(-q)) // (1 << 20))}Mi"


def percent_cell(used: Decimal, available: Decimal | None) -> str:
    if available is None:
        return UNKNOWN
    total = milli(available)
    if total == 0:
        return "0%"
    return f"{int(float(milli(used)) / float(total) * 100)}%"


def dump(obj: Any, fmt: str, out: TextIO | None = None) -> None:
    """Print ``obj`` as JSON (indented like kubectl) or YAML."""
    out = out or sys.stdout
    if fmt == "json":
        out.write(orjson.dumps(obj, option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        import yaml

        out.write(yaml.safe_dump(obj, sort_keys=False, allow_unicode=True, default_flow_style=False))


def typed(body: Any, items: list[dict]) -> list[dict]:
    """List items with their kind and apiVersion, which a list leaves to its own (kubectl -o json
    writes them on each item too): kind ``XList`` gives items of kind ``X``."""
    kind = body.get("kind") if isinstance(body, dict) else None
    version = body.get("apiVersion") if isinstance(body, dict) else None
    if not isinstance(kind, str) or not kind.endswith("List"):
        return items
    head = {"kind": kind.removesuffix("List")} | ({"apiVersion": version} if isinstance(version, str) else {})
    return [head | i for i in items]


def as_list(items: list[Any]) -> dict[str, Any]:
    """A v1 List, as `kubectl get a,b -o json` prints objects of several kinds."""
    return {"apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": ""}, "items": items}
