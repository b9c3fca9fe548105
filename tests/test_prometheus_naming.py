"""prometheus-adapter's rule semantics: names, filters, resource labels, selectors -> PromQL, templates.

Every expected string here is what prometheus-adapter (pkg/naming) renders for the same config and
request, worked out from its code and docs: the order of the matchers, Go's ``%q`` quoting, the
``=~"a|b"`` form for several objects, the defaults of ``name.as``, Go's ``$name`` expansion rules.
The property tests check the selector translation against Kubernetes' own selector semantics with a
small PromQL matcher evaluator written here (absent label == empty value, regexps fully anchored).
"""

from __future__ import annotations

import ast
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kcms.apis.prometheus.config import ConfigError, load_adapter_config
from kcms.apis.prometheus.gotemplate import TemplateError, go_format, parse
from kcms.apis.prometheus.matchers import (
    QueryBuildError,
    compile_go_regexp,
    go_expand,
    go_quote,
    selector_parts,
)
from kcms.apis.prometheus.naming import MetricNamer
from kcms.apis.prometheus.resources import GroupResource, ResourceMapper, resolve_known
from kcms.apis.prometheus.rules import DiscoveryRule, NameMapping, RegexFilter, ResourceMapping
from kcms.selectors import LabelSelector, Requirement, parse_label_selector

PODS = GroupResource("", "pods")
NAMESPACES = GroupResource("", "namespaces")
SERVICES = GroupResource("", "services")
DEPLOYMENTS = GroupResource("apps", "deployments")

WALKTHROUGH = """
rules:
- seriesQuery: 'http_requests_total{kubernetes_namespace!="",kubernetes_pod_name!=""}'
  resources:
    overrides:
      kubernetes_namespace: {resource: "namespace"}
      kubernetes_pod_name: {resource: "pod"}
  name:
    matches: "^(.*)_total"
    as: "${1}_per_second"
  metricsQuery: 'sum(rate(<<.Series>>{<<.LabelMatchers>>}[2m])) by (<<.GroupBy>>)'
"""


def namer(
    matches: str = "",
    as_: str = "",
    *,
    query: str = "sum(<<.Series>>{<<.LabelMatchers>>}) by (<<.GroupBy>>)",
    filters: tuple[RegexFilter, ...] = (),
    overrides: tuple[tuple[str, str, str], ...] = (("namespace", "", "namespace"), ("pod", "", "pod")),
    template: str = "",
    namespaced: bool | None = None,
    external: bool = False,
) -> MetricNamer:
    rule = DiscoveryRule(
        series_query='{__name__=~".+"}',
        metrics_query=query,
        series_filters=filters,
        resources=ResourceMapping(template=template, overrides=overrides, namespaced=namespaced),
        name=NameMapping(matches=matches, as_=as_),
        path="rules[0]",
    )
    return MetricNamer.from_rule(rule, external=external)


def sel(text: str) -> LabelSelector:
    return parse_label_selector(text)


# ---------------------------------------------------------------------------------------------------
# naming


@pytest.mark.parametrize(
    ("matches", "as_", "series", "expected"),
    [
        ("", "", "http_requests_total", "http_requests_total"),  # default matches ".*", as "$0"
        ("^(.*)_total$", "", "http_requests_total", "http_requests"),  # one group: "$1"
        ("^container_(.*)_seconds_total$", "", "container_cpu_usage_seconds_total", "cpu_usage"),
        ("^(.*)_total$", "${1}_per_second", "http_requests_total", "http_requests_per_second"),
        (
            "^(.*)_total$",
            "$1_per_second",
            "http_requests_total",
            "",
        ),  # Go: "$1_per_second" is ${1_per_second}
        ("^(.*)_total$", "$1", "http_requests_total", "http_requests"),
        ("^(?P<base>.*)_total$", "${base}_rate", "x_total", "x_rate"),
        ("^(?<base>.*)_total$", "$base", "x_total", "x"),  # Go 1.22 also accepts (?<name>)
        ("^(a)(b)?$", "$1-$2-$3", "a", "a--"),  # unmatched and missing groups expand to nothing
        ("^(.*)$", "cost$$ $x ${1", "q", "cost$  ${1"),  # "$$" is "$"; unknown name empty; bad ref kept
        ("_total", "", "http_requests_total", "_total"),  # unanchored: $0 is what matched
        ("total", "as_is", "http_requests_total", "as_is"),
        ("^(.*)_total", "${1}", "a_total_b_total", "a_total_b"),  # leftmost match, greedy group
    ],
)
def test_metric_names(matches: str, as_: str, series: str, expected: str) -> None:
    assert namer(matches, as_).metric_name_for(series) == expected


def test_name_that_does_not_match_is_none_and_filtered_out() -> None:
    n = namer("^(.*)_total$")
    assert n.metric_name_for("http_requests") is None
    assert not n.accepts("http_requests")
    series = [{"__name__": "a_total", "pod": "p"}, {"__name__": "b", "pod": "p"}]
    assert n.filter_series(series) == [series[0]]


def test_series_filters_is_and_is_not_all_apply() -> None:
    n = namer(
        "^container_(.*)_total$",
        filters=(RegexFilter(is_not="^container_.*_seconds_total$"), RegexFilter(is_="network")),
    )
    assert n.accepts("container_network_receive_bytes_total")
    assert not n.accepts("container_cpu_usage_seconds_total")  # isNot
    assert not n.accepts("container_fs_reads_total")  # is
    assert not n.accepts("node_network_receive_bytes_total")  # name.matches is a filter too


def test_go_dollar_is_end_of_text_not_before_a_final_newline() -> None:
    rx = compile_go_regexp("^(.*)_total$")
    assert rx.search("a_total")
    assert not rx.search("a_total\n")  # Python's "$" would match here; Go's does not
    assert compile_go_regexp(r"^a\z").search("a") and not compile_go_regexp(r"^a\z").search("a\n")
    assert compile_go_regexp("(?m)^a$").search("a\nb")  # multi-line: "$" before a newline is fine
    assert compile_go_regexp("[$]").search("$")  # a "$" in a class is a literal
    assert compile_go_regexp("[]a]").search("]")  # "]" first in a class is a literal, in both dialects


def test_go_regexp_classes_are_go_classes() -> None:
    alpha_digit = compile_go_regexp("^[[:alpha:]_]+[[:digit:]]$")
    assert alpha_digit.search("abc_1") and not alpha_digit.search("a:1")  # POSIX classes, not characters
    punct = compile_go_regexp("^[[:punct:]]+$")
    assert punct.search("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~") and not punct.search("a")
    assert compile_go_regexp("[a[b]").search("[")  # "[" in a class is a literal
    assert not compile_go_regexp(r"^\d$").search("\u0663")  # \d is ASCII in Go
    assert not compile_go_regexp(r"^\w+$").search("caf\u00e9")


@pytest.mark.parametrize("pattern", ["[[:foo:]]", "[[:^alpha:]]", r"\pL", r"\Qa.b\E", "a(?i)b"])
def test_go_regexp_syntax_python_cannot_express_is_refused_not_changed(pattern: str) -> None:
    with pytest.raises(ValueError):
        compile_go_regexp(pattern)


@pytest.mark.parametrize(
    "pattern", [r"(a)\1", "a(?=b)", "a(?!b)", "(?<=a)b", "(?<!a)b", "a*+", "(?P=x)", "(?>a)", "(?U)a*"]
)
def test_perl_only_regexp_syntax_is_refused(pattern: str) -> None:
    with pytest.raises(ValueError):
        compile_go_regexp(pattern)


def test_go_expand_named_and_numbered() -> None:
    m = re.search(r"(?P<a>x)(y)", "xy")
    assert m is not None
    assert go_expand("$a$2$0${a}", m) == "xyxyx"
    assert go_expand("$99999999999", m) == ""  # an overflowing index is no group
    assert go_expand("$01|${01}|$000000001", m) == "||"  # a leading zero makes it a name, not a number
    assert go_expand("$", m) == "$" and go_expand("a$-b", m) == "a$-b"


# ---------------------------------------------------------------------------------------------------
# resources


def test_overrides_are_normalized_like_kubectl_names() -> None:
    m = ResourceMapper(
        {
            "ns": ("", "namespace"),
            "po": ("", "pods"),
            "deploy": ("apps", "deployment"),
            "d2": ("", "deployment"),
        }
    )
    assert m.resource_for_label("ns") == NAMESPACES
    assert m.resource_for_label("po") == PODS
    assert m.resource_for_label("deploy") == DEPLOYMENTS
    assert m.label_for(DEPLOYMENTS) == "deploy"  # the first label for a group-resource wins
    assert m.namespace_label == "ns"
    assert m.resource_for_label("pod") is None  # no template: only the overrides


def test_override_of_a_custom_resource_is_pluralized() -> None:
    m = ResourceMapper(
        {"brand": ("cheese.io", "brand"), "policy": ("example.com", "policy"), "widgets": ("x.io", "widgets")}
    )
    assert m.resource_for_label("brand") == GroupResource("cheese.io", "brands")
    assert m.resource_for_label("policy") == GroupResource("example.com", "policies")
    assert m.resource_for_label("widgets") == GroupResource("x.io", "widgets")
    assert str(m.resource_for_label("brand")) == "brands.cheese.io"


def test_resource_template() -> None:
    m = ResourceMapper(template=parse("<<.Resource>>"))
    assert m.label_for(PODS) == "pod"
    assert m.label_for(DEPLOYMENTS) == "deployment"
    assert m.label_for(GroupResource("networking.k8s.io", "ingresses")) == "ingress"
    assert m.label_for(GroupResource("networking.k8s.io", "networkpolicies")) == "networkpolicy"
    assert m.resource_for_label("pod") == PODS
    assert m.resource_for_label("deployment") == DEPLOYMENTS  # group found from the resource
    assert m.resource_for_label("job") == GroupResource("batch", "jobs")  # the adapter's known quirk
    assert m.resource_for_label("instance") is None  # not a resource: not a resource label
    assert m.resource_for_label("__name__") is None
    assert m.namespace_label == "namespace"
    assert m.resources_in(
        {"__name__": "x", "namespace": "a", "pod": "b", "instance": "i", "pod_name": "c"}
    ) == [
        NAMESPACES,
        PODS,
    ]


def test_resource_template_with_group() -> None:
    m = ResourceMapper(template=parse("kube_<<.Group>>_<<.Resource>>"))
    assert m.label_for(DEPLOYMENTS) == "kube_apps_deployment"
    assert m.label_for(PODS) == "kube__pod"  # the core group is empty, as in the adapter
    assert m.label_for(GroupResource("networking.k8s.io", "ingresses")) == "kube_networking_k8s_io_ingress"
    assert m.resource_for_label("kube_apps_deployment") == DEPLOYMENTS
    assert m.resource_for_label("kube_batch_cronjob") == GroupResource("batch", "cronjobs")
    # read back non-greedily (group "networking"), which no RESTMapper knows: as in the adapter
    assert m.resource_for_label("kube_networking_k8s_io_ingress") is None
    assert m.resource_for_label("kube_apps_pod") is None


def test_metrics_in_follows_the_adapters_namespaced_rule() -> None:
    m = ResourceMapper(template=parse("<<.Resource>>"))
    assert m.metrics_in({"namespace": "a", "pod": "b", "verb": "GET"}) == [(NAMESPACES, False), (PODS, True)]
    assert m.metrics_in({"node": "n"}) == [(GroupResource("", "nodes"), False)]
    # a series with only cluster-scoped labels is not namespaced for any resource
    assert m.metrics_in({"node": "n", "namespace": "x"}) == [
        (GroupResource("", "nodes"), False),
        (NAMESPACES, False),
    ]


def test_resolve_known() -> None:
    assert resolve_known("", "Pods") == PODS
    assert resolve_known("apps", "deployments") == DEPLOYMENTS
    assert resolve_known("apps", "pod") is None
    assert resolve_known("", "") is None
    assert resolve_known("", "nosuchthing") is None


def test_a_resolver_backed_by_discovery_can_be_passed() -> None:
    crd = GroupResource("example.com", "widgets")

    def resolve(group: str, resource: str) -> GroupResource | None:
        return crd if resource in ("widget", "widgets") else resolve_known(group, resource)

    m = ResourceMapper(template=parse("<<.Resource>>"), resolve=resolve)
    assert m.resource_for_label("widget") == crd and m.resource_for_label("pod") == PODS


# ---------------------------------------------------------------------------------------------------
# queries


def test_walkthrough_query_for_two_pods() -> None:
    cfg = load_adapter_config(WALKTHROUGH)
    n = cfg.namers[0]
    assert n.metric_name_for("http_requests_total") == "http_requests_per_second"
    q = n.query_for_objects("http_requests_total", PODS, "production", ["frontend-0123", "frontend-4567"])
    assert q == (
        'sum(rate(http_requests_total{kubernetes_namespace="production",'
        'kubernetes_pod_name=~"frontend-0123|frontend-4567"}[2m])) by (kubernetes_pod_name)'
    )
    one = n.query_for_objects("http_requests_total", PODS, "production", ["frontend-0123"])
    assert 'kubernetes_pod_name="frontend-0123"' in one


def test_namespace_metric_query_has_no_namespace_matcher_of_its_own() -> None:
    n = load_adapter_config(WALKTHROUGH).namers[0]
    q = n.query_for_objects("http_requests_total", NAMESPACES, "", ["production"])
    assert (
        q == 'sum(rate(http_requests_total{kubernetes_namespace="production"}[2m])) by (kubernetes_namespace)'
    )


def test_metric_label_selector_comes_first_sorted_by_key() -> None:
    n = namer()
    q = n.query_for_objects("x", PODS, "ns", ["a"], sel("verb in (PUT,GET),code!=500,method"))
    assert q == 'sum(x{code!="500",method!="",verb=~"GET|PUT",namespace="ns",pod="a"}) by (pod)'


def test_all_template_fields() -> None:
    n = namer(
        query='<<.Series>>|<<.LabelMatchers>>|<<.GroupBy>>|<<.GroupBySlice>>|<<.LabelValuesByName>>|<<index .LabelValuesByName "pod">>'
    )
    q = n.query_for_objects("x", PODS, "ns", ["a", "b"], sel("k in (v,w)"))
    assert q == 'x|k=~"v|w",namespace="ns",pod=~"a|b"|pod|[pod]|map[k:v|w namespace:ns pod:a|b]|a|b'


def test_group_by_slice_with_range() -> None:
    n = namer(query='<<range $i, $l := .GroupBySlice>><<if $i>>,<<end>>"<<$l>>"<<end>>')
    assert n.query_for_objects("x", PODS, "ns", ["a"]) == '"pod"'


def test_values_are_quoted_like_go() -> None:
    n = namer()
    q = n.query_for_objects("x", PODS, 'we"ird\\ns', ["a\tb"])
    assert 'namespace="we\\"ird\\\\ns"' in q and 'pod="a\\tb"' in q


def test_object_query_errors() -> None:
    n = namer(overrides=(("pod", "", "pod"),))
    with pytest.raises(QueryBuildError, match="no label for namespaces"):
        n.query_for_objects("x", PODS, "ns", ["a"])
    with pytest.raises(QueryBuildError, match="no label for services"):
        n.query_for_objects("x", SERVICES, "", ["a"])
    with pytest.raises(QueryBuildError, match="no object names"):
        n.query_for_objects("x", PODS, "", [])
    with pytest.raises(QueryBuildError, match="no label for namespaces") as rule_fault:
        n.query_for_objects("x", PODS, "ns", ["a"])
    assert not rule_fault.value.client_error  # the configuration's fault, not the request's
    with pytest.raises(QueryBuildError, match="operator not supported") as client_fault:
        n.query_for_objects("x", PODS, "", ["a"], sel("replicas>3"))
    assert client_fault.value.client_error  # the request's fault: 400
    assert isinstance(QueryBuildError("x"), ValueError)


def test_external_queries() -> None:
    ns = namer(query="sum(<<.Series>>{<<.LabelMatchers>>}) by (name)", external=True)
    assert ns.query_for_external("queue_consumer_lag", "default", sel("name=q1")) == (
        'sum(queue_consumer_lag{name="q1",namespace="default"}) by (name)'
    )
    assert (
        ns.query_for_external("queue_consumer_lag", "", sel("name=q1"))
        == 'sum(queue_consumer_lag{name="q1"}) by (name)'
    )
    free = namer(
        query="sum(<<.Series>>{<<.LabelMatchers>>}) by (name)", external=True, namespaced=False, overrides=()
    )
    assert free.query_for_external("queue_depth", "default", sel("namespace=queue,name=my-sample-queue")) == (
        'sum(queue_depth{name="my-sample-queue",namespace="queue"}) by (name)'
    )
    assert (
        free.query_for_external("queue_depth", "default", LabelSelector()) == "sum(queue_depth{}) by (name)"
    )
    groupby = namer(query="[<<.GroupBy>>][<<.GroupBySlice>>]", external=True, namespaced=False)
    assert groupby.query_for_external("q", "ns", None) == "[][[]]"
    no_label = namer(query="<<.Series>>{<<.LabelMatchers>>}", external=True, overrides=())
    with pytest.raises(QueryBuildError, match="no label for namespaces"):
        no_label.query_for_external("q", "default", LabelSelector())


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        ("k=v", 'k="v"'),
        ("k==v", 'k="v"'),
        ("k!=v", 'k!="v"'),
        ("k in (v)", 'k=~"v"'),
        ("k in (b,a)", 'k=~"a|b"'),
        ("k notin (v)", 'k!~"v"'),
        ("k notin (v,w)", 'k!~"v|w"'),
        ("k", 'k!=""'),
        ("!k", 'k=""'),
        ("k=", 'k=""'),
        ("k in (a.b)", 'k=~"a.b"'),  # unescaped, as the adapter: "." matches any character
        ("b=1,a=2", 'a="2",b="1"'),
    ],
)
def test_selector_matcher_table(selector: str, expected: str) -> None:
    assert ",".join(p[1] for p in selector_parts(sel(selector))) == expected


@pytest.mark.parametrize("selector", ["k>1", "k<1"])
def test_integer_comparisons_are_refused(selector: str) -> None:
    with pytest.raises(QueryBuildError):
        selector_parts(sel(selector))


def test_malformed_requirements_are_refused() -> None:
    with pytest.raises(QueryBuildError, match="no value"):
        selector_parts(LabelSelector((Requirement("k", "in", ()),)))
    with pytest.raises(QueryBuildError, match="does not take values"):
        selector_parts(LabelSelector((Requirement("k", "exists", ("x",)),)))
    with pytest.raises(QueryBuildError, match="label name"):
        selector_parts(LabelSelector((Requirement("", "=", ("x",)),)))


# ---------------------------------------------------------------------------------------------------
# property: selector.matches(labels) iff the rendered matchers match labels (PromQL semantics)

_MATCHER_RE = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)(=~|!~|!=|=)("(?:[^"\\]|\\.)*")')


def promql_matches(matchers: str, labels: dict[str, str]) -> bool:
    """Evaluate comma-joined PromQL matchers: an absent label is the empty value; regexps are anchored."""
    pos = 0
    while pos < len(matchers):
        m = _MATCHER_RE.match(matchers, pos)
        assert m, f"not a matcher list: {matchers[pos:]!r}"
        label, op, quoted = m.groups()
        value = ast.literal_eval(quoted)
        have = labels.get(label, "")
        if op == "=":
            ok = have == value
        elif op == "!=":
            ok = have != value
        else:
            ok = re.fullmatch(value, have) is not None
            ok = ok if op == "=~" else not ok
        if not ok:
            return False
        pos = m.end()
        if pos < len(matchers):
            assert matchers[pos] == ","
            pos += 1
    return True


KEYS = st.sampled_from(["app", "env", "tier", "zone"])
# Kubernetes label values (no "."; the adapter leaves "." as a regex wildcard: tested separately)
VALUES = st.from_regex(r"[a-c0-9]([a-c0-9_-]{0,3}[a-c0-9])?", fullmatch=True)


@st.composite
def requirements(draw: st.DrawFn) -> Requirement:
    key = draw(KEYS)
    op = draw(st.sampled_from(["=", "==", "!=", "in", "notin", "exists", "!"]))
    if op in ("exists", "!"):
        return Requirement(key, op)
    if op in ("in", "notin"):
        return Requirement(key, op, tuple(sorted(set(draw(st.lists(VALUES, min_size=1, max_size=3))))))
    return Requirement(key, op, (draw(VALUES),))


@settings(max_examples=400, deadline=None)
@given(
    st.lists(requirements(), max_size=4),
    st.dictionaries(KEYS, VALUES, max_size=4),
)
def test_rendered_matchers_select_exactly_what_the_selector_selects(
    reqs: list[Requirement], labels: dict[str, str]
) -> None:
    selector = LabelSelector(tuple(reqs))
    rendered = ",".join(p[1] for p in selector_parts(selector))
    assert promql_matches(rendered, labels) == selector.matches(labels), rendered


@settings(max_examples=200, deadline=None)
@given(st.lists(VALUES, min_size=1, max_size=5, unique=True), VALUES)
def test_object_names_matcher_selects_exactly_the_named_objects(names: list[str], other: str) -> None:
    q = namer(query="<<.LabelMatchers>>").query_for_objects("x", PODS, "", names)
    for name in [*names, other]:
        assert promql_matches(q, {"pod": name}) == (name in names)


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.characters(exclude_categories=("Cs",)), max_size=30))
def test_go_quote_reads_back_as_the_same_text(text: str) -> None:
    quoted = go_quote(text)
    assert quoted.startswith('"') and quoted.endswith('"')
    assert ast.literal_eval(quoted) == text  # Go's escapes are a subset of Python's (and of PromQL's)


def test_go_quote_exact_forms() -> None:
    assert go_quote('a"b\\c\n\x01\x7fé\u2028') == '"a\\"b\\\\c\\n\\x01\\x7fé\\u2028"'


# ---------------------------------------------------------------------------------------------------
# the << >> template subset behaves like Go's text/template


@pytest.mark.parametrize(
    ("text", "data", "expected"),
    [
        ("a<<.X>>b", {"X": "1"}, "a1b"),
        ("<<.L>>", {"L": ["a", "b"]}, "[a b]"),
        ("<<.M>>", {"M": {"b": "2", "a": "1"}}, "map[a:1 b:2]"),
        ("<<.M.missing>>", {"M": {"a": "1"}}, "<no value>"),
        ('<<index .M "a">><<index .M "zz">>', {"M": {"a": "1"}}, "1"),
        ("<<index .L 1>>", {"L": ["a", "b"]}, "b"),
        ("<<len .L>>", {"L": ["a", "b"]}, "2"),
        ("<<range .L>>[<<.>>]<<end>>", {"L": ["a", "b"]}, "[a][b]"),
        ("<<range $i, $v := .L>><<$i>>=<<$v>>;<<end>>", {"L": ["a", "b"]}, "0=a;1=b;"),
        ("<<range .L>>x<<else>>empty<<end>>", {"L": []}, "empty"),
        ('<<range .L>><<if eq . "b">><<break>><<end>><<.>><<end>>', {"L": ["a", "b", "c"]}, "a"),
        ('<<range .L>><<if eq . "a">><<continue>><<end>><<.>><<end>>', {"L": ["a", "b"]}, "b"),
        ("<<if .X>>yes<<else if .Y>>y<<else>>no<<end>>", {"X": "", "Y": "1"}, "y"),
        ("<<if not .X>>empty<<end>>", {"X": ""}, "empty"),
        ("<<if and .X .Y>>both<<else>>not<<end>>", {"X": "1", "Y": ""}, "not"),
        ("<<or .X .Y>>", {"X": "", "Y": "y"}, "y"),
        ("<<with .X>><<.>>!<<end>>", {"X": "v"}, "v!"),
        ("<<with .X>>set<<else>>unset<<end>>", {"X": ""}, "unset"),
        ("<<if $x := .X>>[<<$x>>]<<else>>(<<$x>>)<<end>>", {"X": ""}, "()"),  # in scope up to end
        ("<<with $x := .X>><<$x>><<end>><<$y := 1>><<if true>><<$y = 2>><<end>><<$y>>", {"X": "a"}, "a2"),
        ('<<printf "%s-%d-%q-%v" .X 3 .X .L>>', {"X": "a", "L": ["p"]}, 'a-3-"a"-[p]'),
        ('<<.X | printf "(%s)">>', {"X": "a"}, "(a)"),
        ('<<print "a" "b" 1 2>>', {}, "ab1 2"),
        ('<<$x := .X>><<$x>><<$x = "z">><<$x>>', {"X": "a"}, "az"),
        ("a  <<- .X ->>  b", {"X": "1"}, "a1b"),
        ("a <</* comment */>> b", {}, "a  b"),
        ("a <<- /* comment */ ->> b", {}, "ab"),
        ("<<`raw \\n`>>", {}, "raw \\n"),
        ('<<"q\\"\\n">>', {}, 'q"\n'),
        ("<<(index .L 0)>>", {"L": ["a"]}, "a"),
        ("<<slice .X 1 3>>", {"X": "abcd"}, "bc"),
        ("<<$.X>><<range .L>><<$.X>><<end>>", {"X": "t", "L": [1, 2]}, "ttt"),
        ("<<if lt 1 2>>lt<<end>><<if ge 2 2>>ge<<end>><<if ne 1 2>>ne<<end>>", {}, "ltgene"),
        ("<<true>> <<1>> <<0x10>>", {}, "true 1 16"),
        ("}}{{.X}} >", {"X": 1}, "}}{{.X}} >"),  # Go's own delimiters are plain text here
    ],
)
def test_template_rendering(text: str, data: dict[str, object], expected: str) -> None:
    assert parse(text).render(data) == expected


@pytest.mark.parametrize(
    "text",
    [
        "<<.X",
        "<<if .X>>a",
        "<<end>>",
        "<<else>>",
        '<<join .L ",">>',
        "<<html .X>>",
        '<<template "x">>',
        '<<define "x">><<end>>',
        "<<$nope>>",
        "<<if true>><<$z := 1>><<end>><<$z>>",  # a body's variable ends with the body
        "<<break>>",
        '<<"unterminated>>',
        "<<.X | 3>>",
        "<<(.X>>",
        "<<.X)>>",
        "<<>>",
        "<<end 1>>",
        "<</* open >>",
        "<<'ab'>>",
        '<<"\\q">>',
    ],
)
def test_template_syntax_errors(text: str) -> None:
    with pytest.raises(TemplateError):
        parse(text)


@pytest.mark.parametrize(
    ("text", "data"),
    [
        ("<<.Nope>>", {"X": 1}),
        ("<<.X.Y>>", {"X": "s"}),
        ("<<index .L 5>>", {"L": ["a"]}),
        ("<<index .X 0>>", {"X": 3}),
        ("<<len .X>>", {"X": 3}),
        ("<<range .X>><<end>>", {"X": "s"}),
        ("<<eq .X 1>>", {"X": "s"}),
        ("<<lt .X .Y>>", {"X": ["a"], "Y": ["b"]}),
        ("<<slice .X 3 1>>", {"X": "abcd"}),
        ("<<.X .Y>>", {"X": "a", "Y": "b"}),  # Go parses it (a method call) and fails running it
        ("<<eq .L .L>>", {"L": ["a"]}),
        ("<<lt true false>>", {}),
    ],
)
def test_template_evaluation_errors(text: str, data: dict[str, object]) -> None:
    with pytest.raises(TemplateError):
        parse(text).render(data)


def test_go_format_values() -> None:
    assert go_format(None) == "<nil>" and go_format(False) == "false" and go_format(2.5) == "2.5"
    assert go_format(3.0) == "3" and go_format([["a"], "b"]) == "[[a] b]"


def test_top_level_fields() -> None:
    t = parse(
        "<<.A>><<range .B>><<.Inner>><<$.C>><<end>><<with .D>><<.E>><<end>><<if .F>><<.G>><<end>><<(index .H 1)>>"
    )
    assert t.top_level_fields() == {"A", "B", "C", "D", "F", "G", "H"}


def test_config_error_for_a_rule_with_two_groups_and_no_as() -> None:
    with pytest.raises(ConfigError, match=r"rules\[0\]\.name\.as: required"):
        namer("^(a)_(b)$")


def test_every_built_in_resource_round_trips_through_the_templates() -> None:
    """label_for and resource_for_label are inverse for every resource the table knows: the label a
    template writes for a group-resource is read back as that group-resource (for the template with
    .Group, named single-word groups only: the adapter reads dotted groups back non-greedily)."""
    from kcms.apis.prometheus.resources import _SINGULAR

    plain = ResourceMapper(template=parse("<<.Resource>>"))
    grouped = ResourceMapper(template=parse("k_<<.Group>>_<<.Resource>>"))
    seen_labels: dict[str, GroupResource] = {}
    for gr in _SINGULAR:
        label = plain.label_for(gr)
        assert label is not None
        if label in seen_labels:  # two groups with one short name: kubectl resolves it to one of them
            continue
        seen_labels[label] = gr
        assert plain.resource_for_label(label) == gr, (gr, label)
        if gr.group and "." not in gr.group:
            assert grouped.resource_for_label(grouped.label_for(gr) or "") == gr, gr
    # the core group writes an empty .Group, which the read-back regexp ((?P<group>.+?)) cannot match:
    # "k__pod" names no resource, in the adapter as here
    assert grouped.label_for(PODS) == "k__pod" and grouped.resource_for_label("k__pod") is None
