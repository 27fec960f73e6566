// The console: a read-only view of the fleet from the lease API's REST
// calls. Everything it shows comes from a call the token authorizes;
// every action it suggests is a `kubectl egress` command, never a call.
// No framework: the fleet table renders only the rows in view, so 10,000
// proxies cost what 40 do.

const ROW = 26; // px, the fleet table's row height (console.css)
const stats = (window.__console = { pages: 0, proxies: 0, firstRenderMs: 0, synced: false, events: 0, lastEventMs: 0 });
const t0 = performance.now();

// ---- the lease API -------------------------------------------------------

let token = sessionStorage.getItem("egress-token") || "";

class APIError extends Error {
  constructor(status, body) {
    super(body.message || `HTTP ${status}`);
    this.status = status;
  }
}

function headers() {
  return token ? { Authorization: `Bearer ${token}` } : {};
}

async function api(path) {
  const r = await fetch(path, { headers: headers() });
  const body = await r.json().catch(() => ({}));
  if (!r.ok) throw new APIError(r.status, body);
  return body;
}

// pages walks a list call's pages, handing each to each().
async function pages(path, key, each) {
  let tok = "";
  for (;;) {
    const sep = path.includes("?") ? "&" : "?";
    const body = await api(`${path}${sep}pageSize=500${tok ? `&pageToken=${encodeURIComponent(tok)}` : ""}`);
    each(body[key] || []);
    if (!body.nextPageToken) return;
    tok = body.nextPageToken;
  }
}

// ---- the fleet: a cache filled by pages, then kept by the watch -----------

const fleet = new Map(); // id -> proxy
let sorted = []; // ids in order
let dirty = true;
const listeners = new Set();

function changed() {
  dirty = true;
  if (!changed.queued) {
    changed.queued = true;
    requestAnimationFrame(() => {
      changed.queued = false;
      for (const f of listeners) f();
    });
  }
}

function ids() {
  if (dirty) {
    sorted = [...fleet.keys()].sort();
    dirty = false;
  }
  return sorted;
}

async function loadFleet() {
  await pages("/v1/proxies", "proxies", (ps) => {
    for (const p of ps) fleet.set(p.id, p);
    stats.pages++;
    stats.proxies = fleet.size;
    changed();
  });
  watch();
}

async function watch() {
  const live = document.getElementById("live");
  for (;;) {
    try {
      const r = await fetch("/v1/proxies:watch", { headers: headers() });
      if (!r.ok) throw new Error(`HTTP ${r.status}`);
      live.textContent = "syncing";
      const reader = r.body.pipeThrough(new TextDecoderStream()).getReader();
      let buf = "";
      let first = null; // the first set replaces the cache once SYNCED
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buf += value;
        let nl;
        while ((nl = buf.indexOf("\n")) >= 0) {
          const line = buf.slice(0, nl).trim();
          buf = buf.slice(nl + 1);
          if (!line) continue;
          const msg = JSON.parse(line);
          if (msg.error) throw new Error(msg.error.message);
          for (const ev of msg.result?.events || []) {
            if (ev.type === "TYPE_SYNCED") {
              if (first) {
                for (const id of [...fleet.keys()]) if (!first.has(id)) fleet.delete(id);
                first = null;
              }
              stats.synced = true;
              live.textContent = "live";
              live.className = "live on";
              changed();
              continue;
            }
            if (!stats.synced) (first ??= new Set()).add(ev.proxy.id);
            if (ev.type === "TYPE_UPSERT") fleet.set(ev.proxy.id, ev.proxy);
            if (ev.type === "TYPE_DELETE") fleet.delete(ev.proxy.id);
            if (stats.synced) {
              stats.events++;
              stats.lastEventMs = performance.now();
            }
            changed();
          }
        }
      }
    } catch (e) {
      live.textContent = `watch ended: ${e.message}`;
    }
    live.className = "live";
    stats.synced = false;
    await new Promise((r) => setTimeout(r, 2000)); // watch again
  }
}

// ---- what a proxy is -----------------------------------------------------

function stateOf(p) {
  if (p.notLeasable) return p.notLeasable.replace("PROXY_", "").toLowerCase().replace("_", " ");
  if (p.quarantinedUntil && Date.parse(p.quarantinedUntil) > Date.now()) return "quarantined";
  return "leasable";
}

function attrs(p) {
  return Object.entries(p.attributes || {})
    .map(([k, v]) => `${k}=${v}`)
    .sort()
    .join(" ");
}

// ---- DOM helpers ---------------------------------------------------------

function el(tag, props = {}, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(props)) {
    if (k === "class") e.className = v;
    else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else if (k === "data") Object.assign(e.dataset, v);
    // The page's policy refuses style attributes; the CSSOM is allowed.
    else if (k === "style") Object.assign(e.style, v);
    else e.setAttribute(k, v);
  }
  for (const k of kids) e.append(k instanceof Node ? k : document.createTextNode(String(k ?? "")));
  return e;
}

function table(head, rows) {
  return el("table", {}, el("thead", {}, el("tr", {}, ...head.map((h) => el("th", {}, h)))),
    el("tbody", {}, ...rows.map((r) => el("tr", {}, ...r.map((c) => el("td", {}, c))))));
}

function command(text) {
  return el("code", { class: "cmd", title: "run it: the console changes nothing" }, text);
}

function ago(t) {
  if (!t) return "-";
  const s = Math.round((Date.now() - Date.parse(t)) / 1000);
  const f = (n) => (n >= 3600 ? `${Math.floor(n / 3600)}h${Math.floor((n % 3600) / 60)}m` : n >= 60 ? `${Math.floor(n / 60)}m${n % 60}s` : `${n}s`);
  return s < 0 ? `in ${f(-s)}` : `${f(s)} ago`;
}

function split(id) {
  const i = id.indexOf("/");
  return [id.slice(0, i), id.slice(i + 1)];
}

// ---- views ---------------------------------------------------------------

const view = () => document.getElementById("view");
let stop = () => {};

function fleetView() {
  const f = { text: "", ns: "", pool: "", state: "" };
  const count = el("span", { class: "count" });
  const select = (key, label) => {
    const s = el("select", { "aria-label": label, onchange: () => { f[key] = s.value; draw(); } }, el("option", { value: "" }, `any ${label}`));
    return s;
  };
  const nsSel = select("ns", "namespace");
  const poolSel = select("pool", "pool");
  const stateSel = select("state", "state");
  for (const s of ["leasable", "unhealthy", "quarantined", "draining", "cordoned", "not ready", "health stale", "deleting"]) stateSel.append(el("option", { value: s }, s));
  const text = el("input", { type: "search", placeholder: "filter: id or attribute (geo=eu)", "aria-label": "filter", oninput: () => { f.text = text.value.trim(); draw(); } });
  const scroll = el("div", { class: "scroll", id: "fleet" });
  const spacer = el("div", { class: "spacer" });
  const rows = el("div", { class: "rows" });
  scroll.append(spacer, rows);
  const head = el("div", { class: "row head" }, ...["proxy", "pool", "egress IP", "leases", "state", "attributes"].map((h) => el("span", {}, h)));
  view().replaceChildren(el("div", { class: "filters" }, text, nsSel, poolSel, stateSel, count), head, scroll);

  let shown = [];
  const options = (sel, values) => {
    const have = new Set([...sel.options].map((o) => o.value));
    for (const v of [...values].sort()) if (v && !have.has(v)) sel.append(el("option", { value: v }, v));
  };
  function match(p) {
    if (f.ns && !p.id.startsWith(f.ns + "/")) return false;
    if (f.pool && p.pool !== f.pool) return false;
    if (f.state && stateOf(p) !== f.state) return false;
    if (f.text) {
      for (const term of f.text.split(/\s+/)) {
        const [k, v] = term.split("=");
        if (v !== undefined ? (p.attributes || {})[k] !== v : !p.id.includes(term)) return false;
      }
    }
    return true;
  }
  function draw() {
    const all = ids();
    shown = all.filter((id) => match(fleet.get(id)));
    options(nsSel, new Set(all.map((id) => split(id)[0])));
    options(poolSel, new Set(all.map((id) => fleet.get(id).pool)));
    count.textContent = `${shown.length} of ${all.length} proxies`;
    spacer.style.height = `${shown.length * ROW}px`;
    paint();
  }
  function paint() {
    const first = Math.max(0, Math.floor(scroll.scrollTop / ROW) - 5);
    const last = Math.min(shown.length, first + Math.ceil(scroll.clientHeight / ROW) + 10);
    const out = [];
    for (let i = first; i < last; i++) {
      const p = fleet.get(shown[i]);
      const st = stateOf(p);
      out.push(el("a", { class: `row ${st === "leasable" ? "" : "bad"}`, href: `#/proxy/${p.id}`, style: { top: `${i * ROW}px` }, data: { id: p.id, state: st } },
        el("span", {}, p.id), el("span", {}, p.pool || "-"), el("span", {}, p.egressIP || "-"), el("span", {}, p.leaseCount || 0),
        el("span", { class: "state" }, st), el("span", { class: "attrs" }, attrs(p))));
    }
    rows.replaceChildren(...out);
    if (!stats.firstRenderMs && stats.proxies && !stats.loading && out.length) stats.firstRenderMs = performance.now() - t0;
  }
  scroll.addEventListener("scroll", () => requestAnimationFrame(paint));
  listeners.add(draw);
  stop = () => listeners.delete(draw);
  draw();
}

function poolsView() {
  const body = el("div");
  view().replaceChildren(el("h2", {}, "Pools"), body,
    el("p", { class: "hint" }, "A pool's rollout and remediation: ", command("kubectl egress status <pool> -n <namespace>"), " and ", command("kubectl describe ppool <pool>")));
  function draw() {
    const groups = new Map();
    for (const id of ids()) {
      const p = fleet.get(id);
      const key = p.pool ? `${split(id)[0]}/${p.pool}` : "(no pool)";
      const g = groups.get(key) || { proxies: 0, healthy: 0, leasable: 0, leases: 0, out: {} };
      g.proxies++;
      if (p.healthy) g.healthy++;
      const st = stateOf(p);
      if (st === "leasable") g.leasable++;
      else g.out[st] = (g.out[st] || 0) + 1;
      g.leases += p.leaseCount || 0;
      groups.set(key, g);
    }
    body.replaceChildren(table(["pool", "proxies", "healthy", "leasable", "leases", "not leasable"],
      [...groups].sort().map(([k, g]) => [k, g.proxies, g.healthy, g.leasable, g.leases,
        Object.entries(g.out).map(([s, n]) => `${n} ${s}`).join(", ") || "-"])));
  }
  listeners.add(draw);
  stop = () => listeners.delete(draw);
  draw();
}

async function proxyView(id) {
  const [ns, name] = split(id);
  view().replaceChildren(el("h2", {}, id), el("p", {}, "loading"));
  let x;
  try {
    x = await api(`/v1/proxies/${encodeURIComponent(ns)}/${encodeURIComponent(name)}:explain`);
  } catch (e) {
    view().replaceChildren(el("h2", {}, id), el("p", { class: "error" }, e.message));
    return;
  }
  const p = x.proxy;
  const facts = [["address", `${p.ip || "-"}:${p.port}`], ["egress IP", p.egressIP || "-"], ["pool", p.pool || "-"], ["healthy", p.healthy],
    ["leases", p.leaseCount], ["state", stateOf(p)], ["cordoned", x.cordoned], ["draining until", x.drainingUntil || "-"],
    ["quarantined", p.quarantinedUntil ? `since ${ago(p.quarantinedSince)}, until ${ago(p.quarantinedUntil)}` : "no"]];
  const cmds = [`kubectl egress explain ${name} -n ${ns}`, x.cordoned ? `kubectl egress uncordon ${name} -n ${ns}` : `kubectl egress cordon ${name} -n ${ns}`,
    `kubectl egress drain ${name} -n ${ns}`];
  view().replaceChildren(el("h2", {}, id),
    table(["", ""], facts),
    el("h3", {}, "Cooldowns"),
    (x.cooldowns || []).length ? table(["target", "tenant", "level", "since", "until", "kept under"],
      x.cooldowns.map((c) => [el("a", { href: `#/target/${c.target}` }, c.target), c.tenant || "-", c.level, ago(c.since), ago(c.until), c.key])) : el("p", {}, "none"),
    el("h3", {}, "Error reports (quarantine window)"),
    (x.errors || []).length ? table(["target", "tenant", "at"], x.errors.map((r) => [r.target, r.tenant || "-", ago(r.at)])) : el("p", {}, "none"),
    el("h3", {}, "Do"), el("div", { class: "cmds" }, ...cmds.map(command)));
}

// A target's cooldowns over time: each poll is a column, each cooling
// exit a row, each cell shaded by the cooldown's level.
function targetView(target) {
  const input = el("input", { type: "search", value: target || "", placeholder: "a target host: shop.example", "aria-label": "target" });
  const go = el("form", { onsubmit: (ev) => { ev.preventDefault(); location.hash = `#/target/${input.value.trim()}`; } }, input, el("button", { type: "submit" }, "Show"));
  const body = el("div");
  view().replaceChildren(el("h2", {}, "Target"), go, body);
  if (!target) return;
  const history = []; // {at, cooling: Map(proxyID -> cooldown)}
  let timer = 0;
  async function poll() {
    let x;
    try {
      x = await api(`/v1/targets/${encodeURIComponent(target)}:explain`);
    } catch (e) {
      body.replaceChildren(el("p", { class: "error" }, e.message));
      return;
    }
    history.push({ at: new Date(), cooling: new Map((x.cooling || []).map((c) => [c.proxyID, { ...c.cooldown, egressIP: c.egressIP }])) });
    if (history.length > 60) history.shift();
    const exits = new Map();
    for (const h of history) for (const [id, c] of h.cooling) exits.set(id, c.egressIP || id);
    const grid = el("div", { class: "heatmap", style: { gridTemplateColumns: `18em repeat(${history.length}, 14px)` } });
    // A time every sixth poll (30 s): more would not fit.
    grid.append(el("span", { class: "label" }, "exit \\ time"), ...history.map((h, i) => el("span", { class: "tick" }, i % 6 ? "" : h.at.toLocaleTimeString())));
    for (const [id, ip] of [...exits].sort()) {
      grid.append(el("a", { class: "label", href: `#/proxy/${id}` }, `${ip} ${id}`));
      for (const h of history) {
        const c = h.cooling.get(id);
        grid.append(el("span", { class: `cell ${c ? `l${Math.min(c.level, 4)}${c.tenant ? " mine" : ""}` : ""}`, title: c ? `level ${c.level}${c.tenant ? ` (for ${c.tenant} alone)` : ""} until ${c.until}` : "not cooling" }));
      }
    }
    body.replaceChildren(
      table(["", ""], [["policy", x.policy || "the brokers' defaults"], ["live leases", x.leases || 0],
        ["paced", x.pacePerSecond ? `${x.pacePerSecond.toFixed(2)} leases/s until ${ago(x.pacedUntil)}` : "no"],
        ["cooling", `${(x.cooling || []).length} of ${x.proxies} proxies`]]),
      el("h3", {}, "Cooldowns by exit, over time"), exits.size ? grid : el("p", { id: "no-cooling" }, "no exit is cooling down for it"),
      el("h3", {}, "Do"), el("div", { class: "cmds" }, command(`kubectl egress bans --target ${target}`)));
  }
  poll();
  timer = setInterval(poll, 5000);
  stop = () => clearInterval(timer);
}

async function leasesView() {
  view().replaceChildren(el("h2", {}, "Leases"), el("p", {}, "loading"));
  const all = [];
  try {
    await pages("/v1/leases", "leases", (ls) => all.push(...ls));
  } catch (e) {
    view().replaceChildren(el("h2", {}, "Leases"), el("p", { class: "error" }, e.message));
    return;
  }
  const byTenant = new Map();
  const sessions = new Map();
  for (const l of all) {
    byTenant.set(l.tenant || "-", (byTenant.get(l.tenant || "-") || 0) + 1);
    if (!l.sessionKey) continue;
    const k = `${l.tenant || "-"}/${l.sessionKey}`;
    const s = sessions.get(k) || { tenant: l.tenant || "-", key: l.sessionKey, proxies: new Set(), targets: new Set(), leases: 0 };
    s.proxies.add(l.proxyID);
    s.targets.add(l.target || "-");
    s.leases++;
    sessions.set(k, s);
  }
  view().replaceChildren(el("h2", {}, `Leases (${all.length})`),
    table(["tenant", "leases"], [...byTenant].sort()),
    el("h3", {}, "Sessions"),
    sessions.size ? table(["tenant", "session", "proxies", "targets", "leases"],
      [...sessions.values()].map((s) => [s.tenant, s.key, [...s.proxies].join(", "), [...s.targets].join(", "), s.leases])) : el("p", {}, "none"),
    el("h3", {}, "Every lease"),
    table(["proxy", "tenant", "target", "session", "age", "expires"],
      all.map((l) => [el("a", { href: `#/proxy/${l.proxyID}` }, l.proxyID), l.tenant || "-", l.target || "-", l.sessionKey || "-", ago(l.grantedAt), ago(l.expiresAt)])),
    el("div", { class: "cmds" }, command("kubectl egress leases -A"), command("kubectl egress sessions -A")));
}

function route() {
  stop();
  stop = () => {};
  const h = decodeURIComponent(location.hash.slice(1) || "/");
  if (h.startsWith("/proxy/")) return proxyView(h.slice(7));
  if (h.startsWith("/target")) return targetView(h.slice(8));
  if (h === "/pools") return poolsView();
  if (h === "/leases") return leasesView();
  return fleetView();
}

// ---- start: ask for a token only when the brokers want one ---------------

async function start() {
  const form = document.getElementById("login");
  try {
    stats.loading = true;
    await api("/v1/proxies?pageSize=1");
  } catch (e) {
    if (e.status === 401 || e.status === 403) {
      form.hidden = false;
      document.getElementById("login-error").textContent = token ? e.message : "";
      form.addEventListener("submit", (ev) => {
        ev.preventDefault();
        token = document.getElementById("token").value.trim();
        sessionStorage.setItem("egress-token", token);
        location.reload();
      }, { once: true });
      return;
    }
    view().replaceChildren(el("p", { class: "error" }, e.message));
    return;
  }
  window.addEventListener("hashchange", route);
  route();
  await loadFleet().finally(() => {
    stats.loading = false;
    changed();
  });
}

start();
