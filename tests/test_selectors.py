"""Label and field selectors with the full Kubernetes syntax."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kcms.selectors import (
    FieldSelector,
    LabelSelector,
    Requirement,
    SelectorError,
    parse_field_selector,
    parse_label_selector,
)

LABELS = {"app": "web", "tier": "frontend", "env": "prod", "example.com/team": "a-b.c_d", "n": "5"}


@pytest.mark.parametrize(
    ("text", "matches"),
    [
        ("", True),
        ("   ", True),
        ("app=web", True),
        ("app==web", True),
        ("app!=web", False),
        ("app=db", False),
        ("app!=db", True),
        ("missing!=x", True),
        ("missing=x", False),
        ("app in (web,db)", True),
        ("app in (db)", False),
        ("app notin (db, cache)", True),
        ("app notin (web)", False),
        ("missing notin (web)", True),
        ("missing in (web)", False),
        ("app", True),
        ("missing", False),
        ("!missing", True),
        ("!app", False),
        ("app=web,tier=frontend", True),
        ("app=web,tier=backend", False),
        ("  app = web ,  tier  in  ( frontend , x ) , ! missing ", True),
        ("example.com/team=a-b.c_d", True),
        ("n>4", True),
        ("n>5", False),
        ("n<6", True),
        ("app>1", False),  # not an integer label: no match
        ("missing<1", False),
        ("app=", False),
        ("missing=", False),
        ("missing!=", True),
        ("app in ()", False),
        ("in=x", False),  # "in" is a valid key
    ],
)
def test_label_selector_matching(text: str, matches: bool) -> None:
    assert parse_label_selector(text).matches(LABELS) is matches


def test_empty_selector() -> None:
    sel = parse_label_selector("")
    assert sel.empty and sel.matches({}) and str(sel) == ""
    assert not parse_label_selector("a").empty


@pytest.mark.parametrize(
    ("text", "canonical"),
    [
        ("b=1,a=2", "a=2,b=1"),
        ("x in (c, a, b, a)", "x in (a,b,c)"),
        ("x notin (b,a)", "x notin (a,b)"),
        ("  !x ,y", "!x,y"),
        ("x==1", "x==1"),
        ("x != 1", "x!=1"),
        ("x>10,y<-3", "x>10,y<-3"),
        ("x in (,a)", "x in (,a)"),
        ("x=", "x="),
    ],
)
def test_canonical_text(text: str, canonical: str) -> None:
    sel = parse_label_selector(text)
    assert str(sel) == canonical
    assert parse_label_selector(str(sel)) == sel


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("x=a||y=b", "invalid label value"),
        ("x==a==b", "expected"),
        ("!x=a", "expected"),
        ("x<a", "integer"),
        ("x>1.5", "integer"),
        ("x in (a", "')'"),
        ("x in a", "'('"),
        ("x notin", "'('"),
        ("x in (a b)", "expected"),
        ("x,", "end of string"),
        (",x", "identifier"),
        ("=a", "identifier"),
        ("a/b/c=d", "label key"),
        ("-a=b", "label key"),
        ("a=-b", "invalid label value"),
        ("a=" + "x" * 64, "63"),
        ("x" * 64 + "=a", "63"),
        ("Example.com/a=b", "prefix"),
        ("/a=b", "prefix"),
        ("a/=b", "name part"),
        ("a in (b,-c)", "invalid label value"),
        ("a b", "expected"),
        ("a!b", "expected"),
        ("(a)", "identifier"),
    ],
)
def test_label_selector_errors(text: str, fragment: str) -> None:
    with pytest.raises(SelectorError) as e:
        parse_label_selector(text)
    assert "unable to parse requirement" in str(e.value)
    assert fragment in str(e.value)
    assert "position" in str(e.value)


def test_error_position() -> None:
    with pytest.raises(SelectorError, match="position 4"):
        parse_label_selector("a=b,-c=d")


# -------------------------------------------------------------------- property tests

_name = st.from_regex(r"[a-z0-9]([a-z0-9A-Z._-]{0,10}[a-z0-9])?", fullmatch=True)
_prefix = st.from_regex(r"[a-z0-9]([a-z0-9-]{0,6}[a-z0-9])?(\.[a-z0-9]{1,5}){0,2}", fullmatch=True)
_key = st.one_of(_name, st.builds(lambda p, n: f"{p}/{n}", _prefix, _name))
_value = st.one_of(st.just(""), _name)
_blank = st.sampled_from(["", " ", "  ", "\t"])


@st.composite
def requirements(draw) -> tuple[Requirement, str]:  # type: ignore[no-untyped-def]
    key = draw(_key)
    op = draw(st.sampled_from(["=", "==", "!=", "in", "notin", "exists", "!", ">", "<"]))
    b = [draw(_blank) for _ in range(4)]
    if op == "exists":
        return Requirement(key, op), f"{b[0]}{key}{b[1]}"
    if op == "!":
        return Requirement(key, op), f"{b[0]}!{b[1]}{key}{b[2]}"
    if op in ("in", "notin"):
        values = draw(st.lists(_value, min_size=1, max_size=4))
        inner = ",".join(f"{draw(_blank)}{v}{draw(_blank)}" for v in values)
        text = f"{b[0]}{key} {b[1]}{op}{b[2]}({inner}){b[3]}"
        return Requirement(key, op, tuple(sorted(set(values)))), text
    if op in (">", "<"):
        value = str(draw(st.integers(min_value=-(2**63), max_value=2**63 - 1)))
    else:
        value = draw(_value)
    return Requirement(key, op, (value,)), f"{b[0]}{key}{b[1]}{op}{b[2]}{value}{b[3]}"


def _direct(req: Requirement, labels: dict[str, str]) -> bool:
    """The meaning of one requirement, written out independently of kcms.selectors."""
    has = req.key in labels
    v = labels.get(req.key)
    match req.operator:
        case "exists":
            return has
        case "!":
            return not has
        case "=" | "==" | "in":
            return has and v in req.values
        case "!=" | "notin":
            return not has or v not in req.values
        case ">" | "<":
            try:
                n = int(v)  # type: ignore[arg-type]
            except (TypeError, ValueError):
                return False
            if v is None or not v.lstrip("+-").isdigit():
                return False
            return n > int(req.values[0]) if req.operator == ">" else n < int(req.values[0])
    raise AssertionError(req)


@settings(max_examples=300)
@given(st.lists(requirements(), max_size=5), st.dictionaries(_key, _value, max_size=5), st.data())
def test_random_selectors_round_trip_and_match(reqs, labels, data) -> None:  # type: ignore[no-untyped-def]
    text = ",".join(t for _, t in reqs)
    sel = parse_label_selector(text)
    assert sorted(sel.requirements, key=repr) == sorted((r for r, _ in reqs), key=repr)
    assert parse_label_selector(str(sel)) == sel or sorted(
        parse_label_selector(str(sel)).requirements, key=repr
    ) == sorted(sel.requirements, key=repr)
    # make matches likely: sometimes copy the selector's own keys/values into the labels
    for r, _ in reqs:
        if r.values and data.draw(st.booleans()):
            labels[r.key] = data.draw(st.sampled_from(r.values))
    assert sel.matches(labels) == all(_direct(r, labels) for r, _ in reqs)


@settings(max_examples=500)
@given(
    st.lists(st.sampled_from([*"ab=!,() \t/.-_<>19", "in", "notin", "é", "\x00"]), max_size=20).map("".join)
)
def test_garbage_only_raises_selector_error(text: str) -> None:
    try:
        sel = parse_label_selector(text)
    except SelectorError:
        return
    again = parse_label_selector(str(sel))
    assert sorted(again.requirements, key=repr) == sorted(sel.requirements, key=repr)


@given(st.text(max_size=40))
def test_any_text_only_raises_selector_error(text: str) -> None:
    try:
        parse_label_selector(text)
    except SelectorError:
        pass
    try:
        parse_field_selector(text, {"metadata.name", "metadata.namespace"})
    except SelectorError:
        pass


# -------------------------------------------------------------------- field selectors

ALLOWED = {"metadata.name", "metadata.namespace"}


def test_field_selector_basics() -> None:
    sel = parse_field_selector("metadata.name=web-1,metadata.namespace!=kube-system", ALLOWED)
    assert not sel.empty
    assert sel.required_value("metadata.name") == "web-1"
    assert sel.required_value("metadata.namespace") is None
    assert sel.matches({"metadata.name": "web-1", "metadata.namespace": "default"})
    assert not sel.matches({"metadata.name": "web-1", "metadata.namespace": "kube-system"})
    assert not sel.matches({"metadata.name": "web-2", "metadata.namespace": "default"})
    assert str(sel) == "metadata.name=web-1,metadata.namespace!=kube-system"
    assert parse_field_selector("metadata.name==x", ALLOWED).required_value("metadata.name") == "x"


def test_field_selector_empty_and_blank_terms() -> None:
    for text in ("", " ", ",", " , "):
        sel = parse_field_selector(text, ALLOWED)
        assert sel.empty and sel.matches({}) and sel == FieldSelector()
    sel = parse_field_selector(" metadata.name = a , ", ALLOWED)
    assert sel.required_value("metadata.name") == "a"


def test_field_selector_escapes() -> None:
    sel = parse_field_selector(r"metadata.name=a\,b\=c\\d", ALLOWED)
    assert sel.required_value("metadata.name") == "a,b=c\\d"
    assert parse_field_selector(str(sel), ALLOWED) == sel


def test_field_selector_missing_field_is_empty_string() -> None:
    assert parse_field_selector("metadata.namespace=", ALLOWED).matches({"metadata.name": "x"})
    assert not parse_field_selector("metadata.namespace!=", ALLOWED).matches({})


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("spec.nodeName=x", "spec.nodeName"),
        ("metadata.name", "can't understand"),
        ("metadata.name=a=b", "unescaped"),
        (r"metadata.name=a\x", "escape"),
        ("metadata.name=a\\", "escape"),
        ("=x", "''"),
    ],
)
def test_field_selector_errors(text: str, fragment: str) -> None:
    with pytest.raises(SelectorError) as e:
        parse_field_selector(text, ALLOWED)
    assert fragment in str(e.value)


def test_label_selector_type_is_frozen_value() -> None:
    a = parse_label_selector("a=1,b in (x,y)")
    b = parse_label_selector("b in (y,x),a==1")
    assert isinstance(a, LabelSelector) and hash(a) is not None
    assert a != b  # "=" and "==" are kept apart, as apimachinery does
    assert a.matches({"a": "1", "b": "y"}) and b.matches({"a": "1", "b": "y"})


# ---- hostile input: huge numbers, huge text -------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "n>99999999999999999999999999",
        "n>9223372036854775808",  # 2**63: one past int64
        "n<-9223372036854775809",
        "n>" + "9" * 5000,  # past Python's 4300-digit int() limit: must not be a plain ValueError
        "n<-" + "1" * 100_000,
        "n>+" + "0" * 50 + "1" * 20,
    ],
)
def test_gt_lt_numbers_outside_int64_are_selector_errors(text: str) -> None:
    with pytest.raises(SelectorError) as info:
        parse_label_selector(text)
    assert "must be an integer" in str(info.value)
    assert len(str(info.value)) < 400  # the message quotes a bounded part of the input


def test_gt_lt_int64_bounds_and_leading_zeros_are_accepted() -> None:
    assert parse_label_selector("n>9223372036854775807").matches({"n": "5"}) is False
    assert parse_label_selector("n<-9223372036854775808").matches({"n": "5"}) is False
    assert parse_label_selector("n>" + "0" * 40 + "4").matches({"n": "5"}) is True
    # a label value that is a huge number never matches and never raises
    sel = parse_label_selector("n>1")
    assert sel.matches({"n": "9" * 5000}) is False
    assert sel.matches({"n": "99999999999999999999"}) is False


@pytest.mark.parametrize(
    "text",
    [
        "k" * 100_000 + "=v",
        "a=" + "v" * 100_000,
        "a in (" + "x," * 50_000 + "\x1b",
        "metadata.name=" + "\\" * 10_001,
    ],
)
def test_huge_selectors_fail_with_bounded_messages(text: str) -> None:
    for parse in (parse_label_selector, lambda t: parse_field_selector(t, {"metadata.name"})):
        try:
            parse(text)
        except SelectorError as e:
            assert len(str(e)) < 1000, len(str(e))
            assert "\x1b" not in str(e)
