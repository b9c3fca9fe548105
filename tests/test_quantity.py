"""Kubernetes quantity formatting (apimachinery's canonical form) and parsing."""

from __future__ import annotations

from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kcms.quantity import format_bytes, format_cpu_nanocores, format_decimal, parse_quantity

_SUFFIX_EXP = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}


@pytest.mark.parametrize(
    ("n", "text"),
    [
        (0, "0"),
        (1, "1n"),
        (10, "10n"),
        (1000, "1u"),
        (123456789, "123456789n"),
        (123456000, "123456u"),
        (1500000000, "1500m"),
        (2000000000, "2"),
        (2500000000, "2500m"),
        (100000000, "100m"),
        (10**12, "1k"),
        (12 * 10**12, "12k"),
        (-5000000, "-5m"),
        (2**63 - 1, "9223372036854775807n"),
        (9 * 10**18, "9G"),
    ],
)
def test_format_cpu_nanocores(n: int, text: str) -> None:
    assert format_cpu_nanocores(n) == text


@pytest.mark.parametrize(
    ("n", "text"),
    [
        (0, "0"),
        (1000, "1000"),
        (1023, "1023"),
        (-1023, "-1023"),
        (1024, "1Ki"),
        (1536 * 1024, "1536Ki"),
        (1048576, "1Mi"),
        (1234567, "1234567"),
        (1025, "1025"),
        (16547840, "16160Ki"),
        (3 * 2**30, "3Gi"),
        (2**60, "1Ei"),
        (2**70, "1024Ei"),
        (-2048, "-2Ki"),
    ],
)
def test_format_bytes(n: int, text: str) -> None:
    assert format_bytes(n) == text


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (0.5, "500m"),
        (1.25, "1250m"),
        (3, "3"),
        (3.0, "3"),
        (0.1, "100m"),
        (1e-10, "1n"),  # rounded up to nano precision
        (-1e-10, "-1n"),  # away from zero
        (1.0000000001, "1000000001n"),
        (1500, "1500"),
        (1e6, "1M"),
        (Decimal("0.000123"), "123u"),
        (Decimal("12e3"), "12k"),
        (1e21, "1000E"),
        (0.0, "0"),
        (True, "1"),
    ],
)
def test_format_decimal(value: object, text: str) -> None:
    assert format_decimal(value) == text  # type: ignore[arg-type]


def test_format_decimal_rejects_non_finite() -> None:
    for bad in (float("nan"), float("inf"), Decimal("NaN"), Decimal("-Infinity")):
        with pytest.raises(ValueError):
            format_decimal(bad)
    with pytest.raises(TypeError):
        format_decimal("1")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("0", Decimal(0)),
        ("100m", Decimal("0.1")),
        ("1500m", Decimal("1.5")),
        ("123456789n", Decimal("0.123456789")),
        ("5u", Decimal("0.000005")),
        ("1", Decimal(1)),
        ("1k", Decimal(1000)),
        ("1M", Decimal(10**6)),
        ("2G", Decimal(2 * 10**9)),
        ("1T", Decimal(10**12)),
        ("1P", Decimal(10**15)),
        ("1E", Decimal(10**18)),
        ("1Ki", Decimal(1024)),
        ("1.5Gi", Decimal(3 * 2**29)),
        ("1Ei", Decimal(2**60)),
        ("1e3", Decimal(1000)),
        ("1E3", Decimal(1000)),
        ("1.5e-3", Decimal("0.0015")),
        ("-2", Decimal(-2)),
        ("+2", Decimal(2)),
        (".5", Decimal("0.5")),
        ("5.", Decimal(5)),
        ("0.000000000001", Decimal("1e-12")),
        (
            "12345678901234567890123456789012345678901234567890Ei",
            Decimal(12345678901234567890123456789012345678901234567890 * 2**60),
        ),
    ],
)
def test_parse_quantity(text: str, value: Decimal) -> None:
    assert parse_quantity(text) == value


@pytest.mark.parametrize(
    "text",
    [
        "",
        " 1",
        "1 ",
        "1.2.3",
        ".",
        "-",
        "1e",
        "1Kb",
        "1KiB",
        "1k8",
        "1ki",
        "1K",
        "abc",
        "1e3k",
        "0x10",
        "1_000",
        "++1",
        "１",
        "1e1000000",
    ],
)
def test_parse_quantity_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="quantit"):
        parse_quantity(text)


def _is_canonical_decimal(text: str) -> bool:
    """The DecimalSI canonical shape: an integer mantissa with the largest exponent a multiple of 3 allows."""
    suffix = text.lstrip("-0123456789")
    mantissa = int(text[: len(text) - len(suffix)])
    if suffix not in _SUFFIX_EXP:
        return False
    return mantissa == 0 and text == "0" or mantissa % 1000 != 0 or suffix == "E"


@given(st.integers(min_value=-(2**63), max_value=2**63 - 1))
def test_cpu_round_trip(n: int) -> None:
    text = format_cpu_nanocores(n)
    assert parse_quantity(text) == Decimal(n).scaleb(-9)
    assert _is_canonical_decimal(text)


@given(st.integers(min_value=-(2**70), max_value=2**70))
def test_bytes_round_trip(n: int) -> None:
    text = format_bytes(n)
    assert parse_quantity(text) == n
    suffix = text.lstrip("-0123456789")
    mantissa = int(text[: len(text) - len(suffix)])
    if suffix:
        assert mantissa % 1024 != 0 or suffix == "Ei"
    else:
        assert -1024 < n < 1024 or n % 1024 != 0


@given(st.decimals(allow_nan=False, allow_infinity=False, places=9, min_value=-(10**12), max_value=10**12))
def test_decimal_round_trip(value: Decimal) -> None:
    text = format_decimal(value)
    assert parse_quantity(text) == value
    assert _is_canonical_decimal(text)


@given(st.floats(allow_nan=False, allow_infinity=False, min_value=-1e15, max_value=1e15))
def test_float_formats_to_nearest_nano_multiple_at_or_beyond(value: float) -> None:
    text = format_decimal(value)
    back = parse_quantity(text)
    exact = Decimal(repr(value))
    assert abs(back) >= abs(exact) and abs(back - exact) <= Decimal("1e-9")
    assert format_decimal(back) == text  # formatting is idempotent


# ---- custom metric values: rounded to six significant digits, whole numbers exact -----------------


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (26.299999997, "26300m"),  # a rate with timestamp noise: was "26299999997n"
        (0.1 + 0.2, "300m"),
        (-26.299999997, "-26300m"),
        (1234567.0, "1234567"),  # whole numbers stay exact
        (2.0**53, "9007199254740992"),
        (0.000123456789, "123457n"),  # small values keep their digits
        (5e-10, "1n"),  # below a nano: apimachinery rounds up, never to zero
        (3.3333333333, "3333330u"),
    ],
)
def test_custom_metric_values_are_served_rounded(value: float, text: str) -> None:
    from kcms.apis.custom.convert import quantity

    assert quantity(value) == text


@given(st.floats(allow_nan=False, allow_infinity=False, min_value=-1e15, max_value=1e15))
def test_custom_metric_values_keep_six_significant_digits(value: float) -> None:
    from kcms.apis.custom.convert import quantity

    served = parse_quantity(quantity(value))
    if value.is_integer():
        assert served == Decimal(int(value))
    elif abs(value) >= 1e-3:
        assert abs(served - Decimal(repr(value))) <= Decimal(repr(abs(value))) * Decimal("5e-6")
    else:  # tiny values: never served as zero, never off by more than a nano plus the rounding
        assert served != 0
        assert abs(served - Decimal(repr(value))) <= Decimal(repr(abs(value))) * Decimal("5e-6") + Decimal("1e-9")
