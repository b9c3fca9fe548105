// KCMS dashboard page. Reads the cluster only through the local server's allow-listed proxy
// ("k8s/<API path>", relative to this page's URL, which holds the per-run token).
// Every string from the API enters the DOM as text (textContent / text nodes): never as HTML.
"use strict";

(function () {
  const MAX_POD_ROWS = 200; // rows drawn (with their sparklines); the rest is counted in a note
  const MAX_NAMESPACES = 16; // namespaces a namespaced custom/external metric is read in per refresh
  const MAX_METRICS = 40; // custom + external metrics whose values are read per refresh
  const MAX_PARALLEL = 6; // API requests in flight
  const TOP = 10;
  const COLORS = ["#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#ca8a04", "#db2777"];

  const state = {
    config: {},
    refresh: 15,
    history: false,
    historyNote: "",
    selected: null, // {kind: "node", name} or {kind: "pod", namespace, name}
    charts: [],
    snapshot: {},
    namespaces: [],
  };
  // Read by the browser tests (the JSON each render used, and how many refreshes were drawn);
  // ``render`` is set below, so a test can draw a snapshot it made.
  const hook = (window.kcmsDashboard = { snapshot: null, refreshes: 0, errors: [] });

  // ---- DOM helpers: text only -------------------------------------------------------------------
  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (k === "class") node.className = v;
      else node.setAttribute(k, String(v));
    }
    for (const child of children) {
      if (child === null || child === undefined) continue;
      node.appendChild(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }
  const $ = (id) => document.getElementById(id);
  const arr = (x) => (Array.isArray(x) ? x : []); // a list from the API, or none
  const resources = (r) => arr(r.body && r.body.resources).filter((x) => x && typeof x === "object");
  function clear(node) {
    while (node.firstChild) node.removeChild(node.firstChild);
  }
  function setText(id, text) {
    $(id).textContent = text;
  }

  // ---- Kubernetes quantities, exactly (BigInt): values in nano-units ----------------------------
  const DECIMAL = { n: -9, u: -6, m: -3, "": 0, k: 3, M: 6, G: 9, T: 12, P: 15, E: 18 };
  const BINARY = { Ki: 10, Mi: 20, Gi: 30, Ti: 40, Pi: 50, Ei: 60 };
  function pow10(e) {
    return 10n ** BigInt(e);
  }
  function ceilDiv(a, b) {
    return a >= 0n ? (a + b - 1n) / b : a / b;
  }
  // The quantity times 1e9 as a BigInt (rounded up below a nano-unit), or null when malformed.
  function nanos(text) {
    const m = /^([+-]?)(\d*)(?:\.(\d*))?(.*)$/.exec(String(text || "").trim());
    if (!m || (m[2] === "" && (m[3] === undefined || m[3] === ""))) return null;
    const digits = BigInt((m[2] || "0") + (m[3] || ""));
    let exp = -(m[3] || "").length;
    let binary = 0;
    const suffix = m[4];
    if (suffix in BINARY) binary = BINARY[suffix];
    else if (suffix in DECIMAL) exp += DECIMAL[suffix];
    else if (/^[eE][+-]?\d+$/.test(suffix)) exp += parseInt(suffix.slice(1), 10);
    else return null;
    let num = digits * (1n << BigInt(binary));
    exp += 9;
    num = exp >= 0 ? num * pow10(exp) : ceilDiv(num, pow10(-exp));
    return m[1] === "-" ? -num : num;
  }
  const milli = (n) => ceilDiv(n, 1000000n); // kubectl's MilliValue (rounded up)
  const whole = (n) => ceilDiv(n, 1000000000n); // kubectl's Value (rounded up)
  const fmtCPU = (n) => (n === null ? "—" : `${milli(n)}m`);
  const fmtMem = (n) => (n === null ? "—" : `${whole(n) / 1048576n}Mi`);
  const cores = (n) => (n === null ? null : Number(n) / 1e9);
  const mebibytes = (n) => (n === null ? null : Number(n) / 1e9 / 1048576);
  function sumNanos(list) {
    let total = 0n;
    for (const q of list) {
      const n = nanos(q);
      if (n === null) return null;
      total += n;
    }
    return total;
  }
  function fmtValue(text) {
    // A custom/external metric value: its quantity as sent, plus a plain number when it has a suffix.
    const n = nanos(text);
    if (n === null) return String(text);
    const plain = Number(n) / 1e9;
    return /^[+-]?\d+$/.test(String(text)) ? String(text) : `${text} (${+plain.toPrecision(6)})`;
  }

  // ---- time -------------------------------------------------------------------------------------
  function parseDuration(text) {
    const m = /^(\d+(?:\.\d+)?)(ms|s|m|h)$/.exec(String(text || ""));
    if (!m) return null;
    return parseFloat(m[1]) * { ms: 0.001, s: 1, m: 60, h: 3600 }[m[2]];
  }
  const clock = (d) => d.toLocaleTimeString([], { hour12: false });
  function age(ts) {
    const t = Date.parse(ts);
    if (Number.isNaN(t)) return "—";
    const s = Math.max(0, Math.round((Date.now() - t) / 1000));
    return s < 120 ? `${s}s ago` : s < 7200 ? `${Math.round(s / 60)}m ago` : `${Math.round(s / 3600)}h ago`;
  }

  // ---- API access through the local proxy -------------------------------------------------------
  async function api(path) {
    let resp;
    try {
      resp = await fetch("k8s" + path, { cache: "no-store", credentials: "same-origin" });
    } catch (e) {
      return { status: 0, body: null, error: `cannot reach the dashboard server (${e.message})` };
    }
    let body = null;
    try {
      body = await resp.json();
    } catch (e) {
      body = null;
    }
    const error = resp.ok ? null : (body && body.message) || `HTTP ${resp.status}`;
    return { status: resp.status, body, error };
  }
  async function pool(tasks, limit) {
    const out = new Array(tasks.length);
    let next = 0;
    async function worker() {
      while (next < tasks.length) {
        const i = next++;
        out[i] = await tasks[i]();
      }
    }
    await Promise.all(Array.from({ length: Math.min(limit, tasks.length) }, worker));
    return out;
  }
  // A path segment; ":" (legal in a path, common in recorded metric names) stays as it is: the proxy
  // refuses every percent-escape.
  const enc = (s) => encodeURIComponent(s).replace(/%3A/gi, ":");

  // The items of a list answer that have the shape the page reads (an object with a string name, and
  // a namespace for pods): one odd item from a server is left out, not a failed refresh.
  function items(r, namespaced) {
    if (r.status !== 200 || !r.body || !Array.isArray(r.body.items)) return [];
    return r.body.items.filter(
      (i) =>
        i && typeof i === "object" && i.metadata && typeof i.metadata.name === "string" && (!namespaced || typeof i.metadata.namespace === "string")
    );
  }

  // ---- one refresh ------------------------------------------------------------------------------
  async function load() {
    const errors = [];
    const note = (what, r) => {
      if (r.error) errors.push(`${what}: ${r.error}`);
    };
    const ns = $("namespace").value;
    const podsPath = ns ? `/namespaces/${enc(ns)}/pods` : "/pods";
    // Allocatable changes rarely and a NodeList is large (or absent: 404 on an API server that only
    // serves the metrics groups, such as `kcms demo`): read it on the first and every 20th refresh.
    const askNodes = state.nodeListAge === undefined || state.nodeListAge >= 20;
    const [nodes, pods, hist, nodeList] = await Promise.all([
      api("/apis/metrics.k8s.io/v1beta1/nodes"),
      api("/apis/metrics.k8s.io/v1beta1" + podsPath),
      api("/apis/history.kcms.io/v1alpha1"),
      askNodes ? api("/api/v1/nodes") : Promise.resolve(state.nodeList),
    ]);
    state.nodeListAge = askNodes ? 1 : state.nodeListAge + 1;
    state.nodeList = nodeList;
    note("node metrics", nodes);
    note("pod metrics", pods);
    state.history = hist.status === 200;
    state.historyNote =
      hist.status === 200 ? "" : hist.status === 403 ? "history.kcms.io: forbidden for this user" : "no history API (history.kcms.io) on this server";
    if (hist.status !== 200 && hist.status !== 404 && hist.status !== 403) note("history discovery", hist);
    const snap = {
      at: new Date().toISOString(),
      nodes: items(nodes),
      pods: items(pods, true),
      nodeList: nodeList.status === 200 ? items(nodeList) : null,
      history: state.history,
      nodeHistory: [],
      podHistory: [],
      scrapes: null,
      custom: null,
      external: null,
    };
    if (state.history) {
      const [nh, ph, sc] = await Promise.all([
        api("/apis/history.kcms.io/v1alpha1/nodes"),
        api("/apis/history.kcms.io/v1alpha1" + podsPath),
        api("/apis/history.kcms.io/v1alpha1/scrapes"),
      ]);
      note("node history", nh);
      note("pod history", ph);
      note("scrape status", sc);
      snap.nodeHistory = items(nh);
      snap.podHistory = items(ph, true);
      snap.scrapes = sc.status === 200 ? items(sc) : null;
    }
    for (const p of snap.pods) {
      const n = p.metadata && p.metadata.namespace;
      if (n && !state.namespaces.includes(n)) state.namespaces.push(n);
    }
    state.namespaces.sort();
    const namespaces = ns ? [ns] : state.namespaces.slice(0, MAX_NAMESPACES);
    const [custom, external] = await Promise.all([loadCustom(namespaces, errors), loadExternal(namespaces, errors)]);
    snap.custom = custom;
    snap.external = external;
    snap.namespacesRead = namespaces;
    snap.namespacesSkipped = ns ? 0 : Math.max(0, state.namespaces.length - MAX_NAMESPACES);
    return { snap, errors };
  }

  async function loadCustom(namespaces, errors) {
    const disc = await api("/apis/custom.metrics.k8s.io/v1beta2");
    if (disc.status === 404) return { available: false, metrics: [] };
    if (disc.error) {
      errors.push(`custom metrics discovery: ${disc.error}`);
      return { available: false, metrics: [] };
    }
    const metrics = [];
    for (const r of resources(disc).slice(0, MAX_METRICS)) {
      const slash = String(r.name || "").indexOf("/");
      if (slash < 1) continue;
      metrics.push({ resource: r.name.slice(0, slash), metric: r.name.slice(slash + 1), namespaced: !!r.namespaced, items: [], errors: [] });
    }
    const tasks = [];
    for (const m of metrics) {
      const base = "/apis/custom.metrics.k8s.io/v1beta2";
      let paths;
      if (m.resource === "namespaces") paths = namespaces.map((n) => `${base}/namespaces/${enc(n)}/metrics/${enc(m.metric)}`);
      else if (m.namespaced) paths = namespaces.map((n) => `${base}/namespaces/${enc(n)}/${enc(m.resource)}/*/${enc(m.metric)}`);
      else paths = [`${base}/${enc(m.resource)}/*/${enc(m.metric)}`];
      for (const path of paths) {
        tasks.push(async () => {
          const r = await api(path);
          if (r.status === 200) m.items.push(...arr(r.body.items).filter((i) => i && typeof i === "object"));
          else if (r.status !== 404) m.errors.push(r.error);
        });
      }
    }
    await pool(tasks, MAX_PARALLEL);
    return { available: true, metrics, more: Math.max(0, resources(disc).length - MAX_METRICS) };
  }

  async function loadExternal(namespaces, errors) {
    const disc = await api("/apis/external.metrics.k8s.io/v1beta1");
    if (disc.status === 404) return { available: false, metrics: [] };
    if (disc.error) {
      errors.push(`external metrics discovery: ${disc.error}`);
      return { available: false, metrics: [] };
    }
    const metrics = resources(disc).slice(0, MAX_METRICS).map((r) => ({ metric: String(r.name || ""), items: [], errors: [] }));
    const tasks = [];
    for (const m of metrics) {
      for (const n of namespaces) {
        tasks.push(async () => {
          const r = await api(`/apis/external.metrics.k8s.io/v1beta1/namespaces/${enc(n)}/${enc(m.metric)}`);
          if (r.status === 200) for (const item of arr(r.body.items)) if (item && typeof item === "object") m.items.push({ namespace: n, ...item });
          else if (r.status !== 404) m.errors.push(r.error);
        });
      }
    }
    await pool(tasks, MAX_PARALLEL);
    return { available: true, metrics };
  }

  // ---- derived views ----------------------------------------------------------------------------
  function podUsage(p) {
    const cs = arr(p.containers);
    return {
      cpu: sumNanos(cs.map((c) => (c.usage || {}).cpu)),
      memory: sumNanos(cs.map((c) => (c.usage || {}).memory)),
    };
  }
  const podKey = (ns, name) => `${ns}/${name}`;
  function nodeSeries(h) {
    const xs = [], cpu = [], mem = [];
    for (const p of arr(h.points)) {
      const t = Date.parse(p.timestamp);
      if (Number.isNaN(t)) continue;
      xs.push(t / 1000);
      cpu.push(cores(nanos((p.usage || {}).cpu)));
      mem.push(mebibytes(nanos((p.usage || {}).memory)));
    }
    return { xs, cpu: [cpu], mem: [mem], names: ["node"] };
  }
  function podSeries(h) {
    // The containers of one pod are read together (their timestamps align); a point missing in one
    // container leaves a gap (null) in that container's line and in the pod's total.
    const times = new Set();
    for (const c of arr(h.containers)) for (const p of arr(c.points)) times.add(p.timestamp);
    const order = [...times].filter((t) => !Number.isNaN(Date.parse(t))).sort((a, b) => Date.parse(a) - Date.parse(b));
    const xs = order.map((t) => Date.parse(t) / 1000);
    const names = ["pod total"];
    const cpu = [order.map(() => 0)], mem = [order.map(() => 0)];
    for (const c of arr(h.containers)) {
      const byTime = new Map(arr(c.points).map((p) => [p.timestamp, p.usage || {}]));
      const cc = order.map((t) => (byTime.has(t) ? cores(nanos(byTime.get(t).cpu)) : null));
      const cm = order.map((t) => (byTime.has(t) ? mebibytes(nanos(byTime.get(t).memory)) : null));
      names.push(String(c.name));
      cpu.push(cc);
      mem.push(cm);
      cc.forEach((v, i) => (cpu[0][i] = v === null || cpu[0][i] === null ? null : cpu[0][i] + v));
      cm.forEach((v, i) => (mem[0][i] = v === null || mem[0][i] === null ? null : mem[0][i] + v));
    }
    return { xs, cpu, mem, names };
  }

  // ---- charts (uPlot) ---------------------------------------------------------------------------
  function destroyCharts() {
    for (const c of state.charts) c.destroy();
    state.charts = [];
  }
  function sparkline(values, xs, color, label) {
    const box = el("div", { class: "spark", "data-points": String(xs.length), "aria-label": label });
    if (xs.length === 0 || typeof uPlot === "undefined") return box;
    const opts = {
      width: 110,
      height: 26,
      pxAlign: false,
      cursor: { show: false },
      legend: { show: false },
      select: { show: false },
      // The row's own range (its shape); the large chart of a selected row starts at zero.
      scales: { x: { time: false }, y: { range: (u, min, max) => (max > min ? [min - (max - min) * 0.1, max + (max - min) * 0.1] : [min * 0.9, max * 1.1 + 1e-9]) } },
      axes: [{ show: false }, { show: false }],
      series: [{}, { stroke: color, fill: color + "22", width: 1.25, points: { show: xs.length < 3 } }],
    };
    state.charts.push(new uPlot(opts, [xs, values], box));
    return box;
  }
  function bigChart(target, title, unit, series, fmt) {
    clear(target);
    const total = series.xs.length;
    target.setAttribute("data-points", String(total));
    target.setAttribute("data-series", String(series.values.length));
    if (typeof uPlot === "undefined" || total === 0) {
      target.appendChild(el("p", { class: "muted" }, total === 0 ? "no points yet" : "charting library not loaded"));
      return;
    }
    const width = Math.max(280, target.clientWidth || 560);
    const opts = {
      title,
      width,
      height: 200,
      scales: { y: { range: (u, min, max) => [0, max > 0 ? max * 1.1 : 1] } },
      axes: [{ values: (u, vals) => vals.map((v) => clock(new Date(v * 1000))) }, { values: (u, vals) => vals.map((v) => fmt(v)), size: 60 }],
      series: [
        {},
        ...series.values.map((_, i) => ({
          label: series.names[i],
          stroke: COLORS[i % COLORS.length],
          width: i === 0 ? 2 : 1,
          value: (u, v) => (v === null || v === undefined ? "—" : fmt(v) + unit),
        })),
      ],
    };
    state.charts.push(new uPlot(opts, [series.xs, ...series.values], target));
  }

  // ---- rendering --------------------------------------------------------------------------------
  function head(table, names) {
    const thead = table.tHead;
    clear(thead);
    thead.appendChild(el("tr", {}, ...names.map((n) => el("th", {}, n))));
  }
  function selectable(row, sel) {
    row.tabIndex = 0;
    const pick = () => {
      state.selected = sel;
      renderSelected();
      for (const r of document.querySelectorAll("tr.selected")) r.classList.remove("selected");
      row.classList.add("selected");
    };
    row.addEventListener("click", pick);
    row.addEventListener("keydown", (e) => {
      if (e.key === "Enter") pick();
    });
    const s = state.selected;
    if (s && s.kind === sel.kind && s.name === sel.name && s.namespace === sel.namespace) row.classList.add("selected");
  }
  function badge(text, kind) {
    return el("span", { class: `badge ${kind}` }, text);
  }
  function matches(name) {
    const f = $("filter").value.trim().toLowerCase();
    return !f || String(name).toLowerCase().includes(f);
  }

  function render(snap, errors) {
    destroyCharts();
    state.snapshot = snap;
    const scrapes = new Map(arr(snap.scrapes).map((s) => [(s.metadata || {}).name, s]));
    const alloc = snap.nodeList ? new Map(snap.nodeList.map((n) => [n.metadata.name, (n.status || {}).allocatable || {}])) : null;
    const nodeHist = new Map(snap.nodeHistory.map((h) => [(h.metadata || {}).name, h]));
    const podHist = new Map(snap.podHistory.map((h) => [podKey((h.metadata || {}).namespace, (h.metadata || {}).name), h]));

    // errors
    const ul = $("errors");
    clear(ul);
    for (const e of errors) ul.appendChild(el("li", {}, e));

    // namespaces
    const select = $("namespace");
    const have = new Set([...select.options].map((o) => o.value));
    for (const n of state.namespaces) if (!have.has(n)) select.appendChild(el("option", { value: n }, n));

    // nodes
    // A stale node is shown missing even while metrics.k8s.io still serves its last reading (stale
    // after a resolution plus the timeout, dropped after two resolutions): never a frozen value.
    const isStale = (name) => !!(scrapes.get(name) && scrapes.get(name).stale);
    const nodeRows = [...snap.nodes]
      .filter((n) => !isStale(n.metadata.name))
      .sort((a, b) => String(a.metadata.name).localeCompare(String(b.metadata.name)));
    const names = new Set(nodeRows.map((n) => n.metadata.name));
    const missing = [];
    for (const name of [...(alloc ? alloc.keys() : []), ...scrapes.keys()]) {
      if (!names.has(name) && !missing.includes(name)) missing.push(name);
    }
    missing.sort();
    const nodesTable = $("nodes-table");
    const cols = ["Name", "CPU(cores)"];
    if (alloc) cols.push("CPU%");
    cols.push("Memory(bytes)");
    if (alloc) cols.push("Memory%");
    if (snap.history) cols.push("CPU history", "Memory history");
    cols.push("Status");
    head(nodesTable, cols);
    const nbody = nodesTable.tBodies[0];
    clear(nbody);
    let staleCount = 0;
    const nodeStatus = (name, hasMetrics) => {
      const s = scrapes.get(name);
      if (s && s.stale) return badge(s.lastError ? `stale: ${s.lastError}` : "stale", "bad");
      if (!hasMetrics) return badge("no metrics", "bad");
      if (s && s.consecutiveFailures > 0) return badge(`failing: ${s.lastError || "error"}`, "warn");
      return badge("ok", "good");
    };
    for (const n of nodeRows) {
      const name = n.metadata.name;
      if (!matches(name)) continue;
      const cpu = nanos((n.usage || {}).cpu), mem = nanos((n.usage || {}).memory);
      const cells = [el("td", { class: "name" }, name), el("td", { class: "num cpu" }, fmtCPU(cpu))];
      const a = alloc && alloc.get(name);
      if (alloc) cells.push(el("td", { class: "num cpu-pct" }, pct(cpu, a && nanos(a.cpu), milli)));
      cells.push(el("td", { class: "num memory" }, fmtMem(mem)));
      if (alloc) cells.push(el("td", { class: "num memory-pct" }, pct(mem, a && nanos(a.memory), whole)));
      if (snap.history) {
        const h = nodeHist.get(name);
        const s = h ? nodeSeries(h) : { xs: [], cpu: [[]], mem: [[]] };
        cells.push(el("td", { class: "chart-cell" }, sparkline(s.cpu[0], s.xs, COLORS[0], `CPU of ${name}`)));
        cells.push(el("td", { class: "chart-cell" }, sparkline(s.mem[0], s.xs, COLORS[2], `memory of ${name}`)));
      }
      cells.push(el("td", { class: "status" }, nodeStatus(name, true)));
      const row = el("tr", { "data-node": name }, ...cells);
      selectable(row, { kind: "node", name });
      nbody.appendChild(row);
    }
    for (const name of missing) {
      staleCount += isStale(name) ? 1 : 0; // every stale node is here, none among nodeRows
      if (!matches(name)) continue;
      // Absent from metrics.k8s.io (a stale node is reported missing, never with a frozen value);
      // its history until it went silent is still charted.
      const row = el("tr", { "data-node": name, class: "missing" }, el("td", { class: "name" }, name));
      const spark = snap.history ? 2 : 0;
      for (let i = 1; i < cols.length - 1 - spark; i++) row.appendChild(el("td", { class: "num" }, "—"));
      if (spark) {
        const h = nodeHist.get(name);
        const s = h ? nodeSeries(h) : { xs: [], cpu: [[]], mem: [[]] };
        row.appendChild(el("td", { class: "chart-cell" }, sparkline(s.cpu[0], s.xs, COLORS[1], `CPU of ${name}`)));
        row.appendChild(el("td", { class: "chart-cell" }, sparkline(s.mem[0], s.xs, COLORS[1], `memory of ${name}`)));
      }
      row.appendChild(el("td", { class: "status" }, nodeStatus(name, false)));
      selectable(row, { kind: "node", name });
      nbody.appendChild(row);
    }
    setText("nodes-when", whenOf(snap.nodes));

    // pods
    const podRows = snap.pods
      .map((p) => ({ p, ns: p.metadata.namespace, name: p.metadata.name, ...podUsage(p) }))
      .sort((a, b) => (a.ns === b.ns ? String(a.name).localeCompare(String(b.name)) : String(a.ns).localeCompare(String(b.ns))));
    const shown = podRows.filter((r) => matches(r.name) || matches(r.ns));
    const podsTable = $("pods-table");
    const pcols = ["Namespace", "Name", "Containers", "CPU(cores)", "Memory(bytes)"];
    if (snap.history) pcols.push("CPU history", "Memory history");
    head(podsTable, pcols);
    const pbody = podsTable.tBodies[0];
    clear(pbody);
    for (const r of shown.slice(0, MAX_POD_ROWS)) {
      const cells = [
        el("td", { class: "namespace" }, r.ns),
        el("td", { class: "name" }, r.name),
        el("td", { class: "num containers" }, String(arr(r.p.containers).length)),
        el("td", { class: "num cpu" }, fmtCPU(r.cpu)),
        el("td", { class: "num memory" }, fmtMem(r.memory)),
      ];
      if (snap.history) {
        const h = podHist.get(podKey(r.ns, r.name));
        const s = h ? podSeries(h) : { xs: [], cpu: [[]], mem: [[]] };
        cells.push(el("td", { class: "chart-cell" }, sparkline(s.cpu[0], s.xs, COLORS[0], `CPU of ${r.name}`)));
        cells.push(el("td", { class: "chart-cell" }, sparkline(s.mem[0], s.xs, COLORS[2], `memory of ${r.name}`)));
      }
      const row = el("tr", { "data-namespace": r.ns, "data-pod": r.name }, ...cells);
      selectable(row, { kind: "pod", namespace: r.ns, name: r.name });
      pbody.appendChild(row);
    }
    setText(
      "pods-note",
      (shown.length > MAX_POD_ROWS ? `Showing ${MAX_POD_ROWS} of ${shown.length} pods: choose a namespace or filter by name. ` : "") +
        (snap.history ? "" : `Charts need history: ${state.historyNote}; current usage only.`)
    );
    setText("pods-when", whenOf(snap.pods));

    // top consumers
    topTable($("top-cpu"), podRows.filter((r) => r.cpu !== null), (r) => r.cpu, fmtCPU);
    topTable($("top-memory"), podRows.filter((r) => r.memory !== null), (r) => r.memory, fmtMem);

    renderSummary(snap, nodeRows, podRows, alloc, staleCount, nodeRows.length + missing.length);
    renderCustom(snap.custom);
    renderExternal(snap.external);
    renderScrapes(snap);
    if (!state.selected && nodeRows.length) state.selected = { kind: "node", name: nodeRows[0].metadata.name };
    renderSelected();
  }

  function pct(usage, allocatable, unit) {
    if (usage === null || !allocatable) return "—";
    const a = unit(allocatable);
    return a > 0n ? `${(unit(usage) * 100n) / a}%` : "—";
  }
  function whenOf(items) {
    const ts = items.map((i) => Date.parse(i.timestamp)).filter((t) => !Number.isNaN(t));
    if (!ts.length) return "";
    const w = items.find((i) => i.window);
    return `as of ${clock(new Date(Math.max(...ts)))}` + (w ? `, window ${w.window}` : "");
  }
  function topTable(table, rows, value, fmt) {
    const body = table.tBodies[0];
    clear(body);
    const top = [...rows].sort((a, b) => (value(b) > value(a) ? 1 : value(b) < value(a) ? -1 : 0)).slice(0, TOP);
    const max = top.length ? Number(value(top[0])) : 0;
    for (const r of top) {
      const bar = el("span", { class: "bar" });
      bar.style.width = `${max > 0 ? Math.max(2, Math.round((Number(value(r)) / max) * 100)) : 0}%`;
      const row = el(
        "tr",
        { "data-namespace": r.ns, "data-pod": r.name },
        el("td", { class: "name" }, `${r.ns}/${r.name}`),
        el("td", { class: "num" }, fmt(value(r))),
        el("td", { class: "barcell" }, bar)
      );
      selectable(row, { kind: "pod", namespace: r.ns, name: r.name });
      body.appendChild(row);
    }
    if (!top.length) body.appendChild(el("tr", {}, el("td", { class: "muted" }, "no pod metrics")));
  }

  function card(label, value, sub, kind) {
    return el("div", { class: `card ${kind || ""}` }, el("div", { class: "label" }, label), el("div", { class: "value" }, value), el("div", { class: "sub muted" }, sub || ""));
  }
  // ``nodeRows``: the nodes the table shows with usage. A stale node is not among them even in the
  // window where metrics.k8s.io still serves its last reading (stale after a resolution plus the
  // timeout, dropped after two resolutions), so the totals never count a frozen value.
  function renderSummary(snap, nodeRows, podRows, alloc, staleCount, nodeCount) {
    const box = $("summary");
    clear(box);
    const cpu = nodeRows.reduce((t, n) => t + (nanos((n.usage || {}).cpu) || 0n), 0n);
    const mem = nodeRows.reduce((t, n) => t + (nanos((n.usage || {}).memory) || 0n), 0n);
    let cpuSub = "used by all nodes", memSub = "working set, all nodes";
    if (alloc) {
      const ac = [...alloc.values()].reduce((t, a) => t + (nanos(a.cpu) || 0n), 0n);
      const am = [...alloc.values()].reduce((t, a) => t + (nanos(a.memory) || 0n), 0n);
      cpuSub = `of ${milli(ac)}m allocatable`;
      memSub = `of ${whole(am) / 1048576n}Mi allocatable`;
    }
    const withMetrics = `${nodeRows.length} with metrics`;
    box.appendChild(card("Nodes", String(nodeCount), staleCount ? `${staleCount} stale, ${withMetrics}` : withMetrics, staleCount ? "bad" : ""));
    box.appendChild(card("Pods", String(podRows.length), $("namespace").value || "all namespaces"));
    box.appendChild(card("CPU", fmtCPU(cpu), cpuSub));
    box.appendChild(card("Memory", fmtMem(mem), memSub));
    box.appendChild(card("History", snap.history ? "on" : "off", snap.history ? "history.kcms.io" : state.historyNote));
  }

  function renderCustom(custom) {
    const box = $("custom-list");
    clear(box);
    if (!custom || !custom.available) {
      setText("custom-note", "custom.metrics.k8s.io is not served by this cluster.");
      return;
    }
    setText(
      "custom-note",
      `${custom.metrics.length} metric(s) discovered` +
        (custom.more ? ` (${custom.more} more not read)` : "") +
        "; namespaced ones read in " +
        arr(state.snapshot.namespacesRead).join(", ") +
        (state.snapshot.namespacesSkipped ? ` (+${state.snapshot.namespacesSkipped} namespaces not read)` : "")
    );
    for (const m of custom.metrics) {
      const windows = [...new Set(m.items.map((i) => (i.windowSeconds === undefined || i.windowSeconds === null ? "—" : `${i.windowSeconds}s`)))];
      const values = m.items.map((i) => nanos(i.value)).filter((v) => v !== null).map((v) => Number(v) / 1e9);
      const range = values.length ? ` · values ${+Math.min(...values).toPrecision(4)} to ${+Math.max(...values).toPrecision(4)}` : "";
      const summary = el(
        "summary",
        {},
        el("span", { class: "metric" }, m.metric),
        " ",
        el("span", { class: "muted" }, `${m.resource}${m.namespaced ? "" : " (cluster)"} · ${m.items.length} object(s)${range} · window ${windows.join(", ") || "—"}`)
      );
      const table = el("table", { class: "values" });
      table.appendChild(el("thead", {}, el("tr", {}, el("th", {}, "Object"), el("th", {}, "Labels"), el("th", {}, "Value"), el("th", {}, "Window"), el("th", {}, "Time"))));
      const body = el("tbody");
      for (const i of m.items) {
        const o = i.describedObject || {};
        const sel = ((i.metric || {}).selector || {}).matchLabels || {};
        body.appendChild(
          el(
            "tr",
            { "data-metric": m.metric },
            el("td", { class: "object" }, o.namespace ? `${o.namespace}/${o.name}` : String(o.name)),
            el("td", { class: "labels" }, labelText(sel)),
            el("td", { class: "num value" }, fmtValue(i.value)),
            el("td", { class: "num window" }, i.windowSeconds === undefined || i.windowSeconds === null ? "—" : `${i.windowSeconds}s`),
            el("td", { class: "time" }, age(i.timestamp))
          )
        );
      }
      for (const e of m.errors) body.appendChild(el("tr", {}, el("td", { class: "bad" }, e)));
      table.appendChild(body);
      box.appendChild(el("details", { "data-metric": m.metric, "data-resource": m.resource }, summary, table));
    }
  }
  function labelText(labels) {
    return Object.entries(labels || {})
      .map(([k, v]) => `${k}=${v}`)
      .join(", ");
  }

  function renderExternal(external) {
    const table = $("external-table");
    const body = table.tBodies[0];
    clear(body);
    head(table, ["Metric", "Namespace", "Labels", "Value", "Window", "Time"]);
    if (!external || !external.available) {
      setText("external-note", "external.metrics.k8s.io is not served by this cluster.");
      return;
    }
    setText("external-note", `${external.metrics.length} metric(s) discovered.`);
    for (const m of external.metrics) {
      if (!m.items.length) body.appendChild(el("tr", { "data-metric": m.metric }, el("td", { class: "metric" }, m.metric), el("td", { class: "muted" }, "no values")));
      // The same series is often served in every namespace (KCMS and prometheus-adapter rules without
      // a namespace label): identical answers are one row naming the namespaces that gave them.
      const groups = new Map();
      for (const i of m.items) {
        const key = JSON.stringify([labelText(i.metricLabels), i.value, i.windowSeconds, i.timestamp]);
        if (groups.has(key)) groups.get(key).namespaces.push(i.namespace);
        else groups.set(key, { ...i, namespaces: [i.namespace] });
      }
      for (const i of groups.values()) {
        body.appendChild(
          el(
            "tr",
            { "data-metric": m.metric },
            el("td", { class: "metric" }, m.metric),
            el("td", { class: "namespace" }, i.namespaces.join(", ")),
            el("td", { class: "labels" }, labelText(i.metricLabels)),
            el("td", { class: "num value" }, fmtValue(i.value)),
            el("td", { class: "num window" }, i.windowSeconds === undefined || i.windowSeconds === null ? "—" : `${i.windowSeconds}s`),
            el("td", { class: "time" }, age(i.timestamp))
          )
        );
      }
      for (const e of m.errors) body.appendChild(el("tr", {}, el("td", { class: "bad" }, e)));
    }
  }

  function renderScrapes(snap) {
    const table = $("scrapes-table");
    const body = table.tBodies[0];
    clear(body);
    if (!snap.history || snap.scrapes === null) {
      clear(table.tHead);
      setText("scrapes-note", `Scrape status comes with the history API: ${state.historyNote || "not readable"}.`);
      return;
    }
    head(table, ["Node", "State", "Last success", "Last error", "Failures in a row"]);
    const rows = [...snap.scrapes].sort((a, b) => Number(!!b.stale) - Number(!!a.stale) || (b.consecutiveFailures || 0) - (a.consecutiveFailures || 0) || String(a.metadata.name).localeCompare(String(b.metadata.name)));
    const bad = rows.filter((s) => s.stale || s.consecutiveFailures > 0).length;
    setText("scrapes-note", bad ? `${bad} node(s) stale or failing.` : `All ${rows.length} nodes scraped.`);
    for (const s of rows) {
      const stateText = s.stale ? badge("stale", "bad") : s.consecutiveFailures > 0 ? badge("failing", "warn") : badge("ok", "good");
      body.appendChild(
        el(
          "tr",
          { "data-node": s.metadata.name, class: s.stale ? "stale" : "" },
          el("td", { class: "name" }, s.metadata.name),
          el("td", { class: "state" }, stateText),
          el("td", { class: "time" }, s.lastSuccess ? age(s.lastSuccess) : "never"),
          el("td", { class: "error" }, s.lastError || ""),
          el("td", { class: "num failures" }, String(s.consecutiveFailures || 0))
        )
      );
    }
  }

  function renderSelected() {
    const s = state.selected;
    const snap = state.snapshot;
    const cpuBox = $("selected-cpu"), memBox = $("selected-memory");
    if (!s) return;
    const title = s.kind === "node" ? `Node ${s.name}` : `Pod ${s.namespace}/${s.name}`;
    setText("selected-title", title);
    $("selected").setAttribute("data-kind", s.kind);
    $("selected").setAttribute("data-name", s.kind === "node" ? s.name : podKey(s.namespace, s.name));
    if (!snap.history) {
      clear(cpuBox);
      clear(memBox);
      cpuBox.removeAttribute("data-points");
      memBox.removeAttribute("data-points");
      setText("selected-note", `No charts: ${state.historyNote}.`);
      return;
    }
    let series = null;
    if (s.kind === "node") {
      const h = snap.nodeHistory.find((x) => (x.metadata || {}).name === s.name);
      if (h) series = nodeSeries(h);
    } else {
      const h = snap.podHistory.find((x) => (x.metadata || {}).name === s.name && (x.metadata || {}).namespace === s.namespace);
      if (h) series = podSeries(h);
    }
    if (!series) series = { xs: [], cpu: [], mem: [], names: [] };
    const first = series.xs.length ? new Date(series.xs[0] * 1000) : null;
    setText("selected-note", series.xs.length ? `${series.xs.length} point(s) since ${clock(first)}; click a row to chart another node or pod.` : "No history for it yet.");
    bigChart(cpuBox, "CPU (cores)", " cores", { xs: series.xs, values: series.cpu, names: series.names }, (v) => v.toFixed(v < 1 ? 3 : 2));
    bigChart(memBox, "Memory (MiB)", " MiB", { xs: series.xs, values: series.mem, names: series.names }, (v) => v.toFixed(0));
  }

  // ---- the loop ---------------------------------------------------------------------------------
  let timer = null;
  let running = false;
  let again = false;
  async function refresh() {
    if (running) {
      again = true; // e.g. another namespace chosen during a refresh: read again once it ends
      return;
    }
    running = true;
    clearTimeout(timer);
    try {
      const { snap, errors } = await load();
      if (state.config.refresh) state.refresh = state.config.refresh;
      else {
        const w = snap.nodes.map((n) => parseDuration(n.window)).find((x) => x);
        if (w) state.refresh = Math.min(300, Math.max(5, Math.round(w)));
      }
      render(snap, errors);
      hook.snapshot = snap;
      hook.errors = errors;
      hook.refreshes += 1;
      setText("status", `updated ${clock(new Date())} · every ${state.refresh}s · history ${snap.history ? "on" : "off"}`);
    } catch (e) {
      setText("status", `refresh failed: ${e && e.message}`);
      hook.errors = [String(e && e.message)];
    } finally {
      running = false;
      timer = setTimeout(refresh, again ? 0 : state.refresh * 1000);
      again = false;
    }
  }

  async function start() {
    const r = await fetch("config.json", { cache: "no-store" });
    state.config = r.ok ? await r.json() : {};
    setText("server", `${state.config.context ? state.config.context + " · " : ""}${state.config.server || ""}`);
    $("namespace").addEventListener("change", refresh);
    let typing = null;
    $("filter").addEventListener("input", () => {
      clearTimeout(typing);
      if (hook.snapshot) typing = setTimeout(() => render(hook.snapshot, hook.errors), 200);
    });
    await refresh();
  }
  hook.render = render;
  document.addEventListener("DOMContentLoaded", start);
})();
