// On a listener that needs API keys the page is opened as /?key=pk-populi-...; the
// stream and the snapshot must carry the same key (EventSource cannot send headers).
const PAGE_KEY = new URLSearchParams(window.location.search).get("key");
const KEY_QUERY = PAGE_KEY ? "?key=" + encodeURIComponent(PAGE_KEY) : "";

// The populi dashboard: draws /api/mesh, and redraws when /events says something
// changed. No framework, no build, nothing fetched from outside. Every string from the
// mesh goes in through textContent (member names are whatever a record says).
"use strict";

const SVG = "http://www.w3.org/2000/svg";
const FEED_MAX = 200;      // events kept in the page
const REFRESH_MIN_MS = 400; // at most one snapshot per this, however many events arrive
const IDLE_REFRESH_MS = 10000; // RTTs and VRAM move without events: a slow refresh
const BUSY_REFRESH_MS = 2000; // tasks change phase without events: faster while any runs
const GONE = ["dead", "left"]; // greyed, with "last seen"
const ENDED = ["succeeded", "failed", "cancelled"];

let lastSeq = 0;
let pending = null;
let lastFetch = 0;
let busy = false; // a task is pending or running

function el(tag, attrs, text) {
  const node = tag.startsWith("svg:")
    ? document.createElementNS(SVG, tag.slice(4))
    : document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, String(v));
  if (text !== undefined) node.textContent = text;
  return node;
}

function size(bytes) {
  if (bytes == null) return "?";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (bytes >= 1024 && i < units.length - 1) { bytes /= 1024; i++; }
  return `${i ? bytes.toFixed(1) : bytes} ${units[i]}`;
}

function drawBlobs(blobs) {
  const span = document.getElementById("blobs");
  span.textContent = blobs
    ? `blobs ${size(blobs.held)} held · ${size(blobs.in)} in · ${size(blobs.out)} out`
    : "";
  if (blobs) {
    span.dataset.held = String(blobs.held);
    span.dataset.in = String(blobs.in);
    span.dataset.out = String(blobs.out);
  }
}

function gib(bytes) {
  return bytes == null ? "?" : (bytes / 2 ** 30).toFixed(1);
}

function vram(gpus) {
  let used = 0, alloc = 0, known = false;
  for (const g of gpus) {
    if (g.verified && g.allocatable != null) {
      known = true;
      alloc += g.allocatable;
      used += g.memory_used || 0;
    }
  }
  return known ? { used, alloc } : null;
}

function drawMap(members) {
  const svg = document.getElementById("map");
  svg.replaceChildren();
  const cx = 300, cy = 200;
  const self = members.find((m) => m.self);
  const others = members.filter((m) => !m.self);
  const placed = [];
  if (self) placed.push([self, cx, cy]);
  const radius = others.length > 1 ? 150 : 130;
  others.forEach((m, i) => {
    const a = (2 * Math.PI * i) / Math.max(others.length, 1) - Math.PI / 2;
    placed.push([m, cx + radius * Math.cos(a), cy + radius * Math.sin(a)]);
  });
  for (const [m, x, y] of placed) {
    if (m.self) continue;
    const live = m.state === "alive" || m.state === "suspect";
    svg.append(el("svg:line", { x1: cx, y1: cy, x2: x, y2: y, class: live ? "link" : "link down" }));
  }
  for (const [m, x, y] of placed) {
    const g = el("svg:g", {
      class: `node state-${m.state}${m.self ? " self" : ""}${GONE.includes(m.state) ? " gone" : ""}`,
      "data-node-id": m.node_id,
      "data-state": m.state,
      transform: `translate(${x.toFixed(1)},${y.toFixed(1)})`,
    });
    g.append(el("svg:title", {}, `${m.name} (${m.node_id}) ${m.state}, ${m.address}${m.via ? ` via ${m.via}` : ""}`));
    g.append(el("svg:circle", { r: 18, class: `state-${m.state}` }));
    g.append(el("svg:text", { y: -26 }, m.name + (m.self ? " (this node)" : "")));
    const how = GONE.includes(m.state) ? `last seen ${lastSeen(m)}` : m.via ? `via ${m.via}` : "";
    const drain = m.status === "draining" ? " · draining" : "";
    g.append(el("svg:text", { y: 34, class: "via" }, [`${m.state}${drain}`, how].filter(Boolean).join(" · ")));
    m.gpus.forEach((gpu, i) => {
      const square = el("svg:rect", {
        x: -22 + i * 9, y: 40, width: 7, height: 7,
        class: `gpu ${gpu.verified ? "verified" : "declared"}`,
      });
      square.append(el("svg:title", {}, `${gpu.name || "?"} (${gpu.verified ? "verified" : "declared"})`));
      g.append(square);
    });
    const v = vram(m.gpus);
    if (v) {
      g.append(el("svg:rect", { x: -22, y: 50, width: 44, height: 5, class: "vram-bg" }));
      const w = v.alloc > 0 ? Math.min(44, (44 * v.used) / v.alloc) : 0;
      g.append(el("svg:rect", { x: -22, y: 50, width: w.toFixed(1), height: 5, class: "vram-used" }));
    }
    svg.append(g);
  }
}

function ago(seconds) {
  if (seconds == null) return "-";
  const s = Math.max(0, seconds);
  if (s < 60) return `${s.toFixed(0)}s ago`;
  if (s < 3600) return `${(s / 60).toFixed(0)}m ago`;
  if (s < 86400) return `${(s / 3600).toFixed(1)}h ago`;
  return `${(s / 86400).toFixed(1)}d ago`;
}

// "now" for a live member; for a dead or left one, how long ago it was last heard
// (`last_seen`, a unix time, when the rows carry it; else the time in its state).
function lastSeen(m) {
  if (!GONE.includes(m.state)) return "now";
  if (typeof m.last_seen === "number") return ago(Date.now() / 1000 - m.last_seen);
  return ago(m.state_since);
}

function gpuSummary(gpus) {
  if (!gpus.length) return "none";
  const counts = new Map();
  for (const g of gpus) {
    const key = `${g.name || "?"}${g.verified ? "" : " (declared)"}`;
    counts.set(key, (counts.get(key) || 0) + 1);
  }
  return Array.from(counts, ([name, n]) => (n > 1 ? `${n}× ${name}` : name)).join(", ");
}

function badge(text, cls) {
  return el("span", { class: `badge ${cls}` }, text);
}

function drawTable(members) {
  const body = document.querySelector("#members tbody");
  body.replaceChildren();
  for (const m of members) {
    const gone = GONE.includes(m.state);
    const tr = el("tr", {
      "data-node-id": m.node_id,
      "data-state": m.state,
      class: gone ? "gone" : "",
    });
    const v = vram(m.gpus);
    const name = el("td", {}, m.name + (m.self ? " *" : "") + (m.verified ? "" : " (unverified)"));
    if (m.status === "draining") name.append(badge("draining", "draining"));
    tr.append(name);
    const cells = [
      [m.state, { class: `state state-${m.state}` }],
      [lastSeen(m), { class: "last-seen" }],
      [m.address, {}],
      [m.via || "-", {}],
      [m.rtt_ms == null ? "-" : `${m.rtt_ms.toFixed(1)} ms`, {}],
      [gpuSummary(m.gpus), { class: "gpu-names" }],
      [v ? `${gib(v.used)} / ${gib(v.alloc)} GiB` : "-", {}],
      [m.version || "-", {}],
    ];
    for (const [text, attrs] of cells) tr.append(el("td", attrs, text));
    body.append(tr);
  }
}

// One row per GPU of every member: what a GPU owner looks at first.
function gpuRows(members) {
  const rows = [];
  for (const m of members) {
    for (const g of m.gpus) {
      rows.push({ member: m, gpu: g });
    }
  }
  return rows;
}

function pct(value) {
  return value == null ? "-" : `${value}%`;
}

// A section: `rows` null keeps the placeholder (the service is not running here);
// [] says "none now". `columns`: [heading, row => text, optional row => td attrs].
function drawRows(id, rows, columns, rowAttrs) {
  if (!Array.isArray(rows)) return;
  const table = el("table", { id, "data-rows": rows.length });
  const head = el("tr");
  for (const [label] of columns) head.append(el("th", {}, label));
  table.append(el("thead"), el("tbody"));
  table.tHead.append(head);
  for (const row of rows) {
    const tr = el("tr", rowAttrs ? rowAttrs(row) : {});
    for (const [, text, attrs] of columns) {
      const value = text(row);
      tr.append(el("td", attrs ? attrs(row) : {}, value == null || value === "" ? "-" : String(value)));
    }
    table.tBodies[0].append(tr);
  }
  if (!rows.length) {
    const tr = el("tr", { class: "empty" });
    tr.append(el("td", { colspan: columns.length }, "none now"));
    table.tBodies[0].append(tr);
  }
  document.getElementById(id).replaceWith(table);
}

function drawGpus(members) {
  drawRows("gpus", gpuRows(members), [
    ["node", (r) => r.member.name],
    ["GPU", (r) => r.gpu.name, () => ({ class: "gpu-name" })],
    ["source", (r) => (r.gpu.verified ? "verified" : "declared"),
      (r) => ({ class: r.gpu.verified ? "verified" : "declared" })],
    ["VRAM used / allocatable", (r) => (r.gpu.verified
      ? `${gib(r.gpu.memory_used)} / ${gib(r.gpu.allocatable)} GiB`
      : `${gib(r.gpu.memory_total)} GiB (declared)`)],
    ["utilisation", (r) => pct(r.gpu.utilization)],
    ["temperature", (r) => (r.gpu.temperature_c == null ? "-" : `${r.gpu.temperature_c} °C`)],
    ["health", (r) => r.gpu.health],
  ], (r) => ({
    "data-node-id": r.member.node_id,
    "data-gpu-name": r.gpu.name || "",
    class: GONE.includes(r.member.state) ? "gone" : "",
  }));
}

function drawSections(snapshot) {
  drawRows("tasks", snapshot.tasks, [
    ["task", (t) => t.task],
    ["phase", (t) => t.phase, (t) => ({ class: `phase phase-${t.phase}` })],
    ["epoch", (t) => t.epoch],
    ["owner", (t) => t.owner],
    ["kind", (t) => t.kind],
    ["age", (t) => (t.age_s == null ? "-" : ago(t.age_s).replace(" ago", ""))],
    ["exit", (t) => t.exit_code],
    ["why pending", (t) => t.why],
  ], (t) => ({ "data-task-id": t.id, "data-phase": t.phase }));
  drawRows("models", snapshot.models, [
    ["model", (m) => m.model],
    ["served by", (m) => m.served_by],
    ["engine", (m) => m.engine],
  ], (m) => ({ "data-model": m.model }));
  drawRows("routes", snapshot.routes, [
    ["when", (r) => (r.at == null ? "-" : new Date(r.at * 1000).toLocaleTimeString())],
    ["model", (r) => r.model],
    ["served by", (r) => r.served_by],
    ["tokens", (r) => r.tokens],
    ["attempts", (r) => r.attempts],
  ], (r) => ({ "data-model": r.model }));
}

function draw(snapshot) {
  const members = snapshot.members || [];
  document.getElementById("self-name").textContent =
    `${snapshot.node.name || "?"} · overlay ${snapshot.overlay.kind || "none"}`;
  document.getElementById("summary").textContent = (snapshot.cluster || {}).summary || "";
  drawBlobs(snapshot.blobs);
  drawMap(members);
  drawTable(members);
  drawGpus(members);
  drawSections(snapshot);
  busy = Array.isArray(snapshot.tasks) && snapshot.tasks.some((t) => !ENDED.includes(t.phase));
  document.body.dataset.members = String(members.length);
}

async function refresh() {
  pending = null;
  lastFetch = Date.now();
  try {
    const response = await fetch("/api/mesh" + KEY_QUERY, { cache: "no-store" });
    if (response.ok) draw(await response.json());
  } catch (err) {
    // The daemon is restarting: the event stream reconnects and asks again.
  }
}

function scheduleRefresh() {
  if (pending !== null) return;
  const wait = Math.max(0, lastFetch + REFRESH_MIN_MS - Date.now());
  pending = setTimeout(refresh, wait);
}

function addEvent(ev) {
  if (ev.seq <= lastSeq) return; // a reconnect replays the buffer
  lastSeq = ev.seq;
  const feed = document.getElementById("feed");
  const when = new Date(ev.time * 1000).toLocaleTimeString();
  const li = el("li", { "data-kind": ev.kind });
  li.append(el("span", { class: "kind" }, `${when} ${ev.kind}`), document.createTextNode(ev.message));
  feed.prepend(li);
  while (feed.children.length > FEED_MAX) feed.lastChild.remove();
}

function connect() {
  const stream = new EventSource("/events" + KEY_QUERY);
  const badge = document.getElementById("stream");
  stream.onopen = () => {
    badge.textContent = "live";
    badge.className = "stream-up";
    scheduleRefresh();
  };
  stream.onerror = () => {
    badge.textContent = "reconnecting";
    badge.className = "stream-down";
  };
  stream.onmessage = (message) => {
    let ev;
    try {
      ev = JSON.parse(message.data);
    } catch (err) {
      return;
    }
    addEvent(ev);
    scheduleRefresh();
  };
}

document.addEventListener("DOMContentLoaded", () => {
  refresh();
  connect();
  setInterval(scheduleRefresh, IDLE_REFRESH_MS);
  setInterval(() => { if (busy) scheduleRefresh(); }, BUSY_REFRESH_MS);
});
