"""Kubernetes resource quantities: canonical formatting and parsing.

The formatting functions reproduce ``k8s.io/apimachinery/pkg/api/resource.Quantity.String()``:

* DecimalSI: the value is written as ``mantissa * 10**exponent``; factors of ten are moved from the
  mantissa into the exponent, the exponent is then lowered to a multiple of three (the mantissa grows
  by 10 or 100) and written as an SI suffix (``n u m "" k M G T P E``).
* BinarySI: values in (-1024, 1024) are written plainly; otherwise the value is written with the
  largest power of 1024 that divides it exactly (``Ki .. Ei``); a value that 1024 does not divide is
  written as a plain decimal integer.

:func:`parse_quantity` accepts the full quantity grammar and returns an exact :class:`~decimal.Decimal`
(no rounding to nano precision, unlike ``ParseQuantity``; callers that need it can round themselves).
"""

from __future__ import annotations

import decimal
import math
import re
from decimal import Decimal

__all__ = [
    "format_bytes",
    "format_cpu_nanocores",
    "format_decimal",
    "parse_quantity",
]

_DEC_SUFFIX = {-9: "n", -6: "u", -3: "m", 0: "", 3: "k", 6: "M", 9: "G", 12: "T", 15: "P", 18: "E"}
_BIN_SUFFIX = ("", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei")

# suffix -> (base, exponent)
_PARSE_SUFFIX: dict[str, tuple[int, int]] = {
    "n": (10, -9),
    "u": (10, -6),
    "m": (10, -3),
    "": (10, 0),
    "k": (10, 3),
    "M": (10, 6),
    "G": (10, 9),
    "T": (10, 12),
    "P": (10, 15),
    "E": (10, 18),
    "Ki": (1024, 1),
    "Mi": (1024, 2),
    "Gi": (1024, 3),
    "Ti": (1024, 4),
    "Pi": (1024, 5),
    "Ei": (1024, 6),
}

_QUANTITY_RE = re.compile(
    r"(?P<sign>[+-]?)(?P<num>[0-9]+(?:\.[0-9]*)?|\.[0-9]+)"
    r"(?:(?P<exp>[eE][+-]?[0-9]+)|(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]?))",
    re.ASCII,
)
_MAX_EXPONENT = 100_000  # beyond this a quantity is nonsense and arithmetic on it would be slow


def _decimal_si(mantissa: int, exponent: int) -> str:
    """Canonical DecimalSI text of ``mantissa * 10**exponent``."""
    if mantissa == 0:
        return "0"
    # strip factors of ten (the fast way for large runs of zeros)
    if mantissa % 10 == 0:
        text = str(mantissa)
        stripped = text.rstrip("0")
        exponent += len(text) - len(stripped)
        mantissa = int(stripped)
    r = exponent % 3  # Python: always 0, 1 or 2
    if r:
        mantissa *= 10**r
        exponent -= r
    if exponent < -9:
        # below nano precision apimachinery rounds up (away from zero) to a nano multiple
        div = 10 ** (-9 - exponent)
        q = -((-abs(mantissa)) // div)
        mantissa = q if mantissa > 0 else -q
        return _decimal_si(mantissa, -9)
    if exponent > 18:
        mantissa *= 10 ** (exponent - 18)
        exponent = 18
    return f"{mantissa}{_DEC_SUFFIX[exponent]}"


def format_cpu_nanocores(n: int) -> str:
    """Canonical text of a DecimalSI quantity of ``n`` nano-units (e.g. nanocores).

    >>> format_cpu_nanocores(123456000), format_cpu_nanocores(1500000000), format_cpu_nanocores(2000000000)
    ('123456u', '1500m', '2')
    """
    return _decimal_si(int(n), -9)


def format_bytes(n: int) -> str:
    """Canonical text of a BinarySI integer quantity (e.g. bytes): ``"1000"``, ``"1536Ki"``, ``"1234567"``."""
    n = int(n)
    if -1024 < n < 1024:
        return str(n)
    power = 0
    m = n
    while power < 6 and m % 1024 == 0:
        m //= 1024
        power += 1
    return f"{m}{_BIN_SUFFIX[power]}"


def format_decimal(value: float | int | Decimal) -> str:
    """Canonical DecimalSI text of an arbitrary finite number: ``0.5 -> "500m"``, ``3 -> "3"``.

    A float is taken at its shortest ``repr`` (so ``0.1`` is one tenth, not the binary fraction).
    Precision below 1e-9 is rounded up away from zero to a multiple of 1e-9, as apimachinery does
    (``1e-10 -> "1n"``). Exponents above 18 are written with the ``E`` suffix and a longer mantissa.
    Raises ``ValueError`` for NaN and infinities.
    """
    if isinstance(value, bool):
        value = int(value)
    if isinstance(value, int):
        return _decimal_si(value, 0)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"cannot format non-finite value {value!r} as a quantity")
        dec = Decimal(repr(value))
    elif isinstance(value, Decimal):
        if not value.is_finite():
            raise ValueError(f"cannot format non-finite value {value!r} as a quantity")
        dec = value
    else:
        raise TypeError(f"cannot format {type(value).__name__} as a quantity")
    sign, digits, exponent = dec.as_tuple()
    mantissa = int("".join(map(str, digits))) if digits else 0
    if sign:
        mantissa = -mantissa
    return _decimal_si(mantissa, int(exponent))


def parse_quantity(text: str) -> Decimal:
    """Parse a Kubernetes quantity (``"100m"``, ``"1.5Gi"``, ``"-2e3"``, ``".5"``, ``"12345n"``) exactly.

    Raises ``ValueError`` naming the problem for anything outside the grammar.
    """
    if not isinstance(text, str):
        raise ValueError(f"quantity must be a string, not {type(text).__name__}")
    if not text:
        raise ValueError(
            "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$': empty string"
        )
    m = _QUANTITY_RE.fullmatch(text)
    if m is None:
        raise ValueError(
            f"quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$': {text!r}"
        )
    num = m["num"]
    if num.endswith("."):
        num += "0"
    sign = "-" if m["sign"] == "-" else ""
    if m["exp"] is not None:
        exp = int(m["exp"][1:])
        if abs(exp) > _MAX_EXPONENT:
            raise ValueError(f"quantity exponent out of range: {text!r}")
        return Decimal(f"{sign}{num}E{exp}")
    base, power = _PARSE_SUFFIX[m["suffix"]]
    if base == 10:
        return Decimal(f"{sign}{num}E{power}")
    value = Decimal(f"{sign}{num}")
    with decimal.localcontext() as ctx:
        ctx.prec = len(num) + 25  # exact: 1024**6 has 19 digits
        return value * (1024**power)
