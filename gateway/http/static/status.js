// polyport status page: polls /status and redraws.  No build step, no
// external resources: DOM APIs and an inline SVG chart.
"use strict";

const REFRESH_MS = 2000;
const SVG = "http://www.w3.org/2000/svg";
// The admin token the operator typed: kept in this tab only (sessionStorage).
const TOKEN_KEY = "polyport-admin-token";
// One colour per protocol line in the connections chart.
const PALETTE = ["#3a6fd8", "#d8793a", "#2f9e5b", "#b03ab0", "#c9a227", "#3aa8b0", "#7a5230"];

function token() { return sessionStorage.getItem(TOKEN_KEY); }

// With the token /status reveals subscription names and selectors.
function authHeaders() {
  const t = token();
  return t ? { Authorization: `Bearer ${t}` } : {};
}

function $(id) { return document.getElementById(id); }

function fmt(n, digits) {
  if (n === null || n === undefined) return "–";
  if (typeof n !== "number") return String(n);
  if (digits !== undefined) return n.toFixed(digits);
  return n.toLocaleString("en-US");
}

function duration(seconds) {
  const s = Math.floor(seconds);
  const d = Math.floor(s / 86400), h = Math.floor((s % 86400) / 3600);
  const m = Math.floor((s % 3600) / 60), r = s % 60;
  if (d) return `${d}d ${h}h`;
  if (h) return `${h}h ${m}m`;
  if (m) return `${m}m ${r}s`;
  return `${r}s`;
}

// Every cell is text (left-aligned) or a number (right-aligned), as its
// column's header says.
function cell(tr, text, cls) {
  const td = document.createElement("td");
  td.textContent = text;
  td.className = cls || "num";
  tr.appendChild(td);
  return td;
}

function two(n) { return String(n).padStart(2, "0"); }

// 24-hour local time, whatever the browser's locale would choose.
function clock(d, seconds) {
  const hm = `${two(d.getHours())}:${two(d.getMinutes())}`;
  return seconds ? `${hm}:${two(d.getSeconds())}` : hm;
}

// Axis ticks at 0, step, 2·step, … ≥ max with step 1, 2 or 5 × 10^n (and
// whole numbers: the chart counts events), about `target` intervals.
function niceTicks(max, target) {
  const raw = Math.max(max, 1) / target;
  const mag = Math.pow(10, Math.floor(Math.log10(raw)));
  const norm = raw / mag;
  let step = (norm <= 1 ? 1 : norm <= 2 ? 2 : norm <= 5 ? 5 : 10) * mag;
  step = Math.max(1, Math.round(step));
  const top = Math.max(step, Math.ceil(max / step) * step);
  const ticks = [];
  for (let v = 0; v <= top; v += step) ticks.push(v);
  return ticks;
}

function renderListeners(status) {
  const body = $("listeners").querySelector("tbody");
  body.replaceChildren();
  const rates = (status.rates && status.rates.by_protocol) || {};
  for (const l of status.listeners) {
    const tr = document.createElement("tr");
    tr.dataset.listener = l.name;
    tr.dataset.kind = l.kind || "protocol";
    const protocol = tr.dataset.kind === "protocol";
    if (!protocol) tr.className = "transport";
    const r = rates[l.name] || { append: 0, delivery: 0 };
    const errors = Object.entries(l.errors).map(([code, n]) => `${code}: ${n}`).join(", ");
    let note = errors || "0";
    if (l.kind === "http") note = `${fmt(l.requests_total)} requests`;
    if (l.kind === "websocket") note = `counted with ${l.counted_with}`;
    const values = [
      ["name", l.name, "text"], ["address", l.address, "text"],
      ["connections_open", fmt(l.connections_open)], ["connections_total", fmt(l.connections_total)],
      ["frames_in", fmt(l.frames_in)], ["frames_out", fmt(l.frames_out)],
      ["events_appended", fmt(l.events_appended)], ["events_delivered", fmt(l.events_delivered)],
      ["append_rate", protocol ? fmt(r.append, 1) : "–"],
      ["delivery_rate", protocol ? fmt(r.delivery, 1) : "–"],
      ["errors", note, "text wrap"],
    ];
    for (const [field, text, cls] of values) cell(tr, text, cls).dataset.field = field;
    body.appendChild(tr);
  }
}

function renderSubscriptions(status) {
  const body = $("subscriptions").querySelector("tbody");
  body.replaceChildren();
  const subs = status.subscriptions;
  const rows = [...subs.durable, ...subs.in_process];
  const note = $("subscriptions-note");
  if (token() && !subs.names_shown) {
    note.textContent = "the admin token was not accepted: names stay hidden";
  } else if (!note.dataset.sticky) {
    note.textContent = subs.names_shown ? "" : "names, selectors and actions need the admin token";
  }
  if (!rows.length) {
    const tr = document.createElement("tr");
    const td = cell(tr, "no subscriptions", "text");
    td.colSpan = 8;
    body.appendChild(tr);
    return;
  }
  for (const s of rows) {
    const tr = document.createElement("tr");
    tr.dataset.kind = s.kind;
    cell(tr, s.kind, "text");
    // Names and selectors are only sent to an admin-token holder.
    const hidden = subs.names_shown === false;
    cell(tr, hidden ? "(hidden)" : (s.name || "–"), "text");
    cell(tr, hidden ? "(hidden)" : JSON.stringify(s.selector), "text wrap");
    cell(tr, s.state || "", "text");
    cell(tr, (s.lag_exact ? "" : "≤ ") + fmt(s.lag_events)).dataset.field = "lag_events";
    cell(tr, fmt(s.lag_seconds, 1)).dataset.field = "lag_seconds";
    cell(tr, s.kind === "durable" ? fmt(s.parked) : "–").dataset.field = "parked";
    const actions = cell(tr, "", "text");
    if (s.kind === "durable" && subs.names_shown && s.parked > 0) {
      actions.appendChild(replayButton(s));
    }
    body.appendChild(tr);
  }
}

// POST /admin/subscriptions/NAME/replay-parked: the group that owns the
// subscription hands its parked events out again.
function replayButton(s) {
  const button = document.createElement("button");
  button.textContent = `replay ${s.parked} parked`;
  button.dataset.replay = s.name;
  button.addEventListener("click", async () => {
    const note = $("subscriptions-note");
    note.dataset.sticky = "true";
    button.disabled = true;
    const context = (s.selector && s.selector.context) || "";
    try {
      const done = await admin("POST", `/subscriptions/${encodeURIComponent(s.name)}` +
        `/replay-parked?context=${encodeURIComponent(context)}`);
      note.textContent = `replaying ${done.replaying} parked events of ${s.name}`;
    } catch (err) {
      note.textContent = `cannot replay the parked events of ${s.name}: ${err.message}`;
      button.disabled = false;
    }
  });
  return button;
}

// Errors sent to clients, by canonical code, with the protocols they came from.
function renderErrors(status) {
  const body = $("errors").querySelector("tbody");
  body.replaceChildren();
  const byCode = new Map();
  for (const l of status.listeners) {
    if ((l.kind || "protocol") !== "protocol") continue;
    for (const [code, n] of Object.entries(l.errors)) {
      if (!n) continue;
      const entry = byCode.get(code) || { total: 0, protocols: [] };
      entry.total += n;
      entry.protocols.push(`${l.name}: ${fmt(n)}`);
      byCode.set(code, entry);
    }
  }
  const rows = [...byCode.entries()].sort((a, b) => b[1].total - a[1].total);
  $("errors-total").textContent = fmt(rows.reduce((a, [, e]) => a + e.total, 0));
  if (!rows.length) {
    const tr = document.createElement("tr");
    cell(tr, "no errors", "text").colSpan = 3;
    body.appendChild(tr);
    return;
  }
  for (const [code, e] of rows) {
    const tr = document.createElement("tr");
    tr.dataset.code = code;
    cell(tr, code, "text");
    cell(tr, fmt(e.total)).dataset.field = "total";
    cell(tr, e.protocols.join(", "), "text wrap");
    body.appendChild(tr);
  }
}

function svg(tag, attrs, parent) {
  const el = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, String(v));
  if (parent) parent.appendChild(el);
  return el;
}

function label(t, bucket) {
  const d = new Date(t);
  if (bucket >= 3600) return `${two(d.getMonth() + 1)}-${two(d.getDate())} ${two(d.getHours())}:00`;
  return clock(d, true);
}

// Both axes, and a grid line and a label per tick of the value axis.
function axes(root, { W, left, top, right, plotH }, ticks) {
  const max = ticks[ticks.length - 1];
  svg("line", { class: "axis", x1: left, y1: top + plotH, x2: W - right, y2: top + plotH }, root);
  svg("line", { class: "axis", x1: left, y1: top, x2: left, y2: top + plotH }, root);
  root.dataset.ticks = JSON.stringify(ticks);
  for (const v of ticks) {
    const y = top + plotH * (1 - v / max);
    if (v) svg("line", { class: "grid", x1: left, y1: y, x2: W - right, y2: y }, root);
    const t = svg("text", { class: "tick", x: left - 6, y: y + 4, "text-anchor": "end" }, root);
    t.textContent = fmt(v);
  }
}

// As many time labels as fit, about 110 px apart.
function timeLabels(root, labels, { W, H, left, plotW, step }) {
  const fit = Math.max(2, Math.floor(plotW / 110));
  const every = Math.max(1, Math.ceil(labels.length / fit));
  labels.forEach((text, i) => {
    const x = left + i * step;
    if (i % every || x + 70 > W) return;  // a label cut off at the right edge: none
    const t = svg("text", { x, y: H - 8 }, root);
    t.textContent = text;
  });
}

function renderChart(chart) {
  const box = $("chart");
  // Drawn at the box's own width: a stretched viewBox would distort the text.
  const W = Math.max(280, Math.round(box.clientWidth - 16) || 900);
  const H = 220, left = 56, bottom = 26, top = 10, right = 8;
  const points = chart.points || [];
  const ticks = niceTicks(Math.max(0, ...points.map(p => p.events)), 4);
  const max = ticks[ticks.length - 1];
  const root = svg("svg", { viewBox: `0 0 ${W} ${H}`, role: "img" });
  root.id = "chart-svg";
  root.dataset.source = chart.source;
  root.dataset.total = String(points.reduce((a, p) => a + p.events, 0));
  const plotW = W - left - right, plotH = H - top - bottom;
  axes(root, { W, left, top, right, plotH }, ticks);
  const step = points.length ? plotW / points.length : plotW;
  points.forEach((p, i) => {
    const h = (p.events / max) * plotH;
    const bar = svg("rect", {
      class: "bar", x: left + i * step + 1, y: top + plotH - h,
      width: Math.max(1, step - 2), height: h,
    }, root);
    bar.dataset.events = String(p.events);
    const title = svg("title", {}, bar);
    title.textContent = `${label(p.t, chart.bucket_seconds)}: ${p.events} events`;
  });
  timeLabels(root, points.map(p => label(p.t, chart.bucket_seconds)), { W, H, left, plotW, step });
  box.replaceChildren(root);
  const per = chart.bucket_seconds >= 3600 ? "per hour, from the pipeline's event_stats"
    : `per ${chart.bucket_seconds} s, from this gateway's live counters`;
  $("chart-source").textContent = `(events ${per})`;
}

// Open connections by protocol, one line each, over the last ten minutes.
function renderConnectionChart(points) {
  const box = $("connections-chart");
  const W = Math.max(280, Math.round(box.clientWidth - 16) || 900);
  const H = 180, left = 56, bottom = 26, top = 10, right = 8;
  const protocols = [...new Set(points.flatMap(p => Object.keys(p.open || {})))].sort();
  const values = points.flatMap(p => Object.values(p.open || {}));
  const ticks = niceTicks(Math.max(0, ...values), 3);
  const max = ticks[ticks.length - 1];
  const root = svg("svg", { viewBox: `0 0 ${W} ${H}`, role: "img" });
  const plotW = W - left - right, plotH = H - top - bottom;
  axes(root, { W, left, top, right, plotH }, ticks);
  const step = points.length > 1 ? plotW / (points.length - 1) : plotW;
  const legend = $("connections-legend");
  legend.replaceChildren();
  protocols.forEach((proto, k) => {
    const colour = PALETTE[k % PALETTE.length];
    // A bucket before the gateway started has no value: the line starts later.
    let d = "", pen = "M";
    points.forEach((p, i) => {
      const n = p.open ? p.open[proto] : undefined;
      if (n === undefined) { pen = "M"; return; }
      d += `${pen}${(left + i * step).toFixed(1)},${(top + plotH * (1 - n / max)).toFixed(1)} `;
      pen = "L";
    });
    const line = svg("path", { class: "line", d: d.trim(), stroke: colour }, root);
    line.dataset.protocol = proto;
    const at = points.findLastIndex(p => p.open && p.open[proto] !== undefined);
    const last = at < 0 ? undefined : points[at];
    line.dataset.last = String(last ? last.open[proto] : 0);
    // The newest value as a dot: a line of one bucket (just started) shows too.
    if (last) {
      svg("circle", { class: "dot", cx: left + at * step, r: 3, fill: colour,
                      cy: top + plotH * (1 - last.open[proto] / max) }, root);
    }
    const item = document.createElement("span");
    item.className = "legend-item";
    item.dataset.protocol = proto;
    item.style.borderColor = colour;
    item.textContent = `${proto} ${last ? fmt(last.open[proto]) : 0}`;
    legend.appendChild(item);
  });
  timeLabels(root, points.map(p => clock(new Date(p.t), true)), { W, H, left, plotW, step });
  box.replaceChildren(root);
}

function ms(seconds) {
  if (seconds === null || seconds === undefined) return "–";
  return fmt(seconds * 1000, seconds < 0.01 ? 2 : 1);
}

function render(status) {
  $("version").textContent = status.version;
  $("uptime").textContent = duration(status.uptime_seconds);
  $("updated").textContent = clock(new Date(status.now), true);
  const schema = status.schema || {};
  $("schema").textContent = schema.revision
    ? schema.revision + (schema.current === false ? ` (needs ${schema.head})` : "") : "–";
  const ready = $("ready");
  const ok = status.ready && status.database.reachable;
  ready.textContent = ok ? "ready" : "not ready";
  ready.className = "badge " + (ok ? "ok" : "bad");
  $("rate-append").textContent = fmt(status.rates.append, 1);
  $("rate-delivery").textContent = fmt(status.rates.delivery, 1);
  $("rate-log").textContent = fmt(status.rates.log, 1);
  $("append-p99").textContent = ms(status.latency.append.p99);
  $("commit-p99").textContent = ms(status.latency.commit.p99);
  $("latency-note").textContent = `(over the last ${fmt(status.latency.window_seconds, 0)} s: ` +
    `append p50 ${ms(status.latency.append.p50)} ms of ${fmt(status.latency.append.count)}, ` +
    `commit p50 ${ms(status.latency.commit.p50)} ms of ${fmt(status.latency.commit.count)})`;
  $("head").textContent = fmt(status.log.head_position);
  $("queue").textContent = fmt(status.writer.queue_depth);
  // Protocol listeners only: a WebSocket connection is in its protocol's row too.
  $("connections").textContent = fmt(status.listeners
    .filter(l => (l.kind || "protocol") === "protocol")
    .reduce((a, l) => a + l.connections_open, 0));
  $("live-subs").textContent = fmt(status.subscriptions.live);
  const db = status.database;
  $("database").textContent = db.reachable
    ? `${db.pool.size - db.pool.idle}/${db.pool.max} busy` : "unreachable";
  const b = status.writer.batch_sizes;
  $("writer").textContent =
    `${fmt(status.writer.commits)} commits, ${fmt(status.writer.events)} events; ` +
    `batch size mean ${fmt(b.mean, 1)}, p95 ${fmt(b.p95)}, max ${fmt(b.max)}`;
  renderListeners(status);
  renderSubscriptions(status);
  renderErrors(status);
  renderChart(status.chart);
  renderConnectionChart(status.connections_chart || []);
  document.body.dataset.loaded = "true";
}

// --- connections: GET /admin/connections with the token the operator typed ---

async function admin(method, path) {
  const r = await fetch("/admin" + path, { method, cache: "no-store", headers: authHeaders() });
  if (!r.ok) {
    let why = `${r.status}`;
    try { why = (await r.json()).error || why; } catch (_) { /* not JSON */ }
    throw new Error(why);
  }
  return r.status === 204 ? null : r.json();
}

async function refreshConnections() {
  if (!token()) return;
  const note = $("connections-note");
  let list;
  try {
    list = await admin("GET", "/connections");
  } catch (err) {
    note.textContent = `cannot list connections: ${err.message}`;
    $("connection-list").hidden = true;
    return;
  }
  note.textContent = `${list.length} open`;
  const table = $("connection-list");
  const body = table.querySelector("tbody");
  body.replaceChildren();
  for (const c of list) {
    const tr = document.createElement("tr");
    tr.dataset.connection = String(c.id);
    cell(tr, String(c.id));
    for (const text of [c.protocol, c.peer, c.user || "–", c.since.slice(0, 19)]) {
      cell(tr, text, "text");
    }
    for (const n of [c.bytes_in, c.bytes_out, c.events_in, c.events_out, c.subscriptions]) {
      cell(tr, fmt(n));
    }
    const close = document.createElement("button");
    close.textContent = "close";
    close.addEventListener("click", async () => {
      try { await admin("DELETE", `/connections/${c.id}`); } catch (err) {
        note.textContent = `cannot close ${c.id}: ${err.message}`;
      }
      refreshConnections();
    });
    cell(tr, "", "text").appendChild(close);
    body.appendChild(tr);
  }
  table.hidden = false;
}

$("admin-form").addEventListener("submit", (ev) => {
  ev.preventDefault();
  sessionStorage.setItem(TOKEN_KEY, $("admin-token").value);
  // At once, not at the next poll: names and actions appear with the token.
  clearTimeout(timer);
  refresh();
});

let timer = null;

async function refresh() {
  try {
    const r = await fetch("/status", { cache: "no-store", headers: authHeaders() });
    if (!r.ok) throw new Error(`/status answered ${r.status}`);
    render(await r.json());
    $("problem").hidden = true;
    refreshConnections();
  } catch (err) {
    const p = $("problem");
    p.textContent = `cannot load /status: ${err.message}`;
    p.hidden = false;
  } finally {
    clearTimeout(timer);
    timer = setTimeout(refresh, REFRESH_MS);
  }
}

refresh();
