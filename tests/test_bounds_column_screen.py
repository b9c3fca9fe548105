"""screen_batch's column test (kcms.sources.bounds._all_within) against the point-by-point screen:
for random batches with hostile readings (NaN, infinities, negatives, values past the bounds,
timestamps in the future or before the epoch, non-numbers, long names, malformed pod keys), the
pods kept and the counts by reason are exactly those of looking at every point."""

from __future__ import annotations

import copy
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kcms.model import NodeBatch, ResourcePoint
from kcms.sources.bounds import MAX_CPU_NS, MAX_MEMORY_BYTES, screen_batch, screen_node_point, screen_pods

LATEST = 1.7e9 + 300

_TIMES = st.one_of(
    st.floats(min_value=1.6e9, max_value=1.7e9),
    st.sampled_from([math.nan, math.inf, -math.inf, 0.0, -1.0, LATEST, LATEST + 1, 1e308, "x", None]),
)
_INTS = st.one_of(
    st.integers(min_value=0, max_value=10**13),
    st.sampled_from(
        [
            0,
            -1,
            MAX_CPU_NS,
            MAX_CPU_NS + 1,
            MAX_MEMORY_BYTES,
            MAX_MEMORY_BYTES + 1,
            10**400,
            1.5,
            math.nan,
            math.inf,
            "1",
            True,
        ]
    ),  # fmt: skip
)
_STARTS = st.one_of(
    st.floats(min_value=0, max_value=1.7e9), st.sampled_from([math.nan, math.inf, -math.inf, 1e308])
)
_NAMES = st.one_of(st.sampled_from(["a", "web", "x" * 253, "y" * 254]), st.text(max_size=5))
_POINTS = st.builds(ResourcePoint, _STARTS, _TIMES, _INTS, _INTS)
_GOOD_POINTS = st.builds(
    ResourcePoint,
    st.floats(min_value=0, max_value=1.7e9),
    st.floats(min_value=1.6e9, max_value=1.7e9),
    st.integers(min_value=0, max_value=10**13),
    st.integers(min_value=0, max_value=10**11),
)
_PODS = st.dictionaries(
    st.tuples(_NAMES, _NAMES),
    st.dictionaries(_NAMES, st.one_of(_GOOD_POINTS, _GOOD_POINTS, _POINTS), max_size=4),
    max_size=6,
)


def _by_points(batch: NodeBatch) -> dict[str, int]:
    counts: dict[str, int] = {}
    screen_node_point(batch, LATEST, counts)
    screen_pods(batch, LATEST, counts)
    return counts


@settings(max_examples=500, deadline=None)
@given(_PODS, st.one_of(st.none(), _POINTS))
def test_the_column_test_keeps_and_counts_exactly_what_the_points_do(pods, node_point) -> None:
    a = NodeBatch("n", node_point, pods)
    b = copy.deepcopy(a)
    assert screen_batch(a, LATEST) == _by_points(b)
    assert a == b


@pytest.mark.parametrize("key", [("ns", "pod", "extra"), ("only",), 7])
def test_malformed_pod_keys_fail_as_the_points_do(key) -> None:
    point = ResourcePoint(1.6e9, 1.69e9, 5, 6)
    a = NodeBatch("n", None, {key: {"c": point}})
    b = NodeBatch("n", None, {key: {"c": point}})
    with pytest.raises((ValueError, TypeError)) as got:
        screen_batch(a, LATEST)
    with pytest.raises((ValueError, TypeError)) as want:
        _by_points(b)
    assert type(got.value) is type(want.value)
