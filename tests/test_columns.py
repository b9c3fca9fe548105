"""kcms/store/_columns.c against kcms/store/columns.py's rule (column_rates_py), and its history
row (put_row) against the two slice stores HistoryStore makes without it: the same result for
every input C reads, False (Python decides, nothing written) for the rest; the store's and the
history's column paths are tested end to end in tests/test_store_columns.py and
tests/test_history*.py."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kcms.sources.bounds import MAX_NANOCORES
from kcms.store.columns import column_rates, column_rates_py


def c_rates():
    """CI compiles kcms/store/_columns.c (gcc is on every machine the tests run on): a missing
    module fails here instead of silently testing Python against itself."""
    from kcms.store import _columns

    return _columns.rates


def both(new_t, old_t, new_c, old_c):
    got = c_rates()(new_t, old_t, new_c, old_c, MAX_NANOCORES)
    want = column_rates_py(new_t, old_t, new_c, old_c)
    return got, want


def test_the_module_is_built_and_takes_an_ordinary_scrape() -> None:
    old_t = [1_764_000_000.123 + i for i in range(60)]
    new_t = [t + 15.0 for t in old_t]
    old_c = [10**12 + 7 * i for i in range(60)]
    new_c = [c + 1_500_000_000 + i for i, c in enumerate(old_c)]
    got, want = both(new_t, old_t, new_c, old_c)
    assert got is not False and got == want
    assert got[0][0] == int(1_500_000_000 / 15.0) and got[1] is True
    assert column_rates(new_t, old_t, new_c, old_c) == want


@pytest.mark.parametrize(
    ("new_t", "old_t", "new_c", "old_c"),
    [
        ([2.0, 3.0], [1.0, 3.0], [5, 5], [1, 1]),  # a reading not newer
        ([2.0, 3.0], [1.0, 3.5], [5, 5], [1, 1]),  # an older one
        ([2.0, 3.0], [1.0, 2.0], [5, 0], [1, 1]),  # a counter down
        ([2.0], [1.0], [MAX_NANOCORES + 1], [0]),  # one nanocore over the bound in one second
        ([2.0], [1.0], [MAX_NANOCORES], [0]),  # exactly at it: taken
        ([1.0 + 2**-20], [1.0], [MAX_NANOCORES // 2**20], [0]),  # a short span at the bound
        ([1.0 + 2**-20], [1.0], [MAX_NANOCORES // 2**20 + 1], [0]),  # ...and one over
        ([1.7e9 + 15], [1.7e9], [2**62], [2**62 - 10**9]),  # large counters, int64
        ([1e308], [-1e308], [5], [1]),  # an infinite span: a rate of 0, as in Python
        ([0.3], [0.1], [3], [1]),  # 0.2 is not exact in binary: the same rounding
    ],
)
def test_edges_are_decided_as_python_decides(new_t, old_t, new_c, old_c) -> None:
    got, want = both(new_t, old_t, new_c, old_c)
    assert got is not False
    assert got == want


@pytest.mark.parametrize(
    "args",
    [
        ([], [], [], []),  # nothing to compare
        ([2.0, 3.0], [1.0], [5, 5], [1, 1]),  # lengths differ
        ([2.0], [1.0], [5.0], [1]),  # a float counter
        ([2], [1.0], [5], [1]),  # an int time
        ([math.inf], [1.0], [5], [1]),  # a non-finite time
        ([math.nan], [1.0], [5], [1]),
        ([2.0], [1.0], [2**64], [1]),  # a counter past int64
        ([2.0], [1.0], [2**62], [-(2**62)]),  # a difference past int64
        ([2.0], [1.0], [True], [0]),  # an int subclass
    ],
)
def test_what_c_does_not_read_is_left_to_python(args) -> None:
    assert c_rates()(*args, MAX_NANOCORES) is False
    assert column_rates(*args) == column_rates_py(*args)  # Python decides


def test_wrong_arguments_are_refused() -> None:
    rates = c_rates()
    with pytest.raises(TypeError):
        rates((2.0,), [1.0], [5], [1], MAX_NANOCORES)  # not a list
    with pytest.raises(TypeError):
        rates([2.0], [1.0], [5], [1])
    assert rates([2.0], [1.0], [5], [1], 2**54) is False  # a bound a double cannot hold exactly
    assert rates([2.0], [1.0], [5], [1], -1) is False


_times = st.floats(0.0, 2e9, allow_nan=False, allow_infinity=False)
_counters = st.integers(0, 2**63 - 1)


@settings(max_examples=2000, deadline=None)
@given(
    data=st.lists(st.tuples(_times, _times, _counters, _counters), min_size=1, max_size=80),
    near=st.booleans(),
)
def test_c_and_python_agree_on_random_scrapes(data, near) -> None:
    new_t = [a for a, _, _, _ in data]
    old_t = [b for _, b, _, _ in data]
    new_c = [c for _, _, c, _ in data]
    old_c = [d for _, _, _, d in data]
    if near:  # mostly valid: newer times, rising counters near the bound
        old_t = [t - (abs(hash(t)) % 3000) / 100.0 - 0.001 for t in new_t]
        old_c = [max(0, c - int(MAX_NANOCORES * (a - b)) + (c % 3) - 1) for c, a, b in zip(new_c, new_t, old_t, strict=True)]
    got, want = both(new_t, old_t, new_c, old_c)
    if got is False:  # only a difference past int64 is left to Python here
        assert any(not -(2**63) <= c - d < 2**63 for c, d in zip(new_c, old_c, strict=True))
        return
    assert got == want


def c_put_row():
    from kcms.store import _columns

    return _columns.put_row


def python_row(data: bytearray, base: int, order, cpus, memory) -> None:
    """The row as HistoryStore writes it without C: two slice stores of int64 arrays."""
    from array import array

    n = len(order)
    row = memoryview(data).cast("q")
    row[base : base + n] = array("q", [cpus[i] for i in order])
    row[base + n : base + 2 * n] = array("q", [memory[i] for i in order])


_int64 = st.integers(-(2**63), 2**63 - 1)


@settings(max_examples=500, deadline=None)
@given(data=st.data())
def test_put_row_writes_what_python_writes(data) -> None:
    width = data.draw(st.integers(1, 70))
    cpus = data.draw(st.lists(_int64, min_size=width, max_size=width))
    memory = data.draw(st.lists(_int64, min_size=width, max_size=width))
    order = tuple(data.draw(st.lists(st.integers(0, width - 1), min_size=1, max_size=width)))
    slots = 2 * len(order) + data.draw(st.integers(0, 9))
    base = data.draw(st.integers(0, slots - 2 * len(order)))
    before = bytes(data.draw(st.binary(min_size=8 * slots, max_size=8 * slots)))
    got, want = bytearray(before), bytearray(before)
    assert c_put_row()(got, base, order, cpus, memory) is True
    python_row(want, base, order, cpus, memory)
    assert got == want


def test_put_row_refuses_what_it_does_not_read_and_writes_nothing() -> None:
    put_row = c_put_row()
    cpus, memory = [5, 6, 7], [50, 60, 70]
    refused = [
        (bytearray(48), 0, (3, 0, 1), cpus, memory),  # an index past the columns
        (bytearray(48), 0, (-1, 0, 1), cpus, memory),  # a negative index
        (bytearray(48), 0, (0, 1, 2**70), cpus, memory),  # an index no int64 holds
        (bytearray(48), 0, (0, 1, 2), [5, 6.0, 7], memory),  # not an int
        (bytearray(48), 0, (0, 1, 2), [5, True, 7], memory),  # a bool is not an exact int
        (bytearray(48), 0, (0, 1, 2), cpus, [50, 60, 2**63]),  # outside int64
        (bytearray(48), 0, (0, 1, 2), cpus, [50, 60]),  # a column too short for its index
        (bytearray(47), 0, (0, 1, 2), cpus, memory),  # the row past the data's end
        (bytearray(48), 1, (0, 1, 2), cpus, memory),
        (bytearray(48), -1, (0, 1, 2), cpus, memory),
        (bytearray(48), 2**62, (0, 1, 2), cpus, memory),
        (bytearray(48), 0, (), cpus, memory),  # no container
        (bytes(48), 0, (0, 1, 2), cpus, memory),  # not a bytearray
        (bytearray(48), 0, [0, 1, 2], cpus, memory),  # order not a tuple
        (bytearray(48), 0, (0, 1, 2), tuple(cpus), memory),  # columns not lists
        (bytearray(48), 0, (0, 1, 2), cpus, tuple(memory)),
    ]
    for args in refused:
        before = bytes(args[0])
        assert put_row(*args) is False, args
        assert bytes(args[0]) == before, args  # a refusal leaves the row as it was
    with pytest.raises(TypeError):
        put_row(bytearray(48), 0, (0, 1, 2), cpus)
    with pytest.raises(TypeError):
        put_row(bytearray(48), "0", (0, 1, 2), cpus, memory)
    data = bytearray(b"\xff" * 64)  # -1 everywhere: the slot after the row stays so
    assert put_row(data, 1, (2, 0, 1), cpus, memory) is True
    assert list(memoryview(data).cast("q")) == [-1, 7, 5, 6, 70, 50, 60, -1]
