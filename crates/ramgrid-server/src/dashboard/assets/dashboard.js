// The ramgrid dashboard: polls the server's JSON API once a second and redraws. No libraries: the
// charts are SVG drawn here. The token (when the server has one) was put in sessionStorage by the
// login page and goes out as an Authorization header; it never appears in a URL.
"use strict";

const TOKEN_KEY = "ramgrid-token";
const POLL_MS = 1000;
const WINDOW_S = 300;
const CHART_PX = 170;
const COLORS = ["#2f6fd6", "#e07b39", "#2a9d8f", "#9b5de5", "#d62839", "#6a994e", "#f4a259", "#577590"];
const token = sessionStorage.getItem(TOKEN_KEY);
const headers = token ? { Authorization: "Bearer " + token } : {};
const $ = (id) => document.getElementById(id);
const colorOf = {};

function colorFor(name) {
  if (!(name in colorOf)) colorOf[name] = COLORS[Object.keys(colorOf).length % COLORS.length];
  return colorOf[name];
}

function esc(s) {
  return String(s).replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
}

function num(n, digits) {
  if (n === null || n === undefined || Number.isNaN(n)) return "–";
  if (Math.abs(n) >= 1e9) return (n / 1e9).toFixed(1) + "G";
  if (Math.abs(n) >= 1e6) return (n / 1e6).toFixed(1) + "M";
  if (Math.abs(n) >= 1e4) return (n / 1e3).toFixed(1) + "k";
  return digits === undefined ? String(Math.round(n)) : n.toFixed(digits);
}

function bytes(n) {
  if (n === null || n === undefined) return "–";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return (i === 0 ? n : n.toFixed(1)) + " " + units[i];
}

function duration(s) {
  if (s === null || s === undefined) return "–";
  if (s < 60) return s + " s";
  if (s < 3600) return Math.floor(s / 60) + " min";
  if (s < 86400) return (s / 3600).toFixed(1) + " h";
  return (s / 86400).toFixed(1) + " d";
}

function pct(hits, misses) {
  const all = hits + misses;
  return all > 0 ? (100 * hits / all).toFixed(1) + " %" : "–";
}

async function get(path) {
  const r = await fetch(path, { headers, cache: "no-store" });
  if (r.status === 401) {
    // The token changed or was wrong: back to the login page.
    sessionStorage.removeItem(TOKEN_KEY);
    location.reload();
    throw new Error("the server refused the token");
  }
  if (!r.ok) throw new Error(path + " answered " + r.status);
  return r.json();
}

// --- charts -------------------------------------------------------------------------------------

// A line chart of `series` ([{name, values, color}], values aligned with `t`, null for gaps) over
// the last WINDOW_S seconds; `log` draws the y axis in powers of ten.
function chart(el, t, series, { log = false, unit = "" } = {}) {
  const w = Math.max(el.clientWidth, 200), h = CHART_PX;
  const pad = { l: 44, r: 18, t: 8, b: 18 };
  const now = t.length ? t[t.length - 1] : Math.floor(Date.now() / 1000);
  const x0 = now - WINDOW_S;
  const vals = series.flatMap((s) => s.values).filter((v) => v !== null && v !== undefined && (!log || v > 0));
  let lo = 0, hi = Math.max(1, ...vals);
  if (log) {
    lo = Math.pow(10, Math.floor(Math.log10(Math.min(...vals, 1))));
    hi = Math.pow(10, Math.ceil(Math.log10(Math.max(...vals, 1))));
    if (hi <= lo) hi = lo * 10;
  } else {
    const step = Math.pow(10, Math.floor(Math.log10(hi)));
    hi = Math.ceil(hi / step) * step;
  }
  const X = (s) => pad.l + (w - pad.l - pad.r) * (s - x0) / WINDOW_S;
  const Y = (v) => {
    const f = log ? (Math.log10(v) - Math.log10(lo)) / (Math.log10(hi) - Math.log10(lo)) : (v - lo) / (hi - lo);
    return h - pad.b - (h - pad.t - pad.b) * f;
  };
  let out = `<svg viewBox="0 0 ${w} ${h}" height="${h}" preserveAspectRatio="none" role="img">`;
  const ticks = [];
  if (log) for (let v = lo; v <= hi * 1.0001; v *= 10) ticks.push(v);
  else for (let i = 0; i <= 4; i++) ticks.push(lo + (hi - lo) * i / 4);
  for (const v of ticks) {
    const y = Y(v).toFixed(1);
    out += `<line x1="${pad.l}" x2="${w - pad.r}" y1="${y}" y2="${y}" stroke="#e2e6ec"/>`;
    out += `<text x="${pad.l - 4}" y="${y}" text-anchor="end" dominant-baseline="middle">${esc(num(v, v < 10 && v !== Math.round(v) ? 2 : undefined))}${unit}</text>`;
  }
  for (let m = 0; m <= WINDOW_S; m += 60) {
    const x = X(x0 + m).toFixed(1);
    out += `<text x="${x}" y="${h - pad.b + 12}" text-anchor="middle">${m === WINDOW_S ? "now" : "-" + (WINDOW_S - m) / 60 + " min"}</text>`;
  }
  let legend = "";
  for (const s of series) {
    let d = "", pen = false;
    s.values.forEach((v, i) => {
      if (v === null || v === undefined || t[i] < x0 || (log && v <= 0)) { pen = false; return; }
      d += (pen ? "L" : "M") + X(t[i]).toFixed(1) + " " + Y(v).toFixed(1);
      pen = true;
    });
    if (d) out += `<path d="${d}" fill="none" stroke="${s.color}" stroke-width="1.6"/>`;
    legend += `<span><i style="background:${s.color}"></i>${esc(s.name)}</span>`;
  }
  el.innerHTML = out + `</svg><div class="legend">${legend}</div>`;
}

// --- sections -----------------------------------------------------------------------------------

function drawCluster(c) {
  $("where").textContent = "served by " + c.server;
  $("leader").textContent = c.leader || "none";
  $("term").textContent = c.term !== null ? "term " + c.term : "";
  $("quorum").textContent = c.quorum || "–";
  $("voters").textContent = c.voters + " voters";
  $("tolerated").textContent = c.failures_tolerated ?? "–";
  $("timeout").textContent = c.failure_timeout_ms ? "fail-over after " + c.failure_timeout_ms / 1000 + " s" : "";
  $("epoch").textContent = c.epoch || "–";
  $("moving").textContent = c.next ? "moving to " + c.next.join(", ") : (c.failed.length ? "failed over: " + c.failed.join(", ") : "");
  $("ops").textContent = num(c.totals.ops_per_s);
  const keys = c.members.reduce((a, m) => a + (m.keys_total || 0), 0);
  $("keys").textContent = num(keys) + " keys served";
  $("hitrate").textContent = pct(c.totals.hits_per_s, c.totals.misses_per_s);
  $("hitsmisses").textContent = num(c.totals.hits_per_s) + " hits/s, " + num(c.totals.misses_per_s) + " misses/s";
  const labels = { up: "up", down: "down", failed: "failed over", joining: "joining", unknown: "unknown" };
  $("members").tBodies[0].innerHTML = c.members.map((m) => {
    const r = m.repair;
    let repair = r.pending_partitions > 0
      ? `<span class="progress"><div style="width:${(100 * r.done_partitions / Math.max(1, r.peak_partitions)).toFixed(0)}%"></div></span>${r.done_partitions}/${r.peak_partitions} partitions`
      : "";
    if (r.copied_bytes > 0) repair += ` <span class="muted" title="${r.copied_partitions} partitions, ${r.copy_failures} failed copies">${bytes(r.copied_bytes)} copied since start</span>`;
    if (r.stranded_partitions > 0) repair += ` <span class="problem">${r.stranded_partitions} stranded</span>`;
    const title = m.error ? ` title="${esc(m.error)}"` : "";
    return `<tr data-member="${esc(m.addr)}" data-state="${m.state}">` +
      `<td class="mono${m.self ? " self" : ""}">${esc(m.addr)}</td>` +
      `<td class="state"><span class="badge ${m.state}"${title}>${labels[m.state] || m.state}</span></td>` +
      `<td class="role">${esc(m.role)}</td><td class="mono">${esc(m.epoch || "–")}</td>` +
      `<td>${duration(m.uptime_s)}</td><td class="num">${num(m.connections)}</td>` +
      `<td class="num">${bytes(m.table_bytes)}</td><td class="num">${num(m.ops_per_s)}</td><td>${repair}</td></tr>`;
  }).join("");
}

function drawTables(doc) {
  const tables = doc.tables;
  $("no-tables").hidden = tables.length > 0;
  $("tables").tBodies[0].innerHTML = tables.map((t) => {
    const max = Math.max(1, ...Object.values(t.bytes_per_server));
    const mem = Object.entries(t.bytes_per_server).map(([s, b]) =>
      `<span class="mono">${esc(s)}</span><span><span class="bar" style="width:${(100 * b / max).toFixed(0)}%"></span></span><span>${bytes(b)}</span>`).join("");
    const versions = t.versions.map((v) => `<span class="${v.current ? "current" : ""}" title="${v.items} items, ${bytes(v.bytes)}">v${v.number}</span>`).join(" ");
    return `<tr data-table="${esc(t.name)}"><td class="name">${esc(t.name)}</td><td class="current">${t.current ? "v" + t.current : "none"}</td>` +
      `<td class="versions">${versions}</td><td class="num items">${num(t.items)}</td><td><div class="mem">${mem}</div></td>` +
      `<td class="num">${num(t.ops_per_s)}</td><td class="num">${pct(t.hits_per_s, t.misses_per_s)}</td></tr>`;
  }).join("");
}

function drawBusiest(cluster, doc) {
  const rows = [
    ...doc.tables.map((t) => ({ what: "table " + t.name, ops: t.ops_per_s })),
    ...cluster.members.filter((m) => m.ops_per_s !== null).map((m) => ({ what: "server " + m.addr, ops: m.ops_per_s })),
  ].filter((r) => r.ops > 0).sort((a, b) => b.ops - a.ops).slice(0, 8);
  $("busiest").innerHTML = rows.length
    ? rows.map((r) => `<li>${esc(r.what)}: ${num(r.ops)} keys/s</li>`).join("")
    : `<li class="muted">idle</li>`;
}

function drawSeries(s) {
  const servers = Object.keys(s.servers).sort();
  chart($("chart-ops"), s.t, [
    { name: "all", values: s.total.ops, color: "#1c2330" },
    ...servers.map((a) => ({ name: a, values: s.servers[a].ops, color: colorFor(a) })),
  ]);
  chart($("chart-hits"), s.t, [
    { name: "hits", values: s.total.hits, color: "#1f8a4c" },
    { name: "misses", values: s.total.misses, color: "#c0392b" },
    { name: "refused", values: s.total.refused, color: "#b7791f" },
  ]);
  chart($("chart-latency"), s.t, [
    { name: "p50", values: s.total.p50_ms, color: "#2f6fd6" },
    { name: "p99", values: s.total.p99_ms, color: "#e07b39" },
    { name: "p99.9", values: s.total.p999_ms, color: "#d62839" },
  ], { log: true });
}

function drawEvents(doc) {
  $("events").innerHTML = doc.events.length
    ? doc.events.map((e) => `<li data-kind="${esc(e.kind)}"><time>${new Date(e.t_ms).toLocaleTimeString()}</time><span class="kind ${esc(e.kind)}">${esc(e.kind)}</span> ${esc(e.text)}</li>`).join("")
    : `<li class="muted">nothing yet</li>`;
}

async function poll() {
  try {
    const [cluster, tables, series, events] = await Promise.all(
      ["/api/cluster", "/api/tables", "/api/series", "/api/events"].map(get));
    drawCluster(cluster);
    drawTables(tables);
    drawBusiest(cluster, tables);
    drawSeries(series);
    drawEvents(events);
    $("updated").textContent = "updated " + new Date(cluster.time_ms).toLocaleTimeString();
    $("problem").hidden = true;
  } catch (err) {
    $("problem").textContent = "cannot reach the server: " + err.message;
    $("problem").hidden = false;
  } finally {
    setTimeout(poll, POLL_MS);
  }
}

poll();
