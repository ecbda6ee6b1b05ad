// polyport status page: polls /status and redraws.  No build step, no
// external resources: DOM APIs and an inline SVG chart.
"use strict";

const REFRESH_MS = 2000;
const SVG = "http://www.w3.org/2000/svg";

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

function cell(tr, text, cls) {
  const td = document.createElement("td");
  td.textContent = text;
  if (cls) td.className = cls;
  tr.appendChild(td);
  return td;
}

function renderListeners(status) {
  const body = $("listeners").querySelector("tbody");
  body.replaceChildren();
  const rates = (status.rates && status.rates.by_protocol) || {};
  for (const l of status.listeners) {
    const tr = document.createElement("tr");
    tr.dataset.listener = l.name;
    const r = rates[l.name] || { append: 0, delivery: 0 };
    const errors = Object.entries(l.errors).map(([code, n]) => `${code}: ${n}`).join(", ");
    const values = [
      ["name", l.name, "text"], ["address", l.address, "text"],
      ["connections_open", fmt(l.connections_open)], ["connections_total", fmt(l.connections_total)],
      ["frames_in", fmt(l.frames_in)], ["frames_out", fmt(l.frames_out)],
      ["events_appended", fmt(l.events_appended)], ["events_delivered", fmt(l.events_delivered)],
      ["append_rate", fmt(r.append, 1)], ["delivery_rate", fmt(r.delivery, 1)],
      ["errors", errors || "0", "text"],
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
  if (!rows.length) {
    const tr = document.createElement("tr");
    const td = cell(tr, "no subscriptions", "text");
    td.colSpan = 6;
    body.appendChild(tr);
    return;
  }
  for (const s of rows) {
    const tr = document.createElement("tr");
    tr.dataset.kind = s.kind;
    cell(tr, s.kind, "text");
    cell(tr, s.name || "–", "text");
    cell(tr, JSON.stringify(s.selector), "text");
    cell(tr, s.state || "", "text");
    cell(tr, (s.lag_exact ? "" : "≤ ") + fmt(s.lag_events)).dataset.field = "lag_events";
    cell(tr, fmt(s.lag_seconds, 1)).dataset.field = "lag_seconds";
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
  const hh = String(d.getHours()).padStart(2, "0"), mm = String(d.getMinutes()).padStart(2, "0");
  if (bucket >= 3600) return `${d.getMonth() + 1}/${d.getDate()} ${hh}:00`;
  return `${hh}:${mm}:${String(d.getSeconds()).padStart(2, "0")}`;
}

function renderChart(chart) {
  const box = $("chart");
  const W = 900, H = 220, left = 56, bottom = 26, top = 10, right = 8;
  const points = chart.points || [];
  const max = Math.max(1, ...points.map(p => p.events));
  const root = svg("svg", { viewBox: `0 0 ${W} ${H}`, preserveAspectRatio: "none", role: "img" });
  root.id = "chart-svg";
  root.dataset.source = chart.source;
  root.dataset.total = String(points.reduce((a, p) => a + p.events, 0));
  const plotW = W - left - right, plotH = H - top - bottom;
  svg("line", { class: "axis", x1: left, y1: top + plotH, x2: W - right, y2: top + plotH }, root);
  svg("line", { class: "axis", x1: left, y1: top, x2: left, y2: top + plotH }, root);
  for (const frac of [0, 0.5, 1]) {
    const y = top + plotH * (1 - frac);
    const t = svg("text", { x: left - 6, y: y + 4, "text-anchor": "end" }, root);
    t.textContent = fmt(Math.round(max * frac));
  }
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
  const every = Math.max(1, Math.ceil(points.length / 6));
  points.forEach((p, i) => {
    if (i % every) return;
    const t = svg("text", { x: left + i * step, y: H - 8 }, root);
    t.textContent = label(p.t, chart.bucket_seconds);
  });
  box.replaceChildren(root);
  const per = chart.bucket_seconds >= 3600 ? "per hour, from the pipeline's event_stats"
    : `per ${chart.bucket_seconds} s, from this gateway's live counters`;
  $("chart-source").textContent = `(events ${per})`;
}

function render(status) {
  $("version").textContent = status.version;
  $("uptime").textContent = duration(status.uptime_seconds);
  $("updated").textContent = new Date(status.now).toLocaleTimeString();
  const ready = $("ready");
  const ok = status.ready && status.database.reachable;
  ready.textContent = ok ? "ready" : "not ready";
  ready.className = "badge " + (ok ? "ok" : "bad");
  $("rate-append").textContent = fmt(status.rates.append, 1);
  $("rate-delivery").textContent = fmt(status.rates.delivery, 1);
  $("rate-log").textContent = fmt(status.rates.log, 1);
  $("head").textContent = fmt(status.log.head_position);
  $("queue").textContent = fmt(status.writer.queue_depth);
  $("connections").textContent = fmt(
    status.listeners.reduce((a, l) => a + l.connections_open, 0));
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
  renderChart(status.chart);
  document.body.dataset.loaded = "true";
}

async function refresh() {
  try {
    const r = await fetch("/status", { cache: "no-store" });
    if (!r.ok) throw new Error(`/status answered ${r.status}`);
    render(await r.json());
    $("problem").hidden = true;
  } catch (err) {
    const p = $("problem");
    p.textContent = `cannot load /status: ${err.message}`;
    p.hidden = false;
  } finally {
    setTimeout(refresh, REFRESH_MS);
  }
}

refresh();
