// The operators' page: polls /debug/tier and merges every replica's
// /debug/cluster document into one view of the tier. No framework, no build.
"use strict";

const POLL_MS = 1000;
const HISTORY = 300; // quality samples kept for the chart (5 minutes)

let prev = null;      // previous poll: {t, classes: {key: counters}, quality}
const history = [];   // [{t, achieved, realised}] ratios over the last interval

const $ = (sel) => document.querySelector(sel);
const esc = (s) => String(s ?? "").replace(/[&<>"']/g, (c) => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;"}[c]));
const fmt = (n, d = 0) => (n === null || n === undefined || Number.isNaN(n)) ? "–" : Number(n).toLocaleString(undefined, {maximumFractionDigits: d, minimumFractionDigits: d});
const pct = (a, b) => b > 0 ? fmt(100 * a / b, 1) + "%" : "–";
const badge = (text, kind) => `<span class="badge b-${kind}">${esc(text)}</span>`;
const rate = (now, before, dt) => (before === undefined || dt <= 0) ? null : Math.max(0, now - before) / dt;

// The admin key, when the router has a keys file and no admin listener:
// /debug/tier then answers 401 (or 403 to a tenant's key) and the page asks
// for it once per browser tab (sessionStorage, never a cookie).
const KEY = "switchyard-admin-key";

function askForKey(status) {
  const form = $("#auth");
  form.hidden = false;
  $("#auth-why").textContent = status === 403
    ? "That key is a tenant's: the page needs an admin key."
    : "This router has API keys: enter an admin key to see the tier.";
}

$("#auth").addEventListener("submit", (ev) => {
  ev.preventDefault();
  sessionStorage.setItem(KEY, $("#auth-key").value.trim());
  $("#auth-key").value = "";
  $("#auth").hidden = true;
});

async function poll() {
  try {
    const headers = {};
    const key = sessionStorage.getItem(KEY);
    if (key) headers["Authorization"] = "Bearer " + key;
    const resp = await fetch("/debug/tier", {cache: "no-store", credentials: "same-origin", headers});
    if (resp.status === 401 || resp.status === 403) {
      sessionStorage.removeItem(KEY);
      askForKey(resp.status);
    }
    if (!resp.ok) throw new Error(`/debug/tier answered ${resp.status}`);
    render(await resp.json());
    document.body.dataset.polls = String(Number(document.body.dataset.polls || 0) + 1);
  } catch (e) {
    setStatus("down", String(e.message || e));
  } finally {
    setTimeout(poll, POLL_MS);
  }
}

function setStatus(cls, text) {
  const el = $("#status");
  el.className = "status " + cls;
  $("#status-text").textContent = text;
}

function render(tier) {
  const t = Date.now() / 1000;
  const docs = {};
  for (const m of tier.members) if (m.reachable && m.doc) docs[m.id] = m.doc;
  const self = docs[tier.served_by] || Object.values(docs)[0];
  if (!self) return;
  const dt = prev ? t - prev.t : 0;
  const next = {t, classes: {}, quality: null};
  renderReplicas(tier, docs, self);
  renderClasses(docs, self, dt, next);
  renderTenants(tier, docs);
  renderWorkers(docs, self);
  renderQuality(docs, dt, next);
  renderDecisions(docs);
  prev = next;
  setStatus("live", `served by ${tier.served_by} · ${tier.members.length} replicas · ${new Date().toLocaleTimeString()}`);
}

function renderReplicas(tier, docs, self) {
  const reachable = Object.fromEntries(tier.members.map((m) => [m.id, m]));
  const ids = new Set((self.replicas || []).map((r) => r.id));
  for (const m of tier.members) ids.add(m.id);
  const rows = [];
  for (const id of [...ids].sort()) {
    const reg = (self.replicas || []).find((r) => r.id === id) || {};
    const m = reachable[id];
    const d = docs[id];
    let state;
    if (!m || !m.reachable) state = badge("unreachable", "bad") + (m && m.error ? `<div class="err">${esc(m.error)}</div>` : "");
    else if (d.state === "ready" && (d.degraded_modes || []).length) state = badge("degraded: " + d.degraded_modes.join(", "), "warn");
    else if (d.state === "ready") state = badge("ready", "ok");
    else if (d.state === "lame_duck") state = badge("lame duck", "warn");
    else state = badge(d.state, d.state === "stopping" ? "bad" : "dim");
    const owned = Object.entries(self.owners || {}).filter(([, o]) => o.replica === id).sort(([a], [b]) => a.localeCompare(b))
      .map(([c, o]) => `<span class="chip">${esc(c)} <span class="dim">#${o.epoch}</span></span>`).join("") || '<span class="dim">none</span>';
    const gossip = d ? `${(d.gossip_members || []).length} members` : "–";
    const nats = d ? badge(d.nats, d.nats === "connected" ? "ok" : "bad") : "–";
    const etcd = d ? badge(d.etcd_session_healthy ? "healthy" : "unhealthy", d.etcd_session_healthy ? "ok" : "bad") : "–";
    rows.push(`<tr data-replica="${esc(id)}"><td><b>${esc(id)}</b><div class="dim mono">${esc(reg.admin_addr || reg.http_addr || (m && m.addr) || "")}</div></td>` +
      `<td>${state}</td><td>${owned}</td><td>${gossip}</td><td>${nats}</td><td>${etcd}</td><td class="dim mono">${esc(shortVersion(d ? d.version : reg.version))}</td></tr>`);
  }
  $("#replicas tbody").innerHTML = rows.join("");
}

function shortVersion(v) {
  if (!v) return "–";
  const parts = v.split(" ");
  // "switchyard <module version> [<vcs revision>] <go version>"
  return parts.length >= 4 ? `${parts[1]} ${parts[2].slice(0, 8)}` : (parts[1] || v);
}

function renderClasses(docs, self, dt, next) {
  const names = new Set([...Object.keys(self.owners || {}), ...Object.keys(self.classes || {})]);
  const rows = [];
  for (const name of [...names].sort()) {
    const owner = (self.owners || {})[name];
    const od = owner ? docs[owner.replica] : null;
    const c = od ? (od.classes || {})[name] : null;
    const key = owner ? `${name}@${owner.replica}#${owner.epoch}` : name;
    let admitted = "–", rejected = "–", misses = "–", queue = "–", pending = "–", tiers = "";
    if (c) {
      next.classes[key] = c;
      const before = prev && prev.classes[key];
      const ar = before ? rate(c.admitted, before.admitted, dt) : null;
      admitted = fmt(ar, 1);
      const rej = Object.entries(c.rejected || {}).map(([r, n]) => [r, before ? rate(n, (before.rejected || {})[r] || 0, dt) : null, n])
        .filter(([, r, n]) => n > 0).map(([r, rr, n]) => `<span class="chip">${esc(r)} ${fmt(rr, 1)}<span class="dim">/s · ${fmt(n)}</span></span>`);
      rejected = rej.join("") || '<span class="dim">none</span>';
      misses = fmt((c.rejected || {}).due_time_passed || 0);
      queue = fmt(c.queue_depth);
      tiers = Object.entries(c.queue_by_priority || {}).sort(([a], [b]) => Number(b) - Number(a))
        .map(([p, n]) => `<span class="chip">p${esc(p)} <b>${fmt(n)}</b></span>`).join("");
      pending = fmt(c.pending_tokens);
    }
    const ownerCell = owner ? `${esc(owner.replica)} <span class="dim">#${owner.epoch}</span>` + (od ? "" : " " + badge("unreachable", "bad")) : badge("no owner", "bad");
    rows.push(`<tr data-class="${esc(name)}"><td><b>${esc(name)}</b></td><td class="owner">${ownerCell}</td><td class="n tiers">${queue}${tiers ? `<div class="tier-chips">${tiers}</div>` : ""}</td><td class="n">${pending}</td>` +
      `<td class="n">${admitted}</td><td>${rejected}</td><td class="n">${misses}</td></tr>`);
  }
  $("#classes tbody").innerHTML = rows.join("") || '<tr><td colspan="7" class="empty">no classes</td></tr>';
}

// renderTenants lists every tenant any replica knows, with its quota and,
// for each replica whose scheduler accounts it (the owner of the classes
// it used), its use there: quotas are enforced per owner.
function renderTenants(tier, docs) {
  const tenants = new Map();
  for (const id of Object.keys(docs).sort()) {
    for (const t of docs[id].tenants || []) {
      const x = tenants.get(t.id) || {id: t.id, quota: t.quota, configured: false, use: []};
      if (t.configured) { x.configured = true; x.quota = t.quota; }
      if (t.use) x.use.push([id, t.use]);
      tenants.set(t.id, x);
    }
  }
  const limit = (n) => n > 0 ? fmt(n) : "∞";
  const rows = [...tenants.values()].sort((a, b) => a.id.localeCompare(b.id)).map((t) => {
    const q = t.quota || {};
    const quota = `<span class="chip" title="concurrent">${limit(q.concurrent)} concurrent</span><span class="chip" title="requests per minute">${limit(q.requests_per_minute)} rpm</span><span class="chip" title="tokens per minute">${limit(q.tokens_per_minute)} tpm</span>`;
    const per = (f) => t.use.map(([id, u]) => f(id, u)).filter(Boolean).join("") || '<span class="dim">idle</span>';
    const level = (left, cap) => {
      const used = cap > 0 ? 1 - left / cap : 0;
      return `${fmt(left, left < 10 ? 1 : 0)} <span class="dim">of ${fmt(cap)}</span>` + (used > 0.9 ? " " + badge("near limit", "warn") : "");
    };
    const inflight = per((id, u) => {
      const full = q.concurrent > 0 && u.in_flight >= q.concurrent;
      return `<span class="chip${full ? " full" : ""}">${esc(id)} <b>${fmt(u.in_flight)}</b>${q.concurrent > 0 ? ` / ${fmt(q.concurrent)}` : ""}${u.queued ? ` <span class="dim">(${fmt(u.queued)} queued)</span>` : ""}</span>`;
    });
    const rpm = q.requests_per_minute > 0 ? per((id, u) => u.requests_left === undefined ? "" : `<span class="chip">${esc(id)} ${level(u.requests_left, q.requests_per_minute)}</span>`) : '<span class="dim">unlimited</span>';
    const tpm = q.tokens_per_minute > 0 ? per((id, u) => u.tokens_left === undefined ? "" : `<span class="chip">${esc(id)} ${level(u.tokens_left, q.tokens_per_minute)}</span>`) : '<span class="dim">unlimited</span>';
    return `<tr data-tenant="${esc(t.id)}"><td><b>${esc(t.id)}</b>${t.configured ? "" : ' <span class="dim">not in the keys file</span>'}</td><td class="quota">${quota}</td><td class="inflight">${inflight}</td><td>${rpm}</td><td>${tpm}</td></tr>`;
  });
  $("#tenants tbody").innerHTML = rows.join("") || '<tr><td colspan="5" class="empty">no tenants: the API is open (no keys file)</td></tr>';
}

// workerOrder is self's workers grouped by engine (/debug/cluster's
// engines): a data-parallel engine gets a row of its own with its ranks
// beneath it, in rank order; any other engine is its one worker's row.
function workerOrder(self) {
  const byId = new Map((self.workers || []).map((w) => [w.id, w]));
  if (!self.engines) return (self.workers || []).map((w) => ({ w }));
  const out = [];
  for (const e of self.engines) {
    if (e.dp_size > 1) out.push({ engine: e });
    for (const id of e.ranks || []) if (byId.has(id)) out.push({ w: byId.get(id), rank: e.dp_size > 1 });
  }
  return out;
}

function renderWorkers(docs, self) {
  const rows = [];
  for (const item of workerOrder(self)) {
    if (item.engine) {
      const e = item.engine;
      rows.push(`<tr class="dp-engine" data-engine="${esc(e.id)}"><td colspan="11"><b>${esc(e.id)}</b> <span class="dim mono">${esc(e.url.replace(/^https?:\/\//, ""))}</span> · ${fmt(e.dp_size)} data-parallel ranks, each a routing target pinned by X-data-parallel-rank</td></tr>`);
      continue;
    }
    const w = item.w;
    let req = 0, prefill = 0, predicted = 0, reported = 0, reports = 0;
    const cal = [], silent = [];
    for (const [id, d] of Object.entries(docs).sort(([a], [b]) => a.localeCompare(b))) {
      const x = (d.workers || []).find((y) => y.id === w.id);
      if (!x) continue;
      req += x.booked.active_requests; prefill += x.booked.prefill_tokens;
      const c = x.cached_tokens || {};
      predicted += c.predicted_tokens || 0; reported += c.reported_tokens || 0; reports += c.reports || 0;
      if (x.calibration && x.calibration.marks > 0) cal.push([id, x.calibration]);
      if (x.kv_events === "silent") silent.push([id, x.kv_events_detail || {}]);
    }
    const cached = !reports ? '<span class="dim">no reports</span>'
      : `${fmt(predicted)} / ${fmt(reported)}` + (predicted > 0 ? ` <span class="dim">(${pct(reported, predicted)})</span>` : "");
    const calCell = cal.map(([id, c]) => `<span class="chip" title="${fmt(c.marks, 1)} first-token marks">${esc(id)} ×${fmt(c.scale, 2)} +${fmt(c.overhead_ms, 1)} ms</span>`).join("") || '<span class="dim">uncalibrated</span>';
    const health = w.health === "healthy" ? badge("healthy", "ok") : w.health === "unhealthy"
      ? badge("unhealthy", "bad") + `<div class="err">no load report for ${fmt((w.reported || {}).age_ms / 1000, 1)} s</div>` : badge("unknown", "dim");
    // A dead event path, as each replica that judged it silent says why.
    const events = silent.length ? " " + badge("KV events silent", "warn") + silent.map(([id, k]) =>
      `<div class="err kv-silent" title="${esc(k.why)}">${esc(id)}: since ${esc(k.since ? new Date(k.since).toLocaleTimeString() : "?")} · ${esc(k.why)}</div>`).join("") : "";
    const rep = w.reported ? `${fmt(w.reported.running)} / ${fmt(w.reported.waiting)}` : "–";
    const kv = w.reported ? pct(w.reported.kv_usage, 1) : "–";
    const hits = w.reported ? pct(w.reported.prefix_hit_rate, 1) : "–";
    const sessions = fmt((self.sessions_by_worker || {})[w.id] || 0);
    const where = item.rank ? `<span class="dim">rank ${fmt(w.dp_rank)}</span>` : `<span class="dim mono">${esc(w.url.replace(/^https?:\/\//, ""))}</span>`;
    rows.push(`<tr data-worker="${esc(w.id)}"${item.rank ? ` class="dp-rank" data-engine="${esc(w.engine)}"` : ""}><td><b>${esc(w.id)}</b> ${where}</td><td class="health">${health}${events}</td>` +
      `<td>${esc(w.model)}</td><td class="n">${fmt(req)} / ${fmt(prefill)}</td><td class="n engine">${rep}</td><td class="n">${kv}</td><td class="n hits">${hits}</td><td class="n sessions">${sessions}</td><td class="n">${fmt(w.kv_blocks_indexed)} <span class="dim">of ${fmt(w.kv_blocks)}</span></td>` +
      `<td class="n cached">${cached}</td><td class="calibration">${calCell}</td></tr>`);
  }
  $("#workers-sessions").textContent = self.sessions ? `· ${fmt(self.sessions)} sessions known to ${self.self}` : "";
  $("#workers tbody").innerHTML = rows.join("") || '<tr><td colspan="11" class="empty">no workers registered</td></tr>';
}

function sumQuality(docs) {
  const q = {decisions: 0, kv_optimal: 0, reachable_tokens: 0, achieved_tokens: 0, realised_tokens: 0, realised_reports: 0, missed_tokens: {}, lost_tokens: {}, shortfalls: {}};
  for (const d of Object.values(docs)) {
    const x = d.quality || {};
    for (const k of ["decisions", "kv_optimal", "reachable_tokens", "achieved_tokens", "realised_tokens", "realised_reports"]) q[k] += x[k] || 0;
    for (const k of ["missed_tokens", "lost_tokens", "shortfalls"]) for (const [r, n] of Object.entries(x[k] || {})) q[k][r] = (q[k][r] || 0) + n;
  }
  return q;
}

function renderQuality(docs, dt, next) {
  const q = sumQuality(docs);
  next.quality = q;
  const p = prev && prev.quality;
  if (p) {
    const dReach = q.reachable_tokens - p.reachable_tokens, dAch = q.achieved_tokens - p.achieved_tokens, dReal = q.realised_tokens - p.realised_tokens;
    if (dReach > 0) history.push({t: Date.now(), achieved: dAch / dReach, realised: dAch > 0 ? dReal / dAch : null});
    while (history.length > HISTORY) history.shift();
  }
  const figs = [
    ["decisions", fmt(q.decisions), `${pct(q.kv_optimal, q.decisions)} on the deepest prefix`],
    ["reachable", fmt(q.reachable_tokens), "tokens some worker held"],
    ["achieved", pct(q.achieved_tokens, q.reachable_tokens), `${fmt(q.achieved_tokens)} tokens on the chosen worker`],
    ["realised", pct(q.realised_tokens, q.achieved_tokens), q.realised_tokens > q.achieved_tokens
      ? `${fmt(q.realised_tokens)} tokens: the engines held more than the router saw (its index lagged, e.g. behind a long queue)`
      : `${fmt(q.realised_tokens)} tokens the engines reported`],
  ];
  $("#quality .figures").innerHTML = figs.map(([l, v, h]) => `<div class="fig" data-fig="${l}"><div class="l">${l}</div><div class="v">${v}</div><div class="l">${h}</div></div>`).join("");
  const reasons = [...Object.entries(q.missed_tokens).map(([r, n]) => [r, n, "missed", "var(--warn)"]),
    ...Object.entries(q.lost_tokens).map(([r, n]) => [r, n, "lost", "var(--bad)"])].sort((a, b) => b[1] - a[1]);
  const max = Math.max(1, ...reasons.map((r) => r[1]));
  $("#quality .reasons").innerHTML = reasons.length ? reasons.map(([r, n, kind, color]) =>
    `<div class="bar"><span class="name">${esc(r)}</span><span class="track"><span class="fill" style="width:${100 * n / max}%;background:${color}"></span></span>` +
    `<span class="val">${fmt(n)} ${kind} · ${fmt(q.shortfalls[r] || 0)}×</span></div>`).join("")
    : '<div class="empty">no shortfalls: every decision reached the deepest prefix and the engines confirmed it</div>';
  drawChart();
}

function drawChart() {
  const c = $("#quality-chart");
  const w = c.clientWidth, h = c.clientHeight, dpr = window.devicePixelRatio || 1;
  if (c.width !== w * dpr) { c.width = w * dpr; c.height = h * dpr; }
  const g = c.getContext("2d");
  g.setTransform(dpr, 0, 0, dpr, 0, 0);
  g.clearRect(0, 0, w, h);
  g.strokeStyle = "#26303b"; g.lineWidth = 1;
  for (const f of [0, 0.5, 1]) { const y = 4 + (h - 8) * (1 - f); g.beginPath(); g.moveTo(0, y); g.lineTo(w, y); g.stroke(); }
  g.fillStyle = "#8a98a8"; g.font = "11px system-ui";
  g.fillText("100%", 4, 14); g.fillText("achieved / reachable", w - 260, 14); g.fillText("realised / achieved", w - 130, 14);
  g.fillStyle = "#58a6ff"; g.fillRect(w - 272, 7, 8, 8);
  g.fillStyle = "#bc8cff"; g.fillRect(w - 142, 7, 8, 8);
  g.fillStyle = "#8a98a8";
  const line = (key, color) => {
    g.strokeStyle = color; g.lineWidth = 2; g.beginPath();
    let started = false;
    history.forEach((s, i) => {
      if (s[key] === null) return;
      const x = w * i / Math.max(1, HISTORY - 1), y = 4 + (h - 8) * (1 - Math.min(1, s[key]));
      if (started) g.lineTo(x, y); else { g.moveTo(x, y); started = true; }
    });
    g.stroke();
  };
  if (!history.length) { g.fillText("waiting for traffic: the lines are hit rates per poll interval", 4, h / 2 + 4); return; }
  line("achieved", "#58a6ff");
  line("realised", "#bc8cff");
}

// The decisions' filter: "" (all), "class:NAME" or "model:NAME". Kept
// across polls; the options are rebuilt from what the decisions name.
let decisionFilter = "";
$("#decision-filter").addEventListener("change", (ev) => { decisionFilter = ev.target.value; });

function renderDecisionFilter(all) {
  const classes = [...new Set(all.map((x) => x.class))].sort(), models = [...new Set(all.map((x) => x.model))].sort();
  const opts = [["", "every class and model"], ...classes.map((c) => ["class:" + c, "class " + c]), ...models.map((m) => ["model:" + m, "model " + m])];
  if (decisionFilter && !opts.some(([v]) => v === decisionFilter)) opts.push([decisionFilter, decisionFilter.replace(":", " ")]);
  const sel = $("#decision-filter");
  const html = opts.map(([v, l]) => `<option value="${esc(v)}"${v === decisionFilter ? " selected" : ""}>${esc(l)}</option>`).join("");
  if (sel.dataset.html !== html) { sel.innerHTML = html; sel.dataset.html = html; }
}

function renderDecisions(docs) {
  const all = [];
  for (const [id, d] of Object.entries(docs)) for (const x of d.decisions || []) all.push({...x, entry: id});
  all.sort((a, b) => Date.parse(b.at) - Date.parse(a.at)); // RFC 3339 strings with varying fractions do not sort as text
  renderDecisionFilter(all);
  const [kind, name] = decisionFilter ? [decisionFilter.slice(0, decisionFilter.indexOf(":")), decisionFilter.slice(decisionFilter.indexOf(":") + 1)] : ["", ""];
  const shown = all.filter((x) => !kind || (kind === "class" ? x.class === name : x.model === name));
  const ttft = (v) => v > 0 ? fmt(v, v < 10 ? 1 : 0) + " ms" : "–";
  const rows = shown.slice(0, 20).map((x) => {
    const cands = (x.candidates || []).map((c) => `<span class="chip${c.worker === x.worker ? " win" : ""}" title="cached prompt tokens · predicted time to first token">${esc(c.worker)} <b>${fmt(c.cached_tokens)}</b> · ${ttft(c.predicted_ttft_ms)}</span>`).join("") || '<span class="dim">no cached prefix anywhere</span>';
    const realised = x.realised_tokens === null || x.realised_tokens === undefined ? '<span class="dim">n/r</span>' : fmt(x.realised_tokens);
    const why = [x.shortfall && badge(x.shortfall, "warn"), x.loss && badge(x.loss, "bad")].filter(Boolean).join(" ") || '<span class="dim">–</span>';
    return `<tr data-decision="${esc(x.request_id)}" data-candidates="${(x.candidates || []).length}"><td class="mono">${esc(new Date(x.at).toLocaleTimeString())}</td><td>${esc(x.entry)}</td><td>${esc(x.class)} <span class="dim">· ${esc(x.model)}</span></td>` +
      `<td class="cands">${cands}</td><td><b>${esc(x.worker)}</b></td><td class="n">${fmt(x.reachable_tokens)} / ${fmt(x.achieved_tokens)} / ${realised} <span class="dim">of ${fmt(x.prompt_tokens)}</span></td>` +
      `<td>${why}</td><td class="n">${fmt(x.queue_wait_ms, 1)} · ${ttft(x.predicted_ttft_ms)} · <b>${ttft(x.ttft_ms)}</b> · ${fmt(x.latency_ms, 0)} ms</td></tr>`;
  });
  $("#decisions tbody").innerHTML = rows.join("") || `<tr><td colspan="8" class="empty">${all.length ? "no decisions of " + esc(decisionFilter.replace(":", " ")) + " among the last ones" : "no decisions yet"}</td></tr>`;
}

window.addEventListener("resize", drawChart);
poll();
