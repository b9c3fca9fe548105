"""`kubectl kcms top nodes|pods`: `kubectl top` with a sparkline of the last minutes per row.

The requests are kubectl's: discovery (GET /apis: "Metrics API not available" without
metrics.k8s.io/v1beta1), the NodeMetricsList / PodMetricsList (or one object by name) with the label and
field selectors passed to the server, and for nodes GET /api/v1/nodes for the allocatable the
percentages are of. Rows, columns, units and order are kubectl's (kcms/kubectl/output.py); nodes in
the node list without metrics get a ``<unknown>`` row, as in kubectl.

Where kubectl stops, this degrades with one ``warning:`` line on stderr and exit code 0: a node list it
may not read (403, or 404 on a server that is not a kube-apiserver, such as `kcms demo`) leaves the
percentages ``<unknown>``; history that is absent (no history.kcms.io/v1alpha1 in discovery: plain
metrics-server) or unreadable leaves the sparkline column out, as do over `MAX_AUTO_HISTORY_ROWS`
rows unless the column is asked for (``--sparkline cpu|memory``).
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import Awaitable
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from kcms.kubectl import output
from kcms.kubectl.client import API, PluginError, one_line
from kcms.kubectl.sparkline import Axis, parse_time, resolution

METRICS = "/apis/metrics.k8s.io/v1beta1"
HISTORY_GROUP, HISTORY_VERSION = "history.kcms.io", "v1alpha1"
HISTORY = f"/apis/{HISTORY_GROUP}/{HISTORY_VERSION}"

MAX_AUTO_HISTORY_ROWS = 1000  # rows beyond which --sparkline auto leaves the history column out

Series = list[tuple[float, float]]


@dataclass
class Row:
    key: tuple[str, ...]  # (node,) or (namespace, pod) or (namespace, pod, container)
    lead: list[str]  # the cells before the usage cells
    cpu: Decimal
    memory: Decimal
    namespace: str = ""
    name: str = ""
    usage_cells: list[str] = field(default_factory=list)
    history: Series | None = None


@dataclass
class Result:
    """What one run printed: the table (or document) and the warnings for stderr."""

    text: str = ""
    document: Any = None
    warnings: list[str] = field(default_factory=list)
    empty_message: str = ""  # stderr line when there is nothing to show (exit code 0)


def check_label_selector(text: str, flag: str = "--selector") -> None:
    """Parse a label selector here, as kubectl does, so a bad one is one clear error."""
    if not text:
        return
    from kcms.selectors import SelectorError, parse_label_selector

    try:
        parse_label_selector(text)
    except SelectorError as e:
        raise PluginError(f"invalid label selector {one_line(text, 100)} ({flag}): {one_line(e)}") from None


def check_field_selector(text: str) -> None:
    """A field selector is `key=value`, `key==value` or `key!=value` terms joined by commas."""
    for term in (t for t in text.split(",") if t.strip()):
        key = term.replace("==", "=").replace("!=", "=").partition("=")[0].strip()
        if "=" not in term or not key:
            raise PluginError(
                f"invalid field selector {one_line(text, 100)}: {one_line(term, 60)} is not key=value"
            )


async def require_metrics_api(api: API) -> None:
    if not await api.serves("metrics.k8s.io", "v1beta1"):
        raise PluginError("Metrics API not available")


async def _optional(awaitable: Awaitable[Any], warnings: list[str], what: str) -> Any:
    """The awaited answer, or None with a warning line when it failed."""
    try:
        return await awaitable
    except PluginError as e:
        warnings.append(f"{what}: {e}")
        return None


def _items(body: Any, kind: str, path: str) -> list[dict]:
    if isinstance(body, dict) and body.get("kind") == kind.removesuffix("List") and "metadata" in body:
        return [body]  # one object asked for by name
    items = body.get("items") if isinstance(body, dict) else None
    if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
        raise PluginError(f"the answer to GET {path} is not a {kind}")
    return items


def _meta(obj: dict, path: str) -> tuple[str, str]:
    meta = obj.get("metadata")
    if not isinstance(meta, dict) or not isinstance(meta.get("name"), str):
        raise PluginError(f"the answer to GET {path} has an object without metadata.name")
    ns = meta.get("namespace", "")
    return (ns if isinstance(ns, str) else ""), meta["name"]


def _usage(obj: Any, what: str) -> tuple[Decimal, Decimal]:
    usage = obj.get("usage") if isinstance(obj, dict) else None
    if usage is None:
        usage = {}
    if not isinstance(usage, dict):
        raise PluginError(f"{what}: usage is not a mapping")
    return output.quantity(usage.get("cpu"), f"{what} cpu"), output.quantity(
        usage.get("memory"), f"{what} memory"
    )


def _points(points: Any, resource: str) -> Series:
    """(time, value) of history points; malformed points are skipped (history only decorates)."""
    out: Series = []
    if not isinstance(points, list):
        return out
    for p in points[:10_000]:
        if not isinstance(p, dict) or not isinstance(p.get("usage"), dict):
            continue
        t = parse_time(p.get("timestamp"))
        try:
            v = output.quantity(p["usage"].get(resource), "history")
        except PluginError:
            continue
        if t is not None:
            out.append((t, float(v)))
    return out


def history_params(opts: Any) -> dict[str, str]:
    return {"since": opts.since_text}


def _sort(rows: list[Row], sort_by: str | None) -> None:
    """kubectl's order: by name (namespace first with -A); with --sort-by biggest first, ties in the
    API's order (``rows`` come in it), as kubectl's sort leaves them for up to 12 rows (Go's sort.Sort
    is an insertion sort there; beyond, kubectl's order of ties is unspecified)."""
    if not sort_by:
        rows.sort(key=lambda r: r.key)
    elif sort_by == "cpu":
        rows.sort(key=lambda r: -output.milli(r.cpu))
    elif sort_by == "memory":
        rows.sort(key=lambda r: -r.memory)


def _render(rows: list[Row], header: list[str], opts: Any, spark: str | None) -> str:
    table: list[list[str]] = []
    axis = None
    if spark is not None:
        series = [r.history for r in rows if r.history]
        newest = max((t for s in series for t, _ in s), default=None)
        if newest is not None:
            axis = Axis(newest, opts.since, resolution(series))
        header = header + [f"{spark.upper()}-HISTORY({opts.since_text})"]
    if not opts.no_headers:
        table.append(header)
    for r in rows:
        cells = r.lead + r.usage_cells
        if spark is not None:
            cells = cells + [axis.render(r.history) if axis is not None and r.history else "-"]
        table.append(cells)
    return output.table(table)


def _spark_resource(opts: Any) -> str | None:
    if opts.sparkline == "off":
        return None
    if opts.sparkline == "auto":
        return "memory" if opts.sort_by == "memory" else "cpu"
    return opts.sparkline


async def _history(api: API, path: str, params: dict[str, str], warnings: list[str]) -> list[dict] | None:
    body = await _optional(api.get(path, params), warnings, "warning: no history")
    if isinstance(body, dict) and isinstance(body.get("items"), list):
        return output.typed(body, [i for i in body["items"] if isinstance(i, dict)])
    if isinstance(body, dict) and isinstance(body.get("metadata"), dict):
        return [body]  # one object asked for by name
    if body is not None:
        warnings.append(f"warning: no history: the answer to GET {path} is not a history list")
    return None


async def _metrics_and_history(
    metrics: Awaitable[Any], history: Awaitable[list[dict] | None] | None, opts: Any, res: Result
) -> tuple[Any, list[dict] | None]:
    """The metrics list and, read at the same time, the history; the history read is dropped when the
    table has over MAX_AUTO_HISTORY_ROWS rows and the column was not asked for (--sparkline auto): the
    history of 30 000 pods is some 100 MB of JSON, too much to fetch for a decoration."""
    task = asyncio.ensure_future(history) if history is not None else None
    try:
        body = await metrics
    except BaseException:
        if task is not None:
            task.cancel()
        raise
    if task is None:
        return body, None
    items = body.get("items") if isinstance(body, dict) else None
    rows = len(items) if isinstance(items, list) else 1
    if opts.sparkline == "auto" and rows > MAX_AUTO_HISTORY_ROWS:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        res.warnings.append(
            f"warning: no history column for {rows} rows (over {MAX_AUTO_HISTORY_ROWS}): narrow with "
            "-n or -l, or ask for it with --sparkline cpu|memory"
        )
        return body, None
    return body, await task


async def top_nodes(api: API, opts: Any) -> Result:
    check_label_selector(opts.selector)
    if opts.name and opts.selector:
        raise PluginError("only one of NAME or --selector can be provided")
    await require_metrics_api(api)
    res = Result()
    spark = _spark_resource(opts)
    with_history = spark is not None and await api.serves(HISTORY_GROUP, HISTORY_VERSION)
    params = {"labelSelector": opts.selector}
    suffix = f"/nodes/{opts.name}" if opts.name else "/nodes"
    node_path = f"/api/v1{suffix}"
    node_problems: list[str] = []
    nodes_task = asyncio.ensure_future(
        _optional(api.get(node_path, params), node_problems, f"cannot read {node_path}")
    )
    try:
        body, history = await _metrics_and_history(
            api.get(METRICS + suffix, params),
            _history(api, HISTORY + suffix, {**params, **history_params(opts)}, res.warnings)
            if with_history
            else None,
            opts,
            res,
        )
    except BaseException:
        nodes_task.cancel()
        raise
    nodes_body = await nodes_task
    items = output.typed(body, _items(body, "NodeMetricsList", METRICS + suffix))
    if not items:
        raise PluginError("metrics not available yet")
    available: dict[str, dict[str, Decimal]] | None = None
    if nodes_body is not None:
        try:
            available = {}
            for node in _items(nodes_body, "NodeList", node_path):
                _, name = _meta(node, node_path)
                status = node.get("status") if isinstance(node.get("status"), dict) else {}
                alloc = status.get("capacity" if opts.show_capacity else "allocatable")
                if isinstance(alloc, dict):
                    available[name] = {
                        r: output.quantity(alloc.get(r), f"node {name} {r}")
                        for r in ("cpu", "memory")
                        if r in alloc
                    }
        except PluginError as e:
            node_problems.append(f"cannot read {node_path}: {e}")
            available = None
    if available is None:
        res.warnings.append(f"warning: CPU(%) and MEMORY(%) are <unknown>: {'; '.join(node_problems)}")
    hist_by_name: dict[str, Series] = {}
    for h in history or []:
        meta = h.get("metadata") if isinstance(h.get("metadata"), dict) else {}
        if isinstance(meta.get("name"), str):
            hist_by_name[meta["name"]] = _points(h.get("points"), spark or "cpu")

    rows: list[Row] = []
    seen: set[str] = set()
    for m in items:
        _, name = _meta(m, METRICS + suffix)
        cpu, mem = _usage(m, f"node {one_line(name, 60)}")
        alloc = (available or {}).get(name, {}) if available is not None else None
        seen.add(name)
        rows.append(
            Row(
                (name,),
                [name],
                cpu,
                mem,
                name=name,
                usage_cells=[
                    output.cpu_cell(cpu),
                    output.percent_cell(cpu, alloc.get("cpu") if alloc is not None else None),
                    output.memory_cell(mem),
                    output.percent_cell(mem, alloc.get("memory") if alloc is not None else None),
                ],
                history=hist_by_name.get(name),
            )
        )
    _sort(rows, opts.sort_by)
    missing = sorted(n for n in (available or {}) if n not in seen)
    for name in missing:  # listed nodes without metrics: kubectl's <unknown> rows, after the others
        rows.append(Row((name,), [name], Decimal(0), Decimal(0), name=name, usage_cells=[output.UNKNOWN] * 4))
    if opts.output:
        order = {r.name: i for i, r in enumerate(rows)}
        objs = sorted(items, key=lambda m: order.get(m["metadata"]["name"], 0))
        hist_objs = sorted(
            (h for h in history or [] if isinstance(h.get("metadata"), dict)),
            key=lambda h: order.get(h["metadata"].get("name"), len(order)),
        )
        res.document = output.as_list(objs + hist_objs)
        return res
    header = ["NAME", "CPU(cores)", "CPU(%)", "MEMORY(bytes)", "MEMORY(%)"]
    res.text = _render(rows, header, opts, spark if with_history and history is not None else None)
    return res


async def top_pods(api: API, opts: Any) -> Result:
    check_label_selector(opts.selector)
    check_field_selector(opts.field_selector)
    if opts.name and (opts.selector or opts.field_selector):
        raise PluginError("only one of NAME or selector can be provided")
    if opts.name and opts.all_namespaces:
        raise PluginError("a pod NAME needs a namespace: leave out -A")
    namespace = None if opts.all_namespaces else (opts.namespace or api.namespace or "default")
    await require_metrics_api(api)
    res = Result()
    spark = _spark_resource(opts)
    with_history = spark is not None and await api.serves(HISTORY_GROUP, HISTORY_VERSION)
    params = {"labelSelector": opts.selector, "fieldSelector": opts.field_selector}
    suffix = f"/namespaces/{namespace}/pods" if namespace is not None else "/pods"
    if opts.name:
        suffix += f"/{opts.name}"
    body, history = await _metrics_and_history(
        api.get(METRICS + suffix, params),
        _history(api, HISTORY + suffix, {**params, **history_params(opts)}, res.warnings)
        if with_history
        else None,
        opts,
        res,
    )
    items = output.typed(body, _items(body, "PodMetricsList", METRICS + suffix))
    if not items:
        await _why_empty(api, namespace, params)
        res.empty_message = (
            "No resources found" if namespace is None else f"No resources found in {namespace} namespace."
        )
        return res

    hist: dict[tuple[str, ...], Series] = {}
    for h in history or []:
        meta = h.get("metadata") if isinstance(h.get("metadata"), dict) else {}
        ns, pod = meta.get("namespace", ""), meta.get("name")
        if not isinstance(pod, str) or not isinstance(ns, str):
            continue
        total: dict[float, float] = {}
        for c in h.get("containers") or []:
            if not isinstance(c, dict) or not isinstance(c.get("name"), str):
                continue
            points = _points(c.get("points"), spark or "cpu")
            hist[(ns, pod, c["name"])] = points
            for t, v in points:
                total[t] = total.get(t, 0.0) + v
        hist[(ns, pod)] = sorted(total.items())

    with_ns = namespace is None
    pods: list[tuple[Row, list[Row]]] = []
    for m in items:
        ns, name = _meta(m, METRICS + suffix)
        containers = m.get("containers") or []
        if not isinstance(containers, list):
            raise PluginError(f"pod {one_line(name, 60)}: containers is not a list")
        crow: list[Row] = []
        cpu_total, mem_total = Decimal(0), Decimal(0)
        for c in containers:
            cname = c.get("name") if isinstance(c, dict) else None
            if not isinstance(cname, str):
                raise PluginError(f"pod {one_line(name, 60)}: a container without a name")
            cpu, mem = _usage(c, f"pod {one_line(name, 60)} container {one_line(cname, 60)}")
            cpu_total += cpu
            mem_total += mem
            lead = ([ns] if with_ns else []) + [name, cname]
            crow.append(
                Row((cname,), lead, cpu, mem, ns, name, [output.cpu_cell(cpu), output.memory_cell(mem)],
                    hist.get((ns, name, cname)))
            )  # fmt: skip
        lead = ([ns] if with_ns else []) + [name]
        key = (ns, name) if with_ns else (name,)
        pods.append(
            (Row(key, lead, cpu_total, mem_total, ns, name,
                 [output.cpu_cell(cpu_total), output.memory_cell(mem_total)], hist.get((ns, name))), crow)
        )  # fmt: skip
    pod_rows = [p for p, _ in pods]
    _sort(pod_rows, opts.sort_by)
    by_pod = {id(p): cs for p, cs in pods}
    rows: list[Row] = []
    for p in pod_rows:
        if opts.containers:
            cs = by_pod[id(p)]
            _sort(cs, opts.sort_by)
            rows.extend(cs)
        else:
            rows.append(p)
    if opts.output:
        order = {(r.namespace, r.name): i for i, r in enumerate(pod_rows)}

        def pos(obj: dict) -> int:
            meta = obj.get("metadata") or {}
            return order.get((meta.get("namespace", ""), meta.get("name")), len(order))

        hist_objs = sorted((h for h in history or [] if isinstance(h.get("metadata"), dict)), key=pos)
        res.document = output.as_list(sorted(items, key=pos) + hist_objs)
        return res
    header = (
        (["NAMESPACE"] if with_ns else [])
        + (["POD"] if opts.containers else [])
        + [
            "NAME",
            "CPU(cores)",
            "MEMORY(bytes)",
        ]
    )
    res.text = _render(rows, header, opts, spark if with_history and history is not None else None)
    return res


async def _why_empty(api: API, namespace: str | None, params: dict[str, str]) -> None:
    """No pod metrics: kubectl says "metrics not available yet" when pods exist; here too, when the
    pod list can be read (a server that is not a kube-apiserver has none: then nothing is said)."""
    path = f"/api/v1/namespaces/{namespace}/pods" if namespace is not None else "/api/v1/pods"
    try:
        body = await api.get(path, params)
    except PluginError:
        return
    if isinstance(body, dict) and isinstance(body.get("items"), list) and body["items"]:
        raise PluginError("metrics not available yet")


def print_result(res: Result, opts: Any) -> None:
    for w in res.warnings:
        print(w, file=sys.stderr)
    if res.empty_message:
        print(res.empty_message, file=sys.stderr)
    if res.document is not None:
        output.dump(res.document, opts.output)
    elif res.text:
        sys.stdout.write(res.text)
