// Context Infinity dashboard: vanilla JS, no build step, no external assets.
// All data goes into the page through textContent / createElement, never innerHTML.
"use strict";

const KEY_STORE = "ci-key";
const ROWS_PAGE = 100;
const SESSIONS_PAGE = 50;
const JOURNAL_PAGE = 50;
const POLL_MS = 1500;
const SVG_NS = "http://www.w3.org/2000/svg";

// The page must live at /ui/ so the hash router and relative links behave.
if (location.pathname === "/ui") location.replace("/ui/" + location.hash);

const $ = (id) => document.getElementById(id);

// ---------- small DOM and format helpers ----------

// el("div", {class: "x", title: "y"}, child, "text", ...): strings become text nodes.
function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "text") node.textContent = v;
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children) if (c !== null && c !== undefined) node.append(c);
  return node;
}

function svg(tag, attrs, ...children) {
  const node = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  for (const c of children) if (c !== null && c !== undefined) node.append(c);
  return node;
}

// Fixed locale so numbers read the same everywhere ("5,120").
const num = (n) => (n === null || n === undefined ? "—" : Number(n).toLocaleString("en-US"));
const kTokens = (n) => (n >= 10000 ? Math.round(n / 1000) + "k" : n >= 1000 ? (n / 1000).toFixed(1) + "k" : String(n));
const dateTime = (t) => (t ? new Date(t * 1000).toLocaleString() : "—");
const clip = (s, n) => (s && s.length > n ? s.slice(0, n) + "…" : s || "");

function ago(t) {
  if (!t) return "—";
  const s = Math.round(Date.now() / 1000 - t);
  if (s < 45) return "just now";
  if (s < 3600) return Math.round(s / 60) + " min ago";
  if (s < 86400) return Math.round(s / 3600) + " h ago";
  if (s < 86400 * 14) return Math.round(s / 86400) + " d ago";
  return new Date(t * 1000).toLocaleDateString();
}

const duration = (s) => (s < 60 ? Math.round(s) + " s" : Math.floor(s / 60) + " min " + Math.round(s % 60) + " s");
const timeCell = (t) => el("time", { title: dateTime(t), datetime: t ? new Date(t * 1000).toISOString() : null, text: ago(t) });

// ---------- API and auth ----------

class AuthError extends Error {}
class NetError extends Error {}

async function api(path) {
  const headers = { Accept: "application/json" };
  const key = sessionStorage.getItem(KEY_STORE);
  if (key) headers.Authorization = "Bearer " + key;
  let res;
  try {
    res = await fetch(path, { headers, cache: "no-store" });
  } catch (e) {
    throw new NetError("Network error: " + e.message);
  }
  let body = null;
  try { body = await res.json(); } catch (e) { /* non-JSON error page */ }
  const message = (body && body.error && body.error.message) || res.status + " " + res.statusText;
  if (res.status === 401) throw new AuthError(message);
  if (!res.ok) throw new Error(message);
  return body;
}

function showError(message) {
  const box = $("error");
  box.textContent = message;
  box.hidden = !message;
}

// Central failure handler: a 401 asks for a key, anything else goes to the banner.
function fail(err) {
  if (err instanceof AuthError) askKey(err.message);
  else showError(err.message || String(err));
}

function askKey(message) {
  $("auth").hidden = false;
  $("streams-card").hidden = true; // its content is unknown without a key
  $("nav-streams").hidden = true;
  $("auth-message").textContent = message + " Enter the proxy key; it stays in this tab's session storage.";
  $("main").replaceChildren();
  showError("");
  stopPoll();
  $("key").focus();
}

function initAuth() {
  $("key-form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    const key = $("key").value.trim();
    if (!key) return;
    sessionStorage.setItem(KEY_STORE, key);
    $("key").value = "";
    $("auth").hidden = true;
    updateForget();
    route();
    startPoll(true);
  });
  $("nav-streams").addEventListener("click", () => $("streams-card").scrollIntoView({ block: "start" }));
  $("forget-key").addEventListener("click", (ev) => {
    ev.preventDefault();
    sessionStorage.removeItem(KEY_STORE);
    updateForget();
    location.hash = "#/";
    route();
  });
  updateForget();
}

const updateForget = () => { $("forget-key").hidden = !sessionStorage.getItem(KEY_STORE); };

// ---------- usage bar (shared by list and session page) ----------

function usageCell(u) {
  if (!u) return el("span", { class: "muted", text: "—" });
  const sev = ["green", "yellow", "red"].includes(u.severity) ? u.severity : "green";
  const fill = el("div", { class: "usage-fill" });
  fill.style.width = Math.max(0, Math.min(Number(u.percent) || 0, 100)) + "%";
  const bar = el("div", { class: "usage-bar " + sev, role: "meter", "aria-valuemin": 0, "aria-valuemax": 100,
    "aria-valuenow": Math.round(Number(u.percent) || 0), "aria-label": "Context usage" }, fill);
  return el("div", { class: "usage" }, bar, el("div", { class: "usage-text", text: u.text || "" }));
}

// A "Load more" button that disables itself while its page is loading.
function loadMoreButton(load) {
  const btn = el("button", { type: "button", class: "load-more", text: "Load more" });
  btn.addEventListener("click", async () => {
    btn.disabled = true;
    btn.textContent = "Loading…";
    try { await load(btn); } catch (e) { fail(e); btn.disabled = false; btn.textContent = "Load more"; }
  });
  return btn;
}

// ---------- router ----------

let viewToken = 0; // bumped per navigation so late answers for an old page are dropped

function route() {
  const token = ++viewToken;
  showError("");
  $("auth").hidden = true;
  $("streams-card").hidden = false;
  const hash = location.hash || "#/";
  const m = hash.match(/^#\/s\/(.+)$/);
  const main = $("main");
  main.replaceChildren(el("p", { class: "muted loading", text: "Loading…" }));
  window.scrollTo(0, 0);
  if (m) {
    let id;
    try { id = decodeURIComponent(m[1]); } catch (e) { id = m[1]; }
    renderSession(id, token).catch(fail);
  } else {
    renderList(token).catch(fail);
  }
}

const stale = (token) => token !== viewToken;

// ---------- session list ----------

async function renderList(token) {
  const first = await api(`/sessions?limit=${SESSIONS_PAGE}&offset=0`);
  if (stale(token)) return;
  const tbody = el("tbody");
  const table = el("table", { id: "sessions" },
    el("thead", {}, el("tr", {}, ...["Session", "Model", "Messages", "Updated", "Usage"].map((h) => el("th", { text: h })))),
    tbody);
  const card = el("section", { class: "card" },
    el("h2", {}, "Sessions"), el("div", { class: "scroll" }, table));
  let offset = 0;
  const add = (page) => {
    for (const s of page.data) tbody.append(sessionRow(s));
    offset += page.data.length;
    if (!page.data.length && !offset) tbody.append(el("tr", {}, el("td", { colspan: 5, class: "empty", text: "No sessions yet" })));
    if (page.has_more) card.append(loadMoreButton(async (btn) => {
      const next = await api(`/sessions?limit=${SESSIONS_PAGE}&offset=${offset}`);
      btn.remove();
      add(next);
    }));
  };
  add(first);
  $("main").replaceChildren(card);
}

function sessionRow(s) {
  const href = "#/s/" + encodeURIComponent(s.id);
  return el("tr", { class: "session-row", "data-session-id": s.id },
    el("td", { class: "id" }, el("a", { class: "session-link", href, text: s.id })),
    el("td", { text: s.model || "—" }),
    el("td", { class: "num", text: num(s.message_count) }),
    el("td", {}, timeCell(s.updated_at)),
    el("td", { class: "usage-cell" }, usageCell(s.usage)));
}

// ---------- session page ----------

async function renderSession(id, token) {
  const enc = encodeURIComponent(id);
  const base = `/ui/api/sessions/${enc}`;
  // Overview first (it 404s for unknown ids); the other parts load in parallel and fail independently.
  const ov = await api(base);
  if (stale(token)) return;
  const conv = el("div", { id: "conversation" });
  const view = el("div", { id: "session-view" },
    overviewCard(ov),
    el("section", { class: "card" }, el("h2", {}, "Tokens sent per turn"), el("div", { id: "plot-box", class: "plot-box" }, el("p", { class: "muted", text: "Loading…" }))),
    el("section", { class: "card", id: "cost-card" }, el("h2", {}, "Cost per turn"), el("div", { id: "cost-box", class: "plot-box" }, el("p", { class: "muted", text: "Loading…" }))),
    el("section", { class: "card", id: "conversation-card" },
      el("h2", {}, "Conversation ", el("span", { class: "count", text: `${num(ov.row_count)} rows · ${num(ov.message_count)} messages` })),
      conv),
    el("section", { class: "card", id: "journal-card" }, el("h2", {}, "Journal")),
    el("section", { class: "card", id: "events-card" }, el("h2", {}, "Compaction events"), el("ul", { id: "events" })));
  $("main").replaceChildren(view);
  const guard = (p) => p.catch((e) => { if (!stale(token)) fail(e); });
  guard(loadPlot(base, token));
  guard(loadRows(base, conv, 0, token));
  guard(loadJournal(id, $("journal-card"), token));
  guard(loadEvents(enc, token));
}

function overviewCard(ov) {
  const u = ov.usage;
  const lim = ov.limits || {};
  const facts = [
    ["Model", ov.model || "—"],
    ["Messages", num(ov.message_count)],
    ["Pins", num(ov.pins)],
    ["Compacted spans", num((ov.spans || []).length)],
    ["Context window", num(lim.context_window)],
    ["Max output", num(lim.max_output)],
    ["Limits from", lim.source || "—"],
    ["Created", dateTime(ov.created_at)],
    ["Updated", ov.updated_at ? `${dateTime(ov.updated_at)} (${ago(ov.updated_at)})` : "—"],
  ];
  if (u) {
    facts.splice(4, 0, ["History tokens", num(u.history_tokens)], ["Summaries in context", num(u.summaries_in_context)],
      ["Usage from", u.source === "last_request" ? "last request" : u.source || "—"]);
  }
  return el("section", { class: "card overview" },
    el("div", { class: "crumbs" }, el("a", { href: "#/", text: "← Sessions" })),
    el("h1", { class: "session-title" }, el("span", { class: "muted", text: "Session " }), el("span", { class: "sid", text: ov.id })),
    el("div", { class: "overview-usage" }, usageCell(u)),
    el("dl", { class: "facts" }, ...facts.flatMap(([k, v]) => [el("div", {}, el("dt", { text: k }), el("dd", { text: v }))])));
}

// ---------- usage plot ----------

async function loadPlot(base, token) {
  const data = await api(base + "/turns");
  if (stale(token)) return;
  const box = $("plot-box");
  box.plotData = data;
  drawPlot(box);
}

function drawPlot(box) {
  const data = box.plotData;
  box.drawnWidth = box.clientWidth;
  box.replaceChildren(plot(data.turns || [], data.compactions || [], box.clientWidth));
  const costBox = $("cost-box");
  if (costBox) costBox.replaceChildren(...costView(data.cost || { turns: [] }, costBox.clientWidth || box.clientWidth));
}

// ---------- cost plot ----------

// Per turn (journal step): input tokens the upstream billed, the part it read from its prompt cache, and the
// proxy's own summarizer tokens; above it the session's totals.
const COST_SERIES = [
  ["sent_tokens", "sent", "cost-sent"],
  ["cached_tokens", "cached", "cost-cached"],
  ["summarizer_tokens", "summarizer", "cost-summarizer"],
];

function costView(cost, width) {
  const share = cost.cached_share === null || cost.cached_share === undefined ? "–" : `${(100 * cost.cached_share).toFixed(1)} %`;
  const facts = [
    ["Sent upstream", num(cost.sent_tokens)],
    ["Cached", `${num(cost.cached_tokens)} (${share})`],
    ["Cache writes", num(cost.cache_creation_tokens)],
    ["Summarizer", `${num((cost.summarizer_prompt_tokens || 0) + (cost.summarizer_completion_tokens || 0))} in ${num(cost.summarizer_calls)} calls`],
    ["Client asked to send", num(cost.requested_tokens)],
  ];
  const summary = el("dl", { class: "facts", id: "cost-totals" }, ...facts.flatMap(([k, v]) => [el("div", {}, el("dt", { text: k }), el("dd", { text: v }))]));
  return [summary, costPlot(cost.turns || [], width)];
}

function costPlot(turns, width) {
  if (!turns.length) return el("p", { class: "empty", text: "No turns yet" });
  const W = Math.max(300, Math.round(width) || 800), H = W < 500 ? 180 : 220;
  const n = turns.length;
  const top = Math.max(1, ...turns.flatMap((t) => COST_SERIES.map(([key]) => t[key] || 0)));
  const { g, x, y } = plotFrame(n, top, W, H, "turn · sent (blue) · cached (green) · summarizer (purple)");
  for (const [key, label, cls] of COST_SERIES) {
    const points = turns.map((t, i) => `${x(i).toFixed(1)},${y(t[key] || 0).toFixed(1)}`).join(" ");
    g.append(svg("polyline", { class: "cost-line " + cls, points }, svg("title", {}, label)));
  }
  const r = n > 200 ? 1.5 : 3;
  turns.forEach((t, i) => {
    const tip = `turn ${i + 1}: sent ${num(t.sent_tokens)} · cached ${num(t.cached_tokens)} · cache writes ${num(t.cache_creation_tokens)} · ` +
      `summarizer ${num(t.summarizer_tokens)} (${t.summarizer_calls || 0} calls) · client asked ${num(t.requested_tokens)} · ${t.status}`;
    g.append(svg("circle", { class: "cost-point", cx: x(i).toFixed(1), cy: y(t.sent_tokens || 0).toFixed(1), r }, svg("title", {}, tip)));
  });
  return svg("svg", { id: "cost-plot", viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": "Sent, cached and summarizer tokens per turn",
    preserveAspectRatio: "xMidYMid meet" }, g);
}

// A window that changes width (a phone turned, a window narrowed) gets the plot drawn again at its new width,
// so its labels keep their size instead of shrinking with the whole picture.
let plotResize = 0;
window.addEventListener("resize", () => {
  clearTimeout(plotResize);
  plotResize = setTimeout(() => {
    const box = $("plot-box");
    if (box && box.plotData && box.clientWidth !== box.drawnWidth) drawPlot(box);
  }, 150);
});

// A plot's frame: scales for n turns up to `top` tokens, a grid with y labels at 0, 1/2 and full, the x labels and
// the axis title. Drawn in a viewBox as wide as the card so labels keep their size.
function plotFrame(n, top, W, H, title) {
  const L = 48, R = 12, T = 12, B = 34, headroom = 1.08;
  const x = (i) => L + (n === 1 ? (W - L - R) / 2 : (i * (W - L - R)) / (n - 1));
  const y = (v) => T + (H - T - B) * (1 - v / (top * headroom));
  const g = svg("g");
  for (const f of [0, 0.5, 1]) {
    const v = top * f, yy = y(v).toFixed(1);
    g.append(svg("line", { class: "grid", x1: L, x2: W - R, y1: yy, y2: yy }),
      svg("text", { class: "axis-label", x: L - 6, y: yy, "text-anchor": "end", "dominant-baseline": "middle" }, kTokens(Math.round(v))));
  }
  g.append(svg("text", { class: "axis-label", x: L, y: H - 14, "text-anchor": "start" }, "turn 1"),
    svg("text", { class: "axis-label", x: W - R, y: H - 14, "text-anchor": "end" }, "turn " + n),
    svg("text", { class: "axis-title", x: (L + W - R) / 2, y: H - 2, "text-anchor": "middle" }, title));
  return { g, x, y, L, R, T, B };
}

function plot(turns, compactions, width) {
  if (!turns.length) return el("p", { class: "empty", text: "No turns yet" });
  const W = Math.max(300, Math.round(width) || 800), H = W < 500 ? 200 : 240;
  const n = turns.length;
  const top = Math.max(1, ...turns.map((t) => Math.max(t.prompt_tokens || 0, t.budget || 0)));
  const { g, x, y, L, R, T, B } = plotFrame(n, top, W, H, "turn · tokens sent (blue) vs budget (dashed)");
  // Budget may change between turns (model switch), so it is a step polyline.
  const bpts = [];
  turns.forEach((t, i) => { if (t.budget) bpts.push(`${x(i).toFixed(1)},${y(t.budget).toFixed(1)}`); });
  if (bpts.length === 1) bpts.splice(0, 1, `${L},${bpts[0].split(",")[1]}`, `${(W - R).toFixed(1)},${bpts[0].split(",")[1]}`);
  if (bpts.length) g.append(svg("polyline", { class: "budget-line", points: bpts.join(" ") }, svg("title", {}, "budget")));
  for (const c of compactions) {
    const xx = (c.turn >= n ? W - R : c.turn <= 0 ? L : (x(c.turn - 1) + x(c.turn)) / 2).toFixed(1);
    const label = `${c.strategy || "compaction"} (${c.event || "?"}) before turn ${Math.min(c.turn + 1, n + 1)}: ` +
      `${num(c.tokens_before)} → ${num(c.tokens_after)} tokens${c.background ? " · background" : ""} · ${dateTime(c.created_at)}`;
    g.append(svg("line", { class: "compaction-mark", x1: xx, x2: xx, y1: T, y2: H - B }, svg("title", {}, label)));
  }
  const pts = [];
  turns.forEach((t, i) => { if (t.prompt_tokens !== null && t.prompt_tokens !== undefined) pts.push([i, t]); });
  g.append(svg("polyline", { class: "turn-line", points: pts.map(([i, t]) => `${x(i).toFixed(1)},${y(t.prompt_tokens).toFixed(1)}`).join(" ") }));
  const r = n > 200 ? 1.5 : 3;
  for (const [i, t] of pts) {
    const tip = `turn ${i + 1}: ${num(t.prompt_tokens)} / ${num(t.budget)} tokens · ${t.summaries || 0} summaries · ${t.status} · ${dateTime(t.created_at)}`;
    g.append(svg("circle", { class: "turn-point status-" + t.status, cx: x(i).toFixed(1), cy: y(t.prompt_tokens).toFixed(1), r }, svg("title", {}, tip)));
  }
  return svg("svg", { id: "usage-plot", viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": "Tokens sent per turn against the budget",
    preserveAspectRatio: "xMidYMid meet" }, g);
}

// ---------- conversation ----------

async function loadRows(base, conv, offset, token) {
  const page = await api(`${base}/rows?offset=${offset}&limit=${ROWS_PAGE}`);
  if (stale(token)) return;
  for (const row of page.rows) {
    if (row.kind === "span") conv.append(markerRow(base, row.span));
    else if (row.kind === "message") conv.append(messageRow(row.message));
  }
  if (!page.rows.length && !offset) conv.append(el("p", { class: "empty", text: "No messages yet" }));
  if (page.has_more) {
    const next = offset + page.rows.length;
    conv.append(loadMoreButton(async (btn) => { await loadRows(base, conv, next, token); btn.remove(); }));
  }
}

function messageRow(m) {
  const role = String(m.role || "unknown").replace(/[^a-z0-9_-]/gi, "");
  const head = el("div", { class: "msg-head" },
    el("span", { class: "role", text: m.role }),
    el("span", { class: "pos", text: "#" + m.position }),
    m.pinned ? el("span", { class: "pin", title: "pinned by " + m.pinned, text: "pinned · " + m.pinned }) : null,
    m.stubbed ? el("span", { class: "badge", text: "stubbed" }) : null,
    m.tool_call_id ? el("span", { class: "muted", text: "↳ " + m.tool_call_id }) : null,
    el("span", { class: "spacer" }),
    el("span", { class: "tokens", text: num(m.tokens) + " tok" }),
    m.created_at ? timeCell(m.created_at) : null);
  const row = el("div", { class: "msg role-" + role, "data-position": m.position }, head);
  const content = el("pre", { class: "content", text: m.content || "" });
  if (m.stubbed) {
    // Upstream saw only the stub; the original stays available behind a toggle.
    row.append(el("pre", { class: "stub", text: m.stub || "" }));
    content.hidden = true;
    content.classList.add("original");
    const btn = el("button", { type: "button", class: "show-original link", "aria-expanded": "false", text: "Show original" });
    btn.addEventListener("click", () => {
      content.hidden = !content.hidden;
      btn.textContent = content.hidden ? "Show original" : "Hide original";
      btn.setAttribute("aria-expanded", String(!content.hidden));
    });
    row.append(btn, content);
  } else if (m.content) {
    row.append(content);
  }
  if (m.truncated) row.append(el("div", { class: "muted small", text: `… cut; full length ${num(m.content_chars)} characters` }));
  for (const call of m.tool_calls || []) {
    row.append(el("div", { class: "tool-call" }, el("span", { class: "tool-name", text: "→ " + call.name }),
      el("span", { class: "muted", text: " " + (call.id || "") }), el("pre", { class: "args", text: call.arguments || "" })));
  }
  return row;
}

function spanLine(p) {
  const last = p.end - 1;
  return [p.strategy, `${num(p.messages)} messages (positions ${p.start}–${last})`,
    `${num(p.tokens_before)} → ${num(p.tokens_after)} tokens`, "model " + (p.model || "—"), p.generated_by || "—"].join(" · ");
}

function markerRow(base, p) {
  const body = el("div", { class: "marker-body", hidden: true });
  const btn = el("button", { type: "button", class: "marker-toggle", "aria-expanded": "false", text: "Show" });
  const row = el("div", { class: "marker", "data-span-id": p.id },
    el("div", { class: "marker-head" }, el("span", { class: "marker-line", text: spanLine(p) }), btn), body);
  let loaded = false;
  btn.addEventListener("click", async () => {
    const open = body.hidden;
    body.hidden = !open;
    btn.textContent = open ? "Hide" : "Show";
    btn.setAttribute("aria-expanded", String(open));
    if (!open || loaded) return; // fetched once; re-opening just unhides
    loaded = true;
    body.replaceChildren(el("p", { class: "muted", text: "Loading…" }));
    try {
      await loadSpan(base, p.id, body, 0);
    } catch (e) {
      loaded = false;
      body.replaceChildren();
      body.hidden = true;
      btn.textContent = "Show";
      fail(e);
    }
  });
  return row;
}

async function loadSpan(base, spanId, body, offset) {
  const page = await api(`${base}/spans/${encodeURIComponent(spanId)}?offset=${offset}&limit=${ROWS_PAGE}`);
  let originals = body.querySelector(".marker-originals");
  if (!originals) {
    originals = el("div", { class: "marker-originals" });
    body.replaceChildren(
      el("div", { class: "marker-label", text: "Sent upstream instead" }),
      el("pre", { class: "marker-summary content", text: page.span.content || "" }),
      el("div", { class: "marker-label", text: `Original messages (${num(page.total)})` }),
      originals);
  }
  for (const m of page.messages) originals.append(messageRow(m));
  if (page.has_more) {
    const next = offset + page.messages.length;
    originals.append(loadMoreButton(async (btn) => { await loadSpan(base, spanId, body, next); btn.remove(); }));
  }
}

// ---------- journal and events ----------

async function loadJournal(id, card, token) {
  const tbody = el("tbody");
  const table = el("table", { id: "journal" },
    el("thead", {}, el("tr", {}, ...["Step", "Status", "Time", "Prompt / budget", "Finish", "Content"].map((h) => el("th", { text: h })))),
    tbody);
  card.append(el("div", { class: "scroll" }, table));
  let offset = 0;
  const page = async () => {
    const res = await api(`/journal?session_id=${encodeURIComponent(id)}&limit=${JOURNAL_PAGE}&offset=${offset}`);
    if (stale(token)) return;
    for (const j of res.data) tbody.append(stepRow(j));
    offset += res.data.length;
    if (!offset) tbody.append(el("tr", {}, el("td", { colspan: 6, class: "empty", text: "No journal entries" })));
    if (res.has_more) card.append(loadMoreButton(async (btn) => { await page(); btn.remove(); }));
  };
  await page();
}

function stepRow(j) {
  const ctx = j.context || {};
  const status = String(j.status || "").replace(/[^a-z_-]/gi, "");
  const err = j.error && (j.error.message || (typeof j.error === "string" ? j.error : JSON.stringify(j.error)));
  const calls = (j.tool_calls || []).map((c) => "→ " + ((c.function && c.function.name) || "tool") + "(" +
    ((c.function && c.function.arguments) || "") + ")").join(" ");
  const preview = clip(String(j.content || calls || err || "").replace(/\s+/g, " "), 200);
  return el("tr", { class: "step-row", "data-step-id": j.step_id },
    el("td", { class: "mono small", title: j.step_id, text: clip(String(j.step_id), 14) }),
    el("td", {}, el("span", { class: `status status-${status}`, text: j.status })),
    el("td", {}, timeCell(j.created_at)),
    el("td", { class: "num", text: `${num(ctx.prompt_tokens)} / ${num(ctx.budget)}` }),
    el("td", { text: j.finish_reason || "—" }),
    el("td", { class: "preview" + (err && !j.content ? " error-text" : "") }, el("div", { class: "clamp", title: preview, text: preview || "—" })));
}

async function loadEvents(enc, token) {
  const res = await api(`/sessions/${enc}/events?limit=100`);
  if (stale(token)) return;
  const list = $("events");
  if (!res.events.length) list.append(el("li", { class: "empty", text: "No compaction events" }));
  for (const e of res.events) {
    const range = e.range_start !== null && e.range_start !== undefined ? `positions ${e.range_start}–${e.range_end - 1}` : null;
    const bits = [e.strategy, range, `${num(e.tokens_before)} → ${num(e.tokens_after)} tokens`,
      e.duration_ms !== null && e.duration_ms !== undefined ? num(e.duration_ms) + " ms" : null,
      e.generated_by, e.model, e.background ? "background" : null].filter(Boolean);
    list.append(el("li", { class: "event" },
      el("span", { class: "event-name", text: e.event }), el("span", { text: bits.join(" · ") }), timeCell(e.created_at),
      e.detail ? el("div", { class: "muted small detail", text: typeof e.detail === "string" ? e.detail : JSON.stringify(e.detail) }) : null));
  }
  if (res.more) list.append(el("li", { class: "muted small", text: "Older events not shown." }));
}

// ---------- in-flight streams (polled) ----------

const poll = { timer: 0, busy: false, stopped: false };

function stopPoll() {
  poll.stopped = true;
  clearTimeout(poll.timer);
  poll.timer = 0;
}

// One request at a time: the next one is scheduled only after the previous answer.
function startPoll(reset) {
  if (reset) poll.stopped = false;
  if (poll.stopped || poll.busy || poll.timer || document.hidden) return;
  tick();
}

async function tick() {
  poll.timer = 0;
  poll.busy = true;
  let delay = POLL_MS;
  try {
    renderStreams((await api("/ui/api/streams")).data || []);
  } catch (e) {
    if (e instanceof NetError) delay = POLL_MS * 4; // a blip (proxy restarting): keep trying, slower
    else { stopPoll(); fail(e); }
  } finally {
    poll.busy = false;
  }
  if (!poll.stopped && !document.hidden) poll.timer = setTimeout(tick, delay);
}

// Updates stream cards in place, keyed by step id, so the panel does not flicker every 1.5 s.
function renderStreams(streams) {
  const box = $("streams");
  $("streams-count").textContent = streams.length ? String(streams.length) : "";
  // The header stays in view: while streams run, it says so wherever the page is scrolled.
  const badge = $("nav-streams");
  badge.hidden = !streams.length;
  badge.textContent = streams.length + " in flight";
  const existing = new Map([...box.querySelectorAll(".stream")].map((n) => [n.dataset.stepId, n]));
  const empty = box.querySelector(".empty");
  if (!streams.length) {
    existing.forEach((n) => n.remove());
    if (!empty) box.append(el("p", { class: "empty", text: "No streams in flight" }));
    return;
  }
  if (empty) empty.remove();
  const seen = new Set();
  for (const s of streams) {
    seen.add(s.step_id);
    let card = existing.get(s.step_id);
    if (!card) {
      card = el("div", { class: "stream", "data-step-id": s.step_id },
        el("div", { class: "stream-head" },
          el("a", { class: "stream-session", href: "#/s/" + encodeURIComponent(s.session_id), text: s.session_id }),
          el("span", { class: "stream-model" }), el("span", { class: "spacer" }),
          el("span", { class: "stream-meta" }, el("span", { class: "stream-age" }), " · ", el("span", { class: "stream-chars" }))),
        el("pre", { class: "stream-tail" }));
      box.append(card);
    }
    card.querySelector(".stream-model").textContent = s.model || "";
    card.querySelector(".stream-age").textContent = duration(s.age_s || 0);
    card.querySelector(".stream-chars").textContent = `${num(s.chars)} chars · ${num(s.events)} events`;
    const tail = card.querySelector(".stream-tail");
    if (tail.textContent !== (s.tail || "")) {
      tail.textContent = s.tail || "";
      tail.scrollTop = tail.scrollHeight; // follow the newest text
    }
  }
  existing.forEach((n, id) => { if (!seen.has(id)) n.remove(); });
}

// ---------- boot ----------

document.addEventListener("visibilitychange", () => { if (!document.hidden) startPoll(false); });
window.addEventListener("hashchange", route);
initAuth();
route();
startPoll(true);
