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

let lastSeq = 0;
let pending = null;
let lastFetch = 0;

function el(tag, attrs, text) {
  const node = tag.startsWith("svg:")
    ? document.createElementNS(SVG, tag.slice(4))
    : document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, String(v));
  if (text !== undefined) node.textContent = text;
  return node;
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
      class: `node state-${m.state}${m.self ? " self" : ""}`,
      "data-node-id": m.node_id,
      "data-state": m.state,
      transform: `translate(${x.toFixed(1)},${y.toFixed(1)})`,
    });
    g.append(el("svg:title", {}, `${m.name} (${m.node_id}) ${m.state}, ${m.address}${m.via ? ` via ${m.via}` : ""}`));
    g.append(el("svg:circle", { r: 18, class: `state-${m.state}` }));
    g.append(el("svg:text", { y: -26 }, m.name + (m.self ? " (this node)" : "")));
    g.append(el("svg:text", { y: 34, class: "via" }, `${m.state}${m.via ? ` · via ${m.via}` : ""}`));
    m.gpus.forEach((gpu, i) => {
      g.append(el("svg:rect", {
        x: -22 + i * 9, y: 40, width: 7, height: 7,
        class: `gpu ${gpu.verified ? "verified" : "declared"}`,
      }));
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

function drawTable(members) {
  const body = document.querySelector("#members tbody");
  body.replaceChildren();
  for (const m of members) {
    const tr = el("tr", { "data-node-id": m.node_id, "data-state": m.state });
    const v = vram(m.gpus);
    const verified = m.gpus.filter((g) => g.verified).length;
    const declared = m.gpus.length - verified;
    const cells = [
      m.name + (m.self ? " *" : "") + (m.verified ? "" : " (unverified)"),
      m.state,
      m.address,
      m.via || "-",
      m.rtt_ms == null ? "-" : `${m.rtt_ms.toFixed(1)} ms`,
      m.gpus.length ? `${verified} verified, ${declared} declared` : "none",
      v ? `${gib(v.used)} / ${gib(v.alloc)} GiB` : "-",
      String(m.incarnation),
    ];
    cells.forEach((text, i) => tr.append(el("td", i === 1 ? { class: `state state-${m.state}` } : {}, text)));
    body.append(tr);
  }
}

function drawSections(snapshot) {
  for (const key of ["tasks", "routes"]) {
    const rows = snapshot[key];
    if (!Array.isArray(rows)) continue; // not running on this node yet: the placeholder
    const columns = [];
    for (const row of rows) for (const k of Object.keys(row)) if (!columns.includes(k)) columns.push(k);
    const table = el("table", { id: key, "data-rows": rows.length });
    const head = el("tr");
    columns.forEach((k) => head.append(el("th", {}, k)));
    table.append(el("thead"), el("tbody"));
    table.tHead.append(head);
    for (const row of rows) {
      const tr = el("tr");
      columns.forEach((k) => tr.append(el("td", {}, row[k] == null ? "-" : String(row[k]))));
      table.tBodies[0].append(tr);
    }
    if (!rows.length) {
      const tr = el("tr");
      tr.append(el("td", {}, "none now"));
      table.tBodies[0].append(tr);
    }
    document.getElementById(key).replaceWith(table);
  }
}

function draw(snapshot) {
  const members = snapshot.members || [];
  document.getElementById("self-name").textContent =
    `${snapshot.node.name || "?"} · overlay ${snapshot.overlay.kind || "none"}`;
  document.getElementById("summary").textContent = (snapshot.cluster || {}).summary || "";
  drawMap(members);
  drawTable(members);
  drawSections(snapshot);
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
});
