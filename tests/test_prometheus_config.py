"""prometheus-adapter's configuration file read unchanged, and every way it can be wrong.

Configs in the adapter's own format (the shapes of its docs/config.md, config-walkthrough.md,
externalmetrics.md and sample-config.yaml) load and compile; every malformed or unknown field is a
ConfigError whose message starts with the rule and field (``rules[2].name.matches: ...``), at load
time. The deploy/overlays/prometheus overlay renders with the real ``kubectl kustomize``, its mounted
config loads with this parser and its flags with the real CLI, and the migration's first step (apply
everything but the APIServices) is checked with the real ``kubectl apply --dry-run=client -l``.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from _deploy_helpers import DEPLOY, only, render

from kcms.apis.prometheus import (
    AdapterConfig,
    ConfigError,
    GroupResource,
    MetricNamer,
    QueryBuildError,
    ResourceRules,
    load_adapter_config,
    read_adapter_config,
)
from kcms.apis.prometheus.config import parse_duration
from kcms.selectors import parse_label_selector

OVERLAY = DEPLOY / "overlays" / "prometheus"
PODS = GroupResource("", "pods")
NODES = GroupResource("", "nodes")

SAMPLE = """
rules:
# cumulative cAdvisor metrics measured in seconds
- seriesQuery: '{__name__=~"^container_.*",container!="POD",namespace!="",pod!=""}'
  resources:
    overrides:
      namespace: {resource: "namespace"}
      pod: {resource: "pod"}
  name:
    matches: "^container_(.*)_seconds_total$"
  metricsQuery: "sum(rate(<<.Series>>{<<.LabelMatchers>>,container!=\\"POD\\"}[2m])) by (<<.GroupBy>>)"
# cumulative cAdvisor metrics not measured in seconds
- seriesQuery: '{__name__=~"^container_.*_total",container!="POD",namespace!="",pod!=""}'
  resources:
    overrides:
      namespace: {resource: "namespace"}
      pod: {resource: "pod"}
  seriesFilters:
  - isNot: "^container_.*_seconds_total$"
  name: {matches: "^container_(.*)_total$"}
  metricsQuery: "sum(rate(<<.Series>>{<<.LabelMatchers>>,container!=\\"POD\\"}[2m])) by (<<.GroupBy>>)"
# cumulative non-cAdvisor metrics
- seriesQuery: '{namespace!="",__name__!~"^container_.*"}'
  name: {matches: "^(.*)_total$"}
  resources:
    template: "<<.Resource>>"
  metricsQuery: "sum(rate(<<.Series>>{<<.LabelMatchers>>}[2m])) by (<<.GroupBy>>)"
# one metric, explicitly renamed
- seriesQuery: 'cheddar{sharp="true"}'
  name: {as: "cheesy_goodness"}
  resources:
    overrides:
      brand: {group: "cheese.io", resource: "brand"}
  metricsQuery: 'count(cheddar{sharp="true"})'
externalRules:
- seriesQuery: '{__name__="queue_consumer_lag",name!=""}'
  metricsQuery: sum(<<.Series>>{<<.LabelMatchers>>}) by (name)
  resources:
    overrides: { namespace: {resource: "namespace"} }
- seriesQuery: '{__name__="queue_depth",topic!=""}'
  metricsQuery: sum(<<.Series>>{<<.LabelMatchers>>}) by (name)
  resources:
    namespaced: false
resourceRules:
  cpu:
    containerQuery: sum(rate(container_cpu_usage_seconds_total{<<.LabelMatchers>>}[3m])) by (<<.GroupBy>>)
    nodeQuery: sum(rate(container_cpu_usage_seconds_total{<<.LabelMatchers>>, id='/'}[3m])) by (<<.GroupBy>>)
    resources:
      overrides:
        instance: {resource: node}
        namespace: {resource: namespace}
        pod: {resource: pod}
    containerLabel: container
  memory:
    containerQuery: sum(container_memory_working_set_bytes{<<.LabelMatchers>>}) by (<<.GroupBy>>)
    nodeQuery: sum(container_memory_working_set_bytes{<<.LabelMatchers>>,id='/'}) by (<<.GroupBy>>)
    resources:
      template: <<.Resource>>
    containerLabel: container
  window: 3m
"""


def test_the_adapters_sample_config_loads_and_compiles() -> None:
    cfg = load_adapter_config(SAMPLE, source="sample.yaml")
    assert isinstance(cfg, AdapterConfig) and cfg.source == "sample.yaml"
    assert len(cfg.rules) == len(cfg.namers) == 4
    assert len(cfg.external_rules) == len(cfg.external_namers) == 2
    assert all(isinstance(n, MetricNamer) for n in (*cfg.namers, *cfg.external_namers))
    assert [r.path for r in cfg.rules] == [f"rules[{i}]" for i in range(4)]
    assert cfg.external_rules[1].resources.namespaced is False
    assert cfg.rules[1].series_filters[0].is_not == "^container_.*_seconds_total$"
    assert cfg.namers[0].series_query == '{__name__=~"^container_.*",container!="POD",namespace!="",pod!=""}'
    assert cfg.namers[0].metric_name_for("container_cpu_usage_seconds_total") == "cpu_usage"
    assert cfg.namers[1].metric_name_for("container_network_receive_bytes_total") == "network_receive_bytes"
    assert cfg.namers[2].metric_name_for("http_requests_total") == "http_requests"
    assert cfg.namers[3].metric_name_for("cheddar") == "cheesy_goodness"
    assert cfg.namers[3].resources.resource_for_label("brand") == GroupResource("cheese.io", "brands")
    q = cfg.namers[3].query_for_objects("cheddar", GroupResource("cheese.io", "brands"), "", ["gouda"])
    assert q == 'count(cheddar{sharp="true"})'  # a template without fields is used as written
    assert cfg.warnings == ()


def test_sample_external_rules() -> None:
    cfg = load_adapter_config(SAMPLE)
    lag, depth = cfg.external_namers
    selector = parse_label_selector("name=orders")
    assert lag.query_for_external("queue_consumer_lag", "shop", selector) == (
        'sum(queue_consumer_lag{name="orders",namespace="shop"}) by (name)'
    )
    assert (
        depth.query_for_external("queue_depth", "shop", selector)
        == 'sum(queue_depth{name="orders"}) by (name)'
    )


def test_resource_rules() -> None:
    rr = load_adapter_config(SAMPLE).resource_rules
    assert isinstance(rr, ResourceRules)
    assert rr.window == 180.0
    assert rr.container_query("cpu", "kube-system", ["coredns-1", "coredns-2"]) == (
        'sum(rate(container_cpu_usage_seconds_total{namespace="kube-system",pod=~"coredns-1|coredns-2"}[3m]))'
        " by (pod,container)"
    )
    assert rr.node_query("cpu", ["node-a"]) == (
        "sum(rate(container_cpu_usage_seconds_total{instance=\"node-a\", id='/'}[3m])) by (instance)"
    )
    # memory maps labels by its own template: the node label is "node"
    assert rr.node_query("memory", ["a", "b"]) == (
        "sum(container_memory_working_set_bytes{node=~\"a|b\",id='/'}) by (node)"
    )
    sample = {"namespace": "ns", "pod": "p", "container": "c", "instance": "n1", "node": "n2"}
    assert rr.pod_of(sample) == ("ns", "p") and rr.container_of(sample) == "c"
    assert rr.node_of(sample) == "n1" and rr.node_of(sample, "memory") == "n2"
    assert rr.pod_of({"pod": "p"}) is None and rr.container_of({}) is None and rr.node_of({}) is None
    with pytest.raises(ValueError, match="cpu' or 'memory"):
        rr.node_query("gpu", ["a"])
    with pytest.raises(QueryBuildError):
        rr.container_query("cpu", "ns", [])
    with pytest.raises(QueryBuildError):
        rr.node_query("cpu", [])
    assert "namespace=" not in rr.container_query("memory", "", ["p"])


def test_window_defaults_to_one_minute() -> None:
    text = SAMPLE.replace("  window: 3m\n", "")
    rr = load_adapter_config(text).resource_rules
    assert rr is not None and rr.window == 60.0
    assert load_adapter_config(SAMPLE.replace("window: 3m", "window: 0s")).resource_rules.window == 60.0  # type: ignore[union-attr]
    assert load_adapter_config("rules: []").resource_rules is None


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("1m", 60.0),
        ("1h30m", 5400.0),
        ("500ms", 0.5),
        ("2d", 172800.0),
        ("1w", 604800.0),
        ("1y", 31536000.0),
        ("0", 0.0),
    ],
)
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "1", "m", "1.5m", "1m1h", "-1m", "1 m"])
def test_bad_durations(text: str) -> None:
    with pytest.raises(ValueError):
        parse_duration(text)


@pytest.mark.parametrize("text", ["", "# nothing\n", "{}", "rules:\nexternalRules:\n"])
def test_empty_configs_are_valid(text: str) -> None:
    cfg = load_adapter_config(text)
    assert cfg.rules == () and cfg.external_rules == () and cfg.resource_rules is None


def test_namespaced_external_rule_without_a_namespace_label_is_a_warning() -> None:
    cfg = load_adapter_config(
        "externalRules:\n- seriesQuery: 'q'\n  metricsQuery: 'sum(<<.Series>>{<<.LabelMatchers>>})'\n"
    )
    assert len(cfg.warnings) == 1 and cfg.warnings[0].startswith("externalRules[0]: namespaced external rule")
    with pytest.raises(QueryBuildError):
        cfg.external_namers[0].query_for_external("q", "default", parse_label_selector(""))
    assert cfg.external_namers[0].query_for_external("q", "", parse_label_selector("")) == "sum(q{})"


# ---------------------------------------------------------------------------------------------------
# every ConfigError, with where it says the problem is

RULE = """\
rules:
- seriesQuery: 'http_requests_total{namespace!="",pod!=""}'
  resources:
    overrides:
      namespace: {resource: namespace}
      pod: {resource: pod}
  name:
    matches: "^(.*)_total$"
  metricsQuery: 'sum(rate(<<.Series>>{<<.LabelMatchers>>}[2m])) by (<<.GroupBy>>)'
"""

RESOURCE_RULES = """\
resourceRules:
  cpu:
    containerQuery: 'sum(x{<<.LabelMatchers>>}) by (<<.GroupBy>>)'
    nodeQuery: 'sum(x{<<.LabelMatchers>>}) by (<<.GroupBy>>)'
    resources: {template: "<<.Resource>>"}
    containerLabel: container
  memory:
    containerQuery: 'sum(y{<<.LabelMatchers>>}) by (<<.GroupBy>>)'
    nodeQuery: 'sum(y{<<.LabelMatchers>>}) by (<<.GroupBy>>)'
    resources: {template: "<<.Resource>>"}
    containerLabel: container
"""


def edit(old: str, new: str, base: str = RULE) -> str:
    assert old in base, old
    return base.replace(old, new)


def test_the_base_configs_of_the_error_cases_are_valid() -> None:
    assert load_adapter_config(RULE).namers and load_adapter_config(RESOURCE_RULES).resource_rules


CASES = [
    # YAML and structure
    ("rules: [", r"^<config>: not valid YAML \(line \d+, column \d+\)"),
    ("- just\n- a list\n", r"^: expected a mapping, got a list"),
    ("rules: {}\n", r"^rules: expected a list, got a mapping"),
    ("rules:\n- 5\n", r"^rules\[0\]: expected a mapping, got a number"),
    ("rulez: []\n", r"^rulez: unknown field 'rulez'"),
    (RULE + "rules: []\n", r"not valid YAML.*already defined"),
    (edit("  name:\n", "  nmae:\n"), r"^rules\[0\]\.nmae: unknown field 'nmae'"),
    (edit("seriesQuery:", "seriesQuerry:"), r"^rules\[0\]\.seriesQuerry: unknown field"),
    (edit("  name:\n    matches:", "  name:\n    match:"), r"^rules\[0\]\.name\.match: unknown field"),
    (
        edit('  name:\n    matches: "^(.*)_total$"\n', "  name: 3\n"),
        r"^rules\[0\]\.name: expected a mapping, got a number",
    ),
    # seriesQuery / metricsQuery required and typed
    (
        edit('- seriesQuery: \'http_requests_total{namespace!="",pod!=""}\'', "- seriesQuery: ''"),
        r"^rules\[0\]\.seriesQuery: required",
    ),
    (
        edit('- seriesQuery: \'http_requests_total{namespace!="",pod!=""}\'', "- seriesQuery: 42"),
        r"^rules\[0\]\.seriesQuery: expected a string, got a number",
    ),
    (
        edit(
            "  metricsQuery: 'sum(rate(<<.Series>>{<<.LabelMatchers>>}[2m])) by (<<.GroupBy>>)'",
            "  metricsQuery: ''",
        ),
        r"^rules\[0\]\.metricsQuery: required",
    ),
    # metricsQuery template
    (
        edit("<<.GroupBy>>)'", "<<.GroupBy)'"),
        r"^rules\[0\]\.metricsQuery: template does not parse: unclosed action",
    ),
    (
        edit("<<.GroupBy>>", "<<.Groupby>>"),
        r"^rules\[0\]\.metricsQuery: unknown template field \.Groupby \(the fields are \.GroupBy, ",
    ),
    (edit("<<.GroupBy>>", "<<.LabelMatchersByName>>"), r"unknown template field \.LabelMatchersByName"),
    (
        edit("<<.GroupBy>>", '<<join .GroupBySlice ",">>'),
        r"^rules\[0\]\.metricsQuery: template does not parse: function \"join\" not defined",
    ),
    (
        edit("<<.GroupBy>>", "<<index .GroupBySlice 3>>"),
        r"^rules\[0\]\.metricsQuery: template fails on sample values: .*index out of range",
    ),
    (
        edit("<<.GroupBy>>", "<<.Series.Name>>"),
        r"^rules\[0\]\.metricsQuery: template fails on sample values: can't evaluate field Name",
    ),
    (
        edit(
            "  metricsQuery: 'sum(rate(<<.Series>>{<<.LabelMatchers>>}[2m])) by (<<.GroupBy>>)'",
            "  metricsQuery: '<<if false>>x<<end>>'",
        ),
        r"^rules\[0\]\.metricsQuery: the template produces an empty text",
    ),
    (
        edit("<<.GroupBy>>", "<<if .Series>>"),
        r"^rules\[0\]\.metricsQuery: template does not parse: unexpected EOF",
    ),
    # resources
    (
        edit("      pod: {resource: pod}", "      pod: {group: apps}"),
        r"^rules\[0\]\.resources\.overrides\.pod\.resource: required",
    ),
    (
        edit("      pod: {resource: pod}", "      pod: {resource: pod, version: v1}"),
        r"^rules\[0\]\.resources\.overrides\.pod\.version: unknown field",
    ),
    (
        edit("      pod: {resource: pod}", "      pod: pods"),
        r"^rules\[0\]\.resources\.overrides\.pod: expected a mapping, got a string",
    ),
    (
        edit("      pod: {resource: pod}", "      pod-name: {resource: pod}"),
        r"^rules\[0\]\.resources\.overrides\.pod-name: 'pod-name' is not a Prometheus label name",
    ),
    (
        edit(
            "    overrides:\n      namespace: {resource: namespace}\n      pod: {resource: pod}",
            "    overrides: [namespace, pod]",
        ),
        r"^rules\[0\]\.resources\.overrides: expected a mapping",
    ),
    (
        edit("    overrides:", "    template: '<<.Resource'\n    overrides:"),
        r"^rules\[0\]\.resources\.template: template does not parse",
    ),
    (
        edit("    overrides:", "    template: 'kube_<<.Group>>'\n    overrides:"),
        r"^rules\[0\]\.resources\.template: must include at least `<<\.Resource>>`",
    ),
    (
        edit("    overrides:", "    template: '<<.Kind>>'\n    overrides:"),
        r"^rules\[0\]\.resources\.template: unknown template field \.Kind \(the fields are \.Group, \.Resource\)",
    ),
    (
        edit("    overrides:", "    template: '<<.Resource>>('\n    overrides:"),
        r"^rules\[0\]\.resources\.template: unable to convert label template to matcher",
    ),
    (
        edit("    overrides:", "    namespaced: 'no'\n    overrides:"),
        r"^rules\[0\]\.resources\.namespaced: expected true or false, got a string",
    ),
    (
        edit(
            "  resources:\n    overrides:\n      namespace: {resource: namespace}\n      pod: {resource: pod}\n",
            "  resources: [pod]\n",
        ),
        r"^rules\[0\]\.resources: expected a mapping, got a list",
    ),
    # seriesFilters
    (
        edit("  name:\n", "  seriesFilters:\n  - is: a\n    isNot: b\n  name:\n"),
        r"^rules\[0\]\.seriesFilters\[0\]: cannot have both an `is`",
    ),
    (
        edit("  name:\n", "  seriesFilters:\n  - {}\n  name:\n"),
        r"^rules\[0\]\.seriesFilters\[0\]: must have either an `is` or `isNot`",
    ),
    (
        edit("  name:\n", "  seriesFilters:\n  - is: a\n  - isNot: '(b'\n  name:\n"),
        r"^rules\[0\]\.seriesFilters\[1\]\.isNot: error parsing regexp",
    ),
    (
        edit("  name:\n", "  seriesFilters:\n  - is: 'a(?=b)'\n  name:\n"),
        r"^rules\[0\]\.seriesFilters\[0\]\.is: invalid or unsupported Perl syntax",
    ),
    (
        edit("  name:\n", "  seriesFilters:\n  - is: [a]\n  name:\n"),
        r"^rules\[0\]\.seriesFilters\[0\]\.is: expected a string, got a list",
    ),
    (
        edit("  name:\n", "  seriesFilters:\n  - iz: a\n  name:\n"),
        r"^rules\[0\]\.seriesFilters\[0\]\.iz: unknown field",
    ),
    (
        edit("  name:\n", "  seriesFilters: {is: a}\n  name:\n"),
        r"^rules\[0\]\.seriesFilters: expected a list, got a mapping",
    ),
    # name
    (edit('"^(.*)_total$"', '"^(.*_total$"'), r"^rules\[0\]\.name\.matches: error parsing regexp"),
    (
        edit('"^(.*)_total$"', '"^(.*)_(.*)_total$"'),
        r"^rules\[0\]\.name\.as: required: name\.matches '\^\(\.\*\)_\(\.\*\)_total\$' has 2 capture groups",
    ),
    (edit('"^(.*)_total$"', '"^a\\\\Z"'), r"^rules\[0\]\.name\.matches: invalid escape sequence"),
    # the rule index is the one at fault
    (
        RULE + RULE.replace("rules:\n", "").replace("<<.GroupBy>>", "<<.Nope>>"),
        r"^rules\[1\]\.metricsQuery: unknown template field \.Nope",
    ),
    (
        "externalRules:\n" + RULE.replace("rules:\n", "").replace("matches", "matchez"),
        r"^externalRules\[0\]\.name\.matchez: unknown field",
    ),
    # resourceRules
    ("resourceRules: {}\n", r"^resourceRules\.cpu: required when resourceRules is set"),
    ("resourceRules: 5\n", r"^resourceRules: expected a mapping, got a number"),
    ("externalRules: 5\n", r"^externalRules: expected a list, got a number"),
    (
        RESOURCE_RULES[: RESOURCE_RULES.index("  memory:")] + "  memory: 1\n",
        r"^resourceRules\.memory: expected a mapping, got a number",
    ),
    (
        edit("    containerLabel: container\n  memory:", "    containerLabel: ''\n  memory:", RESOURCE_RULES),
        r"^resourceRules\.cpu\.containerLabel: required",
    ),
    (
        edit("    nodeQuery: 'sum(y", "    nodeQuerry: 'sum(y", RESOURCE_RULES),
        r"^resourceRules\.memory\.nodeQuerry: unknown field",
    ),
    (
        RESOURCE_RULES.replace("    containerQuery: 'sum(y{<<.LabelMatchers>>}) by (<<.GroupBy>>)'\n", ""),
        r"^resourceRules\.memory\.containerQuery: required",
    ),
    (
        edit(
            "    containerQuery: 'sum(x{<<.LabelMatchers>>}) by (<<.GroupBy>>)'",
            "    containerQuery: 'sum(x{<<.Labels>>})'",
            RESOURCE_RULES,
        ),
        r"^resourceRules\.cpu\.containerQuery: unknown template field \.Labels",
    ),
    (
        edit(
            "    nodeQuery: 'sum(y{<<.LabelMatchers>>}) by (<<.GroupBy>>)'",
            "    nodeQuery: 'sum(y{<<.LabelMatchers>>}) by (<<.GroupBy>>'",
            RESOURCE_RULES,
        ).replace("by (<<.GroupBy>>'", "by (<<.GroupBy'"),
        r"^resourceRules\.memory\.nodeQuery: template does not parse",
    ),
    (
        edit(
            '    resources: {template: "<<.Resource>>"}\n    containerLabel: container\n  memory:',
            "    resources: {overrides: {pod: {resource: pod}}}\n    containerLabel: container\n  memory:",
            RESOURCE_RULES,
        ),
        r"^resourceRules\.cpu\.resources: no label for namespaces",
    ),
    (
        edit(
            '    resources: {template: "<<.Resource>>"}\n    containerLabel: container\n  memory:',
            "    resources: {overrides: {pod: {resource: pod}, namespace: {resource: namespace}}}\n"
            "    containerLabel: container\n  memory:",
            RESOURCE_RULES,
        ),
        r"^resourceRules\.cpu\.resources: no label for nodes",
    ),
    (
        RESOURCE_RULES + "  window: 5\n",
        r"^resourceRules\.window: expected a duration such as 1m, got a number",
    ),
    (
        RESOURCE_RULES + "  window: 5 minutes\n",
        r'^resourceRules\.window: not a valid duration string: "5 minutes"',
    ),
    (RESOURCE_RULES + "  windows: 1m\n", r"^resourceRules\.windows: unknown field"),
]


@pytest.mark.parametrize(("text", "pattern"), CASES, ids=[f"case{i}" for i in range(len(CASES))])
def test_config_errors_name_the_rule_and_field(text: str, pattern: str) -> None:
    with pytest.raises(ConfigError, match=pattern):
        load_adapter_config(text)


def test_config_error_is_a_value_error_and_names_the_source() -> None:
    with pytest.raises(ValueError, match=r"^/etc/adapter\.yaml: not valid YAML"):
        load_adapter_config(":\n  - ]", source="/etc/adapter.yaml")


def test_read_adapter_config(tmp_path: Path) -> None:
    good = tmp_path / "config.yaml"
    good.write_text(RULE)
    assert read_adapter_config(str(good)).source == str(good)
    with pytest.raises(ConfigError, match="cannot read the adapter configuration"):
        read_adapter_config(str(tmp_path / "missing.yaml"))
    with pytest.raises(ConfigError, match="cannot read the adapter configuration"):
        read_adapter_config(str(tmp_path))  # a directory
    binary = tmp_path / "binary.yaml"
    binary.write_bytes(b"rules: []\n\xff\xfe")
    with pytest.raises(ConfigError, match=r"not UTF-8 text \(byte 10\)"):
        read_adapter_config(str(binary))
    huge = tmp_path / "huge.yaml"
    huge.write_bytes(b"#" * ((4 << 20) + 1))
    with pytest.raises(ConfigError, match="larger than"):
        read_adapter_config(str(huge))
    bad = tmp_path / "bad.yaml"
    bad.write_text(edit("matches", "matchez"))
    with pytest.raises(ConfigError, match=r"^rules\[0\]\.name\.matchez: unknown field"):
        read_adapter_config(str(bad))


@pytest.mark.parametrize(
    ("text", "pattern"),
    [
        ("rules: " + "[" * 5000 + "]" * 5000, r"^<config>: not valid YAML: nested too deeply"),
        (
            "rules:\n- seriesQuery: x\n  metricsQuery: '<<" + "(" * 3000 + ".Series" + ")" * 3000 + ">>'\n",
            r"^rules\[0\]\.metricsQuery: template does not parse: nested too deeply",
        ),
        (
            "rules:\n- seriesQuery: x\n  metricsQuery: '"
            + "<<if true>>" * 3000
            + "x"
            + "<<end>>" * 3000
            + "'\n",
            r"^rules\[0\]\.metricsQuery: template does not parse: nested too deeply",
        ),
        (
            "rules:\n- seriesQuery: x\n  metricsQuery: q\n  name: {matches: '"
            + "(" * 3000
            + "a"
            + ")" * 3000
            + "'}\n",
            r"^rules\[0\]\.name\.matches: error parsing regexp: nested too deeply",
        ),
    ],
    ids=["yaml", "template-parens", "template-ifs", "regexp"],
)
def test_pathological_nesting_is_a_config_error_not_a_crash(text: str, pattern: str) -> None:
    with pytest.raises(ConfigError, match=pattern):
        load_adapter_config(text)


def test_yaml_tags_that_build_objects_are_refused() -> None:
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_adapter_config("rules: !!python/object/apply:os.system ['true']")


# ---------------------------------------------------------------------------------------------------
# deploy/overlays/prometheus


def overlay_config() -> str:
    objects = render(OVERLAY)
    configmap = only(objects, "ConfigMap", "kcms-adapter-config")
    return configmap["data"]["config.yaml"]


def test_overlay_mounts_a_config_that_loads() -> None:
    objects = render(OVERLAY)
    deployment = only(objects, "Deployment", "kcms")
    pod = deployment["spec"]["template"]["spec"]
    container = pod["containers"][0]
    args = container["args"]
    assert args[0] == "standalone"
    config_flag = [a for a in args if a.startswith("--config=")]
    assert config_flag == ["--config=/etc/kcms/adapter/config.yaml"]
    assert any(a.startswith("--prometheus-url=http") for a in args)
    mount = only_mount(container, "/etc/kcms/adapter")
    volume = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    assert volume and volume[0]["configMap"]["name"] == "kcms-adapter-config"
    cfg = load_adapter_config(overlay_config(), source="kcms-adapter-config")
    assert cfg.namers and cfg.external_namers and cfg.resource_rules is not None and not cfg.warnings
    assert cfg.namers[0].metric_name_for("container_cpu_usage_seconds_total") == "cpu_usage"
    assert cfg.namers[2].metric_name_for("http_requests_total") == "http_requests_per_second"
    assert cfg.resource_rules.window == 300.0


def only_mount(container: dict, path: str) -> dict:
    mounts = [m for m in container["volumeMounts"] if m["mountPath"] == path]
    assert len(mounts) == 1 and mounts[0].get("readOnly") is True
    return mounts[0]


def _standalone_args(config: Path) -> list[str]:
    """The overlay container's args, its --config pointed at ``config`` (the ConfigMap's file)."""
    deployment = only(render(OVERLAY), "Deployment", "kcms")
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    return [f"--config={config}" if a.startswith("--config=") else a for a in args]


def test_overlay_flags_and_config_pass_the_real_cli_checks(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`kcms standalone` with the Deployment's flags and the ConfigMap's file: the CLI's own start-up
    checks accept them and load the rules; the same file with one misspelt template field stops
    start-up naming the flag, the rule and the field."""
    from kcms.cmd import flags_sources
    from kcms.cmd import main as cli

    config = tmp_path / "config.yaml"
    config.write_text(overlay_config())
    parser = cli.build_parser("standalone")
    args = parser.parse_args(_standalone_args(config))
    sub = parser._subparsers._group_actions[0].choices["standalone"]  # type: ignore[union-attr]
    flags_sources.validate_prometheus_flags(sub, args)
    assert isinstance(args.adapter_config, AdapterConfig) and len(args.adapter_config.namers) == 3

    broken = tmp_path / "broken.yaml"
    broken.write_text(overlay_config().replace("<<.Series>>", "<<.Sries>>", 1))
    args = parser.parse_args(_standalone_args(broken))
    with pytest.raises(SystemExit) as exit_info:
        flags_sources.validate_prometheus_flags(sub, args)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "argument --config: rules[0].metricsQuery: unknown template field .Sries" in err
    assert "Traceback" not in err


class _Discovery(BaseHTTPRequestHandler):
    """Just enough of a Kubernetes API for `kubectl apply --dry-run=client`: discovery, and 404 for
    every object (so each would be created)."""

    groups = {
        "apps": [("deployments", "Deployment", True)],
        "rbac.authorization.k8s.io": [
            ("clusterroles", "ClusterRole", False),
            ("clusterrolebindings", "ClusterRoleBinding", False),
            ("roles", "Role", True),
            ("rolebindings", "RoleBinding", True),
        ],
        "apiregistration.k8s.io": [("apiservices", "APIService", False)],
    }
    core = [
        ("serviceaccounts", "ServiceAccount", True),
        ("configmaps", "ConfigMap", True),
        ("services", "Service", True),
    ]

    def log_message(self, *args: object) -> None:
        pass

    def _resources(self, group_version: str, rows: list[tuple[str, str, bool]]) -> dict:
        return {
            "kind": "APIResourceList",
            "apiVersion": "v1",
            "groupVersion": group_version,
            "resources": [
                {
                    "name": n,
                    "singularName": "",
                    "namespaced": ns,
                    "kind": k,
                    "verbs": ["create", "get", "patch"],
                }
                for n, k, ns in rows
            ],
        }

    def do_GET(self) -> None:  # noqa: N802 - the http.server hook's name
        path = self.path.split("?")[0]
        body: dict | None = None
        if path == "/api":
            body = {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []}
        elif path == "/apis":
            body = {
                "kind": "APIGroupList",
                "apiVersion": "v1",
                "groups": [
                    {
                        "name": g,
                        "versions": [{"groupVersion": f"{g}/v1", "version": "v1"}],
                        "preferredVersion": {"groupVersion": f"{g}/v1", "version": "v1"},
                    }
                    for g in self.groups
                ],
            }
        elif path == "/api/v1":
            body = self._resources("v1", self.core)
        elif path.startswith("/apis/") and path.count("/") == 3 and path.split("/")[2] in self.groups:
            group = path.split("/")[2]
            body = self._resources(f"{group}/v1", self.groups[group])
        data = json.dumps(
            body
            or {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404}
        ).encode()
        self.send_response(200 if body else 404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture
def discovery_kubeconfig(tmp_path: Path):
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Discovery)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [
                    {"name": "c", "cluster": {"server": f"http://127.0.0.1:{server.server_address[1]}"}}
                ],
                "users": [{"name": "u", "user": {}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    yield kubeconfig
    server.shutdown()
    server.server_close()
    thread.join(timeout=5)


def _dry_run_apply(kubeconfig: Path, selector: str) -> list[str]:
    kubectl = shutil.which("kubectl")
    assert kubectl, "kubectl is needed for this test (tests/system-deps.sh installs it)"
    proc = subprocess.run(
        [kubectl, "--kubeconfig", str(kubeconfig), "apply", "--dry-run=client", "--validate=false",
         "-o", "name", "-k", str(OVERLAY), "-l", selector],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.split()


def test_migration_steps_apply_the_workload_first_then_one_group_at_a_time(
    discovery_kubeconfig: Path,
) -> None:
    """The commands of docs/migration-from-prometheus-adapter.md, run by the real kubectl: the first
    applies everything but the APIServices (no API group changes hands), each later one exactly the
    APIServices of one group."""
    first = _dry_run_apply(discovery_kubeconfig, "!kcms.io/api-group")
    assert "deployment.apps/kcms" in first and "configmap/kcms-adapter-config" in first
    assert "service/kcms" in first
    assert not [o for o in first if o.startswith("apiservice")], first
    apiservices = {a["metadata"]["name"] for a in render(OVERLAY) if a["kind"] == "APIService"}
    seen: set[str] = set()
    for group, names in [
        ("external.metrics.k8s.io", {"v1beta1.external.metrics.k8s.io"}),
        ("custom.metrics.k8s.io", {"v1beta1.custom.metrics.k8s.io", "v1beta2.custom.metrics.k8s.io"}),
        ("metrics.k8s.io", {"v1beta1.metrics.k8s.io"}),
        ("history.kcms.io", {"v1alpha1.history.kcms.io"}),
    ]:
        applied = _dry_run_apply(discovery_kubeconfig, f"kcms.io/api-group={group}")
        assert set(applied) == {f"apiservice.apiregistration.k8s.io/{n}" for n in names}, applied
        seen |= names
    assert seen == apiservices  # every APIService of the overlay is switched by one of the steps
