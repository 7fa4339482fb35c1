// The arag page: ask (streamed over SSE), search, papers, how it works. Plain ES module, no build
// step, no third-party code. Server text is only ever set as textContent, never as HTML.
// The map (map.js) and the paper tools (papertools.js) import the helpers this module exports.

import { initMap } from "./map.js";
import { paperToolButtons, toolOutput } from "./papertools.js";

const $ = (sel, root = document) => root.querySelector(sel);
const $$ = (sel, root = document) => Array.from(root.querySelectorAll(sel));

const MAX_QUESTION = 2000;
const KEY_STORE = "arag.apiKey";
const STAGES = ["route", "plan", "retrieve", "rerank", "grade", "reformulate", "synthesize", "verify"];
const STAGE_NAMES = Object.fromEntries(STAGES.map((s) => [s, s[0].toUpperCase() + s.slice(1)]));
// Which stages an agent node finishes. `context` only starts synthesis (tokens follow it).
const NODE_STAGES = {
  router: ["route"],
  direct: ["route", "synthesize"],
  about: ["route", "synthesize"],
  planner: ["plan"],
  retriever: ["retrieve", "rerank"],
  grader: ["grade"],
  reformulator: ["reformulate"],
  context: [],
  synthesizer: ["synthesize"],
  verifier: ["verify"],
  // The answer specialists (a trained reader) adjust the short answer after the verifier.
  specialists: [],
};
// The stages most likely to run next, lit as active until their event arrives.
const NEXT = {
  router: ["plan"],
  planner: ["retrieve", "rerank"],
  retriever: ["grade"],
  grader: ["synthesize"],
  reformulator: ["retrieve", "rerank"],
  context: ["synthesize"],
  synthesizer: ["verify"],
};
const DECISION_CHARS = 70;
const ARXIV_ID = /^(\d{4}\.\d{4,5}|[a-z-]+(\.[A-Z]{2})?\/\d{7})(v\d+)?$/;
const reducedMotion = window.matchMedia("(prefers-reduced-motion: reduce)").matches;

window.aragStageOrder = [];

// -- small helpers --------------------------------------------------------------------------------

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") node.className = v;
    else if (k === "text") node.textContent = v;
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat(Infinity)) {
    if (c === null || c === undefined || c === false) continue;
    node.append(c instanceof Node ? c : String(c));
  }
  return node;
}

function fmtMs(ms) {
  if (ms === null || ms === undefined || Number.isNaN(ms)) return "";
  if (ms < 1) return `${ms.toFixed(2)} ms`;
  if (ms < 100) return `${ms.toFixed(1)} ms`;
  if (ms < 1000) return `${Math.round(ms)} ms`;
  return `${(ms / 1000).toFixed(1)} s`;
}

function fmtScore(x, digits = 3) {
  return x === null || x === undefined ? "–" : Number(x).toFixed(digits);
}

function truncate(text, n) {
  return text.length <= n ? text : `${text.slice(0, n - 1).trimEnd()}…`;
}

// A stored heading path as a reader sees it: "Experiments ::: Datasets" -> "Experiments › Datasets"
// (text.section_path).
function sectionPath(section) {
  return section.split(":::").map((p) => p.trim()).filter(Boolean).join(" \u203a ");
}

function arxivUrl(paperId) {
  return paperId && ARXIV_ID.test(paperId) ? `https://arxiv.org/abs/${paperId}` : null;
}

function arxivLink(paperId, label) {
  const url = arxivUrl(paperId);
  if (!url) return null;
  return el("a", { href: url, target: "_blank", rel: "noopener noreferrer", class: "arxiv" },
    label ?? `arXiv:${paperId}`);
}

// -- the API --------------------------------------------------------------------------------------

class ApiError extends Error {
  constructor({ error, where = null, fix = null, status = null, request_id = null }) {
    super(error || "request failed");
    Object.assign(this, { error: error || "request failed", where, fix, status, request_id });
  }
}

let memoryKey = ""; // where storage is unavailable, the key lasts until the page closes

// The key stays in this tab (sessionStorage) unless the user ticks "Remember" (localStorage): any
// script of this origin can read localStorage, for as long as the browser keeps it.
function storedKey(store) {
  try {
    return store.getItem(KEY_STORE) || "";
  } catch {
    return "";
  }
}

function apiKey() {
  return storedKey(window.localStorage) || storedKey(window.sessionStorage) || memoryKey;
}

function saveKey(key, remember) {
  memoryKey = key;
  try {
    for (const store of [window.localStorage, window.sessionStorage]) store.removeItem(KEY_STORE);
    if (key) (remember ? window.localStorage : window.sessionStorage).setItem(KEY_STORE, key);
    return true;
  } catch {
    return false; // storage disabled (private mode, policy)
  }
}

function requestHeaders(json) {
  const h = { Accept: json === "sse" ? "text/event-stream" : "application/json" };
  if (json) h["Content-Type"] = "application/json";
  const key = apiKey();
  if (key) h["X-API-Key"] = key;
  return h;
}

function networkError(cause) {
  return new ApiError({
    error: `could not reach the arag service (${cause?.message || "network error"})`,
    where: location.origin,
    fix: "check that the server is running (`arag serve`) and your connection, then try again",
  });
}

async function httpError(res) {
  let body = null;
  try {
    body = await res.json();
  } catch {
    // not JSON (a proxy's page): the status line says enough
  }
  const err = new ApiError({
    error: body?.error || `HTTP ${res.status} ${res.statusText}`.trim(),
    where: body?.where ?? null,
    fix: body?.fix ?? null,
    status: res.status,
    request_id: body?.request_id || res.headers.get("x-request-id"),
  });
  if (res.status === 404 && /unknown paper id/.test(err.error)) {
    err.fix = `${err.fix ? `${err.fix}; ` : ""}on this page, the Papers tab lists them`;
  }
  if (res.status === 401) {
    err.fix = apiKey()
      ? "the API key saved in this browser was refused: enter a valid key in the “API key” box at the top"
      : "this server needs an API key: enter it in the “API key” box at the top of the page";
    openKeyBox(true);
  }
  return err;
}

async function api(path, { method = "GET", body, signal } = {}) {
  let res;
  try {
    res = await fetch(path, {
      method,
      headers: requestHeaders(body !== undefined),
      body: body === undefined ? undefined : JSON.stringify(body),
      signal,
    });
  } catch (exc) {
    if (exc.name === "AbortError") throw exc;
    throw networkError(exc);
  }
  if (!res.ok) throw await httpError(res);
  return res.json();
}

// Server-Sent Events from a fetch body (EventSource cannot POST): yields {event, data}.
async function* sseEvents(response) {
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buf = "";
  const parse = (block) => {
    let event = "message";
    const data = [];
    for (const line of block.split("\n")) {
      if (line.startsWith(":")) continue;
      const i = line.indexOf(":");
      const field = i < 0 ? line : line.slice(0, i);
      let value = i < 0 ? "" : line.slice(i + 1);
      if (value.startsWith(" ")) value = value.slice(1);
      if (field === "event") event = value;
      else if (field === "data") data.push(value);
    }
    return data.length ? { event, data: data.join("\n") } : null;
  };
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buf = (buf + value).replace(/\r\n?/g, "\n");
    let cut;
    while ((cut = buf.indexOf("\n\n")) >= 0) {
      const ev = parse(buf.slice(0, cut));
      buf = buf.slice(cut + 2);
      if (ev) yield ev;
    }
  }
  const last = buf.trim() ? parse(buf.trim()) : null;
  if (last) yield last;
}

// -- the error alert ------------------------------------------------------------------------------

function showError(err) {
  const box = $("#error");
  $("#error-text").textContent = err.error || err.message || String(err);
  const fix = $("#error-fix");
  fix.replaceChildren();
  if (err.fix) fix.append(el("strong", { text: "How to fix: " }), err.fix);
  fix.hidden = !err.fix;
  const meta = [
    err.status ? `HTTP ${err.status}` : null,
    err.where ? `where: ${err.where}` : null,
    err.request_id ? `request ${err.request_id}` : null,
  ].filter(Boolean);
  $("#error-meta").textContent = meta.join(" · ");
  box.hidden = false;
  box.scrollIntoView({ block: "nearest", behavior: reducedMotion ? "auto" : "smooth" });
}

function clearError() {
  $("#error").hidden = true;
}

// -- tabs -----------------------------------------------------------------------------------------

const TABS = ["ask", "search", "papers", "map", "about"];
const tabLoaders = {};

function selectTab(name, { focus = false, updateHash = true } = {}) {
  if (!TABS.includes(name)) name = "ask";
  for (const t of TABS) {
    const tab = $(`#tab-${t}`);
    const on = t === name;
    tab.setAttribute("aria-selected", String(on));
    tab.tabIndex = on ? 0 : -1;
    $(`#panel-${t}`).hidden = !on;
  }
  if (focus) $(`#tab-${name}`).focus();
  if (updateHash && location.hash !== `#${name}`) history.replaceState(null, "", `#${name}`);
  tabLoaders[name]?.();
}

function initTabs() {
  for (const t of TABS) {
    $(`#tab-${t}`).addEventListener("click", () => selectTab(t));
  }
  $(".tabs").addEventListener("keydown", (e) => {
    const i = TABS.findIndex((t) => $(`#tab-${t}`) === document.activeElement);
    if (i < 0) return;
    const moves = { ArrowRight: i + 1, ArrowLeft: i - 1, Home: 0, End: TABS.length - 1 };
    if (!(e.key in moves)) return;
    e.preventDefault();
    selectTab(TABS[(moves[e.key] + TABS.length) % TABS.length], { focus: true });
  });
  window.addEventListener("hashchange", () => selectTab(location.hash.slice(1), { updateHash: false }));
}

// -- API key --------------------------------------------------------------------------------------

function openKeyBox(needed) {
  $("#key-box").open = true;
  $("#api-key-needed").hidden = !needed;
}

function showKeyState() {
  $("#key-state").textContent = apiKey() ? "set" : "not set";
}

function initKey() {
  const input = $("#api-key");
  const remember = $("#api-key-remember");
  input.value = apiKey();
  remember.checked = Boolean(storedKey(window.localStorage));
  showKeyState();
  let timer = null;
  const save = () => {
    if (!saveKey(input.value.trim(), remember.checked)) {
      // say so rather than pretend it is kept
      $("#api-key-hint").textContent =
        "This browser does not allow storing the key: it lasts until the page closes.";
    }
    showKeyState();
  };
  input.addEventListener("input", () => {
    clearTimeout(timer);
    timer = setTimeout(loadSystem, 600); // the models and figures, now that the key may let us in
    save();
  });
  remember.addEventListener("change", save);
  $("#key-form").addEventListener("submit", (e) => e.preventDefault());
  $("#api-key-clear").addEventListener("click", () => {
    input.value = "";
    input.dispatchEvent(new Event("input"));
    input.focus();
  });
}

// -- scope (answer only from some papers) -------------------------------------------------------

let scope = [];

function setScope(ids, titles = {}) {
  scope = ids.filter(Boolean).slice(0, 50);
  const list = $("#scope-list");
  list.replaceChildren(
    ...scope.map((id, i) =>
      el("span", { class: "scope-item" }, i ? ", " : "", titles[id] ? `${titles[id]} (${id})` : id)),
  );
  $("#scope").hidden = scope.length === 0;
  const url = new URL(location.href);
  if (scope.length) url.searchParams.set("papers", scope.join(","));
  else url.searchParams.delete("papers");
  history.replaceState(null, "", url);
}

// -- Ask: the pipeline ----------------------------------------------------------------------------

let run = null; // the current question's state
let controller = null;

function stageEl(name) {
  return $(`.stage[data-stage="${name}"]`);
}

function setStageState(name, state) {
  const node = stageEl(name);
  node.dataset.state = state;
  node.classList.toggle("is-active", state === "active");
  node.classList.toggle("is-done", state === "done");
  node.classList.toggle("is-skipped", state === "skipped");
  if (state === "active") node.setAttribute("aria-current", "step");
  else node.removeAttribute("aria-current");
  $(".stage-sr", node).textContent = state === "active" ? "running" : state;
}

function resetStages() {
  for (const name of STAGES) {
    setStageState(name, "pending");
    const node = stageEl(name);
    $(".stage-ms", node).textContent = "";
    const dec = $(".stage-decision", node);
    dec.textContent = dec.dataset.default;
    dec.removeAttribute("title");
    node.removeAttribute("title");
  }
}

function setStageInfo(name, ms, decision, fullTitle) {
  const node = stageEl(name);
  $(".stage-ms", node).textContent = typeof ms === "string" ? ms : fmtMs(ms);
  const dec = $(".stage-decision", node);
  dec.textContent = truncate(decision, DECISION_CHARS);
  node.title = fullTitle;
}

function finishStage(name) {
  setStageState(name, "done");
  if (!run.order.includes(name)) {
    run.order.push(name);
    window.aragStageOrder.push(name);
  }
}

function onNode(ev) {
  run.nodes += 1;
  // Whatever was predicted to run next is back to its real state: the event says what ran.
  for (const name of STAGES) {
    if (stageEl(name).dataset.state === "active") setStageState(name, run.order.includes(name) ? "done" : "pending");
  }
  const stages = NODE_STAGES[ev.node] ?? [];
  for (const name of stages) {
    const info = (run.stages[name] ??= { ms: 0, decisions: [] });
    info.ms += ev.ms;
    info.decisions.push(ev.decision);
  }
  if (ev.node === "context") {
    const info = (run.stages.synthesize ??= { ms: 0, decisions: [] });
    info.ms += ev.ms;
    info.context = ev.decision;
  }
  for (const name of stages) {
    const info = run.stages[name];
    let decision = info.decisions.at(-1);
    let title = `${STAGE_NAMES[name]}: ${info.decisions.join("\n")}`;
    let ms = info.ms;
    if (ev.node === "retriever" && (name === "retrieve" || name === "rerank")) {
      // The retriever node runs the hybrid search and the rerank; its counts split the time.
      const rerankMs = Number(ev.counts?.rerank_ms ?? NaN);
      if (name === "rerank") {
        const kept = ev.counts?.kept;
        decision = kept === undefined ? "reranked with the search" : `kept ${kept} passage${kept === 1 ? "" : "s"}`;
        if (Number.isFinite(rerankMs)) {
          run.rerankMs = (run.rerankMs ?? 0) + Math.min(rerankMs, ev.ms);
          ms = run.rerankMs;
        } else {
          ms = "with retrieve";
        }
        title = `Rerank: ${info.decisions.join("\n")}`;
      } else if (Number.isFinite(rerankMs)) {
        ms = Math.max(0, info.ms - (run.rerankMs ?? 0) - Math.min(rerankMs, ev.ms));
      }
    }
    if (name === "synthesize" && info.context) title += `\ncontext: ${info.context}`;
    setStageInfo(name, ms, decision, title);
    finishStage(name);
  }
  let next = NEXT[ev.node] ?? [];
  if (ev.node === "router" && /^(direct|about)/.test(ev.decision)) next = ["synthesize"];
  for (const name of next) {
    // After a reformulation, retrieve and rerank run again although they are done.
    if (stageEl(name).dataset.state !== "done" || ev.node === "reformulator") setStageState(name, "active");
  }
  if (ev.node === "context") {
    setStageInfo("synthesize", run.stages.synthesize.ms, "writing the answer…", `context: ${ev.decision}`);
  }
  const label = ev.node[0].toUpperCase() + ev.node.slice(1);
  announce(`${label} done${ev.ms !== undefined ? ` in ${fmtMs(ev.ms)}` : ""}: ${ev.decision}`);
}

function endStages(ok) {
  for (const name of STAGES) {
    const state = stageEl(name).dataset.state;
    if (state === "active") setStageState(name, run.order.includes(name) ? "done" : ok ? "skipped" : "pending");
    else if (state === "pending" && ok) {
      setStageState(name, "skipped");
      $(".stage-decision", stageEl(name)).textContent = name === "reformulate" ? "not needed" : "skipped";
    }
  }
}

function announce(text) {
  $("#run-status").textContent = text;
}

// -- Ask: the answer ------------------------------------------------------------------------------

function setStatus(status) {
  $("#panel-ask").dataset.status = status;
  const running = status === "running";
  $("#stop-btn").hidden = !running;
  $("#ask-btn").textContent = running ? "Asking…" : "Ask";
  $("#answer").setAttribute("aria-busy", String(running));
}

// Text with [n] (or [1, 2]) markers, as text nodes and citation buttons.
function citedNodes(text, ctx) {
  const out = [];
  const re = /\[(\d+(?:\s*,\s*\d+)*)\]/g;
  let last = 0;
  let m;
  while ((m = re.exec(text)) !== null) {
    out.push(text.slice(last, m.index));
    const nums = m[1].split(",").map((s) => Number(s.trim()));
    if (nums.every((n) => ctx.chunks.has(n) || ctx.citations.has(n))) {
      nums.forEach((n) => out.push(citeButton(n, ctx)));
    } else {
      out.push(m[0]);
    }
    last = re.lastIndex;
  }
  out.push(text.slice(last));
  return out.filter((x) => x !== "");
}

function citeButton(n, ctx) {
  const cit = ctx.citations.get(n);
  const chunk = ctx.chunks.get(n);
  const title = cit?.title ?? chunk?.title ?? "";
  const unsupported = cit && cit.supported === false;
  const label = `Source ${n}: ${title}${unsupported ? " (not supported by the passage)" : ""}`;
  return el("button", {
    type: "button",
    class: `cite${unsupported ? " unsupported" : ""}`,
    "data-cite": n,
    "aria-label": label,
    title: unsupported ? `The verifier did not find this claim in passage [${n}]` : title,
    onclick: () => highlightSource(n),
  }, `[${n}]`);
}

function paragraphs(text, ctx) {
  return text
    .split(/\n{2,}/)
    .map((p) => p.trim())
    .filter(Boolean)
    .map((p) => el("p", {}, citedNodes(p, ctx)));
}

function highlightSource(n) {
  const target = $(`#source-${n}`);
  if (!target) return;
  for (const s of $$(".source.highlight")) s.classList.remove("highlight");
  target.classList.add("highlight");
  const details = $("details", target);
  if (details) details.open = true;
  target.scrollIntoView({ block: "center", behavior: reducedMotion ? "auto" : "smooth" });
  target.focus({ preventScroll: true });
}

function renderAnswer(a) {
  const ctx = {
    citations: new Map((a.citations || []).map((c) => [c.n, c])),
    chunks: new Map((a.chunks || []).filter((c) => c.n !== null && c.n !== undefined).map((c) => [c.n, c])),
  };
  const box = $("#answer");
  box.replaceChildren();
  if (a.abstained) {
    const [message] = (a.text || "").split(/\n\s*\nClosest papers/);
    const closest = a.closest || [];
    box.append(
      el("div", { class: "abstained", "data-testid": "abstained" },
        el("p", { class: "abstained-title", text: "The library does not say" }),
        paragraphs(message || "arag found no passage that answers this question.", ctx),
        a.missing?.length
          ? el("p", { class: "missing" }, "Not found in any passage: ",
            a.missing.map((t, i) => [i ? ", " : "", el("q", { text: t })]))
          : null,
        closest.length
          ? el("div", { class: "closest" },
            el("h3", { text: "Closest papers in the library" }),
            el("ul", {}, closest.map((p) =>
              el("li", { class: "closest-paper" },
                el("span", { class: "closest-title", text: p.title }), " ",
                el("span", { class: "muted" }, `(${p.paper_id}, score ${fmtScore(p.score)})`), " ",
                arxivLink(p.paper_id, "arXiv")))))
          : null),
    );
  } else if (a.form === "literature" && a.groups?.length) {
    box.append(literatureAnswer(a, ctx));
  } else {
    const short = (a.short_answer || "").trim();
    box.append(
      el("div", { class: "answered" },
        short ? el("p", { class: "short-label", text: "Short answer" }) : null,
        short ? el("p", { class: "short-answer", "data-testid": "short-answer" }, citedNodes(short, ctx)) : null,
        el("div", { class: "explanation", "data-testid": "explanation" }, paragraphs(a.text || "", ctx)),
        a.dropped_claims
          ? el("p", { class: "note" },
            `The verifier dropped ${a.dropped_claims} unsupported claim${a.dropped_claims === 1 ? "" : "s"}.`)
          : null,
        [...ctx.citations.values()].some((c) => !c.supported)
          ? el("p", { class: "note" }, el("span", { class: "cite unsupported sample", "aria-hidden": "true" }, "[n]"),
            " marks a citation whose passage the verifier found no support in.")
          : null),
    );
  }
  box.append(answerMeta(a));
  renderSources(a, ctx);
}

function coverageText(c) {
  if (!c) return null;
  const n = (x) => Number(x).toLocaleString("en");
  return c.complete ? `searched all ${n(c.papers)} papers`
    : `searched ${n(c.papers)} of ${n(c.of)} papers (the library is still being built)`;
}

// An open question's answer: the overview, each group's cited points under its label, the papers.
function literatureAnswer(a, ctx) {
  const groupTexts = new Set(a.groups.map((g) => g.text));
  const overview = (a.text || "").split(/\n{2,}/).filter((p) => p.trim() && !groupTexts.has(p));
  return el("div", { class: "answered literature", "data-testid": "literature" },
    el("p", { class: "short-answer", "data-testid": "short-answer", text: a.short_answer || "" }),
    el("div", { class: "explanation", "data-testid": "explanation" },
      overview.map((p) => el("p", {}, citedNodes(p, ctx))),
      a.groups.map((g) => el("section", { class: "lit-group", "data-testid": "lit-group" },
        a.groups.length > 1 ? el("h3", { text: g.label }) : null,
        el("p", {}, citedNodes(g.text, ctx))))),
    el("h3", { text: `Papers (${(a.papers || []).length})` }),
    el("ol", { class: "lit-papers", "data-testid": "lit-papers" }, (a.papers || []).map((p) =>
      el("li", {},
        citeButton(p.n, ctx), " ",
        el("span", { class: "closest-title", text: p.title }), " ",
        // A compound question's paper can stand in several parts: name each.
        a.groups.length > 1 ? el("span", { class: "muted", text: `(${
          a.groups.filter((g) => (g.paper_ids || []).includes(p.paper_id)).map((g) => g.label).join("; ") || p.group})` })
          : null, " ",
        arxivLink(p.paper_id, "arXiv") ?? el("span", { class: "muted", text: p.paper_id })))),
    a.dropped_claims
      ? el("p", { class: "note" },
        `The verifier dropped ${a.dropped_claims} unsupported claim${a.dropped_claims === 1 ? "" : "s"}.`)
      : null);
}

function answerMeta(a) {
  const bits = [
    coverageText(a.coverage),
    `route: ${a.route}`,
    `mode: ${a.mode}`,
    a.retries ? `${a.retries} retr${a.retries === 1 ? "y" : "ies"}` : null,
    a.total_ms ? `${fmtMs(a.total_ms)} total` : null,
    a.request_id ? `request ${a.request_id}` : null,
  ].filter(Boolean);
  const subs = a.sub_queries || [];
  return el("div", { class: "meta" },
    el("p", { class: "muted", text: bits.join(" · ") }),
    subs.length
      ? el("details", { class: "subqueries" },
        el("summary", {}, `Queries searched (${subs.length})`),
        el("ol", {}, subs.map((q) => el("li", { text: q }))))
      : null);
}

function renderSources(a, ctx) {
  const list = $("#sources");
  const used = [...ctx.chunks.values()].sort((x, y) => x.n - y.n);
  $("#sources-count").textContent = used.length ? `(${used.length})` : "";
  if (!used.length) {
    list.replaceChildren(el("p", { class: "muted", text: "No passages were used for this answer." }));
    return;
  }
  list.replaceChildren(
    ...used.map((c) => {
      const cit = ctx.citations.get(c.n);
      const support = cit
        ? el("span", { class: `support ${cit.supported ? "ok" : "bad"}` },
          `${cit.supported ? "✓ supported" : "✗ not supported"} (${fmtScore(cit.support, 2)})`)
        : null;
      return el("article", {
        class: `source${cit ? " cited" : ""}${cit && !cit.supported ? " unsupported" : ""}`,
        id: `source-${c.n}`,
        "data-n": c.n,
        tabindex: "-1",
        "aria-labelledby": `source-${c.n}-title`,
      },
      el("div", { class: "source-head" },
        el("span", { class: "badge", text: `[${c.n}]` }),
        el("h3", { class: "source-title", id: `source-${c.n}-title`, text: c.title })),
      el("p", { class: "source-meta" },
        [c.section ? el("span", { text: sectionPath(c.section) }) : null,
          arxivLink(c.paper_id) ?? el("span", { text: c.paper_id }),
          el("span", { text: `score ${fmtScore(c.score)}` }),
          c.pass_index ? el("span", { text: "found on the retry" }) : null,
          support]
          .filter(Boolean)
          .flatMap((x, i) => (i ? [el("span", { class: "sep", "aria-hidden": "true", text: "·" }), x] : [x]))),
      el("details", {},
        el("summary", {}, "Passage"),
        el("p", { class: "passage", text: c.text || "(no text)" }),
        c.query ? el("p", { class: "muted small" }, "found by the query ", el("q", { text: c.query })) : null));
    }),
  );
}

// -- Ask: one run ---------------------------------------------------------------------------------

function startRun(question) {
  run = { question, order: [], stages: {}, nodes: 0, draft: "" };
  window.aragStageOrder = [];
  resetStages();
  setStageState("route", "active");
  clearError();
  $("#results").hidden = false;
  $("#answer").replaceChildren();
  $("#sources").replaceChildren(el("p", { class: "muted", text: "The passages the answer cites appear here." }));
  $("#sources-count").textContent = "";
  $("#drafting-text").textContent = "";
  $("#drafting").hidden = true;
  setStatus("running");
  announce("Asking…");
}

function onToken(text) {
  run.draft += text;
  $("#drafting").hidden = false;
  $("#drafting-text").textContent = run.draft;
}

function onAnswer(a) {
  if (run.nodes === 0) for (const ev of a.events || []) onNode(ev);
  endStages(true);
  $("#drafting").hidden = true;
  renderAnswer(a);
  window.aragLastAnswer = a;
  setStatus(a.abstained ? "abstained" : "answered");
  announce(a.abstained ? "Done: the library does not answer this question." : `Answer ready: ${a.short_answer}`);
}

function failRun(err) {
  if (run) endStages(false);
  $("#drafting").hidden = !run?.draft;
  $("#results").hidden = !run?.draft;
  setStatus("error");
  announce("The question failed: the error is above.");
  showError(err instanceof ApiError ? err : new ApiError({ error: String(err?.message || err) }));
}

async function ask(raw) {
  const question = raw.trim();
  if (!question) {
    showError(new ApiError({ error: "the question is empty", fix: "type a question, or pick an example" }));
    $("#question").focus();
    return;
  }
  controller?.abort();
  const mine = new AbortController();
  controller = mine;
  startRun(question);
  const body = { question };
  if (scope.length) body.papers = scope;
  let res;
  try {
    res = await fetch("/query/stream", {
      method: "POST",
      headers: requestHeaders("sse"),
      body: JSON.stringify(body),
      signal: mine.signal,
    });
  } catch (exc) {
    if (exc.name !== "AbortError") failRun(networkError(exc));
    return;
  }
  if (!res.ok) {
    failRun(await httpError(res));
    return;
  }
  let finished = false;
  try {
    for await (const ev of sseEvents(res)) {
      if (controller !== mine) return;
      let data;
      try {
        data = JSON.parse(ev.data);
      } catch {
        continue; // not ours (a keep-alive or a proxy's note)
      }
      if (ev.event === "start") run.requestId = data.request_id;
      else if (ev.event === "node") onNode(data);
      else if (ev.event === "token") onToken(data.text ?? "");
      else if (ev.event === "answer") {
        onAnswer(data);
        finished = true;
      } else if (ev.event === "error") {
        failRun(new ApiError({ ...data, request_id: data.request_id ?? run.requestId }));
        finished = true;
      }
    }
  } catch (exc) {
    if (exc.name === "AbortError" || controller !== mine) return;
    failRun(networkError(exc));
    return;
  }
  if (!finished && controller === mine) {
    failRun(new ApiError({
      error: "the answer stream ended before the answer arrived",
      fix: "ask again; if it keeps happening, the server log says why",
      request_id: run.requestId,
    }));
  }
}

// A question asked from elsewhere on the page (a topic of the map): over the whole library.
// A paper's actions (the library list and the map): ask about it, then its summary and related work.
function paperActions(d, out, buttonClass) {
  return el("div", { class: "paper-actions" },
    el("button", {
      type: "button", class: buttonClass,
      onclick: () => {
        setScope([d.id], { [d.id]: d.title });
        selectTab("ask");
        $("#question").focus();
      },
    }, "Ask about this paper"),
    ...paperToolButtons(d.id, out));
}

function askAbout(question) {
  setScope([]);
  const q = $("#question");
  q.value = question;
  q.dispatchEvent(new Event("input"));
  selectTab("ask");
  ask(question);
}

function stop() {
  if (!controller) return;
  controller.abort();
  controller = null;
  if (run) endStages(false);
  setStatus("stopped");
  announce("Stopped.");
}

function initAsk() {
  const form = $("#ask-form");
  const q = $("#question");
  const count = $("#question-count");
  const updateCount = () => {
    count.textContent = `${q.value.length} / ${MAX_QUESTION}`;
    count.classList.toggle("over", q.value.length > MAX_QUESTION);
  };
  q.addEventListener("input", updateCount);
  q.addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
      e.preventDefault();
      form.requestSubmit();
    }
  });
  form.addEventListener("submit", (e) => {
    e.preventDefault();
    ask(q.value);
  });
  for (const b of $$(".example", form)) {
    b.title = b.textContent.trim(); // the whole question, where a phone cuts it short
    b.addEventListener("click", () => {
      q.value = b.textContent.trim();
      updateCount();
      ask(q.value);
    });
  }
  $("#stop-btn").addEventListener("click", stop);
  const params = new URLSearchParams(location.search);
  if (params.get("q")) {
    q.value = params.get("q");
    updateCount();
  }
}

// -- Search ---------------------------------------------------------------------------------------

function stageRanks(hit) {
  const names = { abstracts: "abstracts", passages: "passages", bm25: "BM25" };
  return (hit.found_by || []).map((s) => `${names[s] ?? s} #${hit.stage_ranks?.[s] ?? "?"}`).join(", ") || "–";
}

// Section, and the chunk type when it says more than the section ("table"; not "abstract" twice).
function hitPlace(h) {
  const type = h.type !== "passage" && h.type !== (h.section || "").toLowerCase() ? h.type : null;
  return [h.section && sectionPath(h.section), type].filter(Boolean).join(" · ");
}

function renderSearch(r) {
  const out = $("#search-results");
  const timing = Object.entries(r.timings || {}).map(([k, v]) => `${k} ${fmtMs(v)}`).join(", ");
  const head = el("p", { class: "muted search-head" },
    `${r.hits.length} passage${r.hits.length === 1 ? "" : "s"} for `, el("q", { text: r.query }),
    r.searched_as && r.searched_as !== r.query ? [" (searched as ", el("q", { text: r.searched_as }), ")"] : null,
    r.resolved_paper ? ` · scoped to ${r.resolved_paper}` : null,
    ` · reranker: ${r.model === "none" ? "none (fused order)" : r.model}`, timing ? ` · ${timing}` : null,
    r.coverage ? ` · ${coverageText(r.coverage)}` : null);
  if (!r.hits.length) {
    out.replaceChildren(head, el("p", { text: "No passage matched." }));
    return;
  }
  const hits = r.hits.map((h) =>
    el("li", { class: `hit${h.kept ? " kept" : ""}`, "data-rank": h.rank },
      el("div", { class: "hit-head" },
        el("span", { class: "badge", text: `#${h.rank}` }),
        el("div", { class: "hit-title" },
          el("strong", { text: h.title }),
          el("span", { class: "muted" }, hitPlace(h)),
          h.arxiv_url ? el("a", { href: h.arxiv_url, target: "_blank", rel: "noopener noreferrer" }, `arXiv:${h.paper_id}`)
            : el("span", { class: "muted", text: h.paper_id })),
        el("span", { class: `kept-mark ${h.kept ? "yes" : "no"}` }, h.kept ? "✓ kept" : "below the bar")),
      el("dl", { class: "scores" },
        el("div", {}, el("dt", { text: "score" }), el("dd", { "data-score": "score", text: fmtScore(h.score, 4) })),
        el("div", {}, el("dt", { text: "rerank" }),
          el("dd", { "data-score": "rerank", text: fmtScore(h.rerank_score, 3) })),
        el("div", {}, el("dt", { text: "fused rank" }), el("dd", { text: String(h.fused_rank) })),
        el("div", {}, el("dt", { text: "fused (RRF)" }), el("dd", { text: fmtScore(h.fused_score, 4) })),
        el("div", { class: "wide" }, el("dt", { text: "found by" }), el("dd", { text: stageRanks(h) })),
        h.floored ? el("div", {}, el("dt", { text: "floored" }), el("dd", { text: "yes" })) : null),
      el("details", {}, el("summary", {}, "Passage"), el("p", { class: "passage", text: h.text }))));
  out.replaceChildren(head, el("ol", { class: "hits", "data-testid": "search-hits" }, hits));
}

function initSearch() {
  let ctrl = null;
  $("#search-form").addEventListener("submit", async (e) => {
    e.preventDefault();
    const query = $("#search-q").value.trim();
    if (!query) {
      $("#search-q").focus();
      return;
    }
    ctrl?.abort();
    ctrl = new AbortController();
    clearError();
    const out = $("#search-results");
    out.replaceChildren(el("p", { class: "muted", text: "Searching…" }));
    const body = { query, k: Number($("#search-k").value) };
    if (scope.length) body.papers = scope;
    try {
      renderSearch(await api("/search", { method: "POST", body, signal: ctrl.signal }));
    } catch (exc) {
      if (exc.name === "AbortError") return;
      out.replaceChildren();
      showError(exc);
    }
  });
}

// -- Papers ---------------------------------------------------------------------------------------

const PAGE = 20;
const papers = { offset: 0, total: 0, q: "", loaded: false, ctrl: null };

async function loadPapers() {
  papers.ctrl?.abort();
  papers.ctrl = new AbortController();
  const params = new URLSearchParams({ offset: String(papers.offset), limit: String(PAGE) });
  if (papers.q) params.set("q", papers.q);
  try {
    const r = await api(`/papers?${params}`, { signal: papers.ctrl.signal });
    papers.total = r.total;
    papers.loaded = true;
    renderPapers(r);
  } catch (exc) {
    if (exc.name !== "AbortError") showError(exc);
  }
}

function renderPapers(r) {
  const from = r.total ? r.offset + 1 : 0;
  const to = r.offset + r.papers.length;
  $("#papers-summary").textContent = r.total
    ? `Papers ${from}–${to} of ${r.total}${papers.q ? ` matching “${papers.q}”` : ""}`
    : `No paper${papers.q ? ` has “${papers.q}” in its title` : " in the library"}.`;
  $("#papers").replaceChildren(...r.papers.map(paperItem));
  $("#papers-prev").disabled = r.offset <= 0;
  $("#papers-next").disabled = to >= r.total;
}

function paperItem(p) {
  const detailId = `paper-detail-${p.id.replace(/[^A-Za-z0-9_-]/g, "_")}`;
  const detail = el("div", { class: "paper-detail", id: detailId, hidden: true });
  const toggle = el("button", {
    type: "button", class: "paper-title", "aria-expanded": "false", "aria-controls": detailId,
    onclick: async () => {
      const open = toggle.getAttribute("aria-expanded") !== "true";
      toggle.setAttribute("aria-expanded", String(open));
      detail.hidden = !open;
      if (open && !detail.dataset.loaded) {
        detail.replaceChildren(el("p", { class: "muted", text: "Loading…" }));
        try {
          const d = await api(`/papers/${encodeURIComponent(p.id)}`);
          detail.dataset.loaded = "1";
          const out = toolOutput();
          detail.replaceChildren(...[
            d.authors?.length ? el("p", { class: "muted", text: d.authors.join(", ") }) : null,
            d.topic_label ? el("p", { class: "muted small" }, `Topic: ${d.topic_label}`) : null,
            el("h3", { class: "abstract-h", text: "Abstract" }),
            el("p", { class: "abstract", text: (d.abstract || "").trim() || "(no abstract)" }),
            paperActions(d, out, "btn"),
            out,
          ].filter(Boolean));
        } catch (exc) {
          detail.replaceChildren();
          showError(exc);
        }
      }
    },
  }, p.title);
  return el("li", { class: "paper", "data-id": p.id },
    toggle,
    el("p", { class: "paper-meta" },
      el("span", { class: "mono", text: p.id }),
      p.year ? el("span", { text: String(p.year) }) : null,
      el("span", { text: `${p.chunks} chunks` }),
      p.arxiv_url ? el("a", { href: p.arxiv_url, target: "_blank", rel: "noopener noreferrer" }, "arXiv") : null),
    detail);
}

function initPapers() {
  let timer = null;
  $("#papers-q").addEventListener("input", (e) => {
    clearTimeout(timer);
    timer = setTimeout(() => {
      papers.q = e.target.value.trim();
      papers.offset = 0;
      loadPapers();
    }, 250);
  });
  $("#papers-prev").addEventListener("click", () => {
    papers.offset = Math.max(0, papers.offset - PAGE);
    loadPapers();
  });
  $("#papers-next").addEventListener("click", () => {
    papers.offset += PAGE;
    loadPapers();
  });
  tabLoaders.papers = () => {
    if (!papers.loaded) loadPapers();
  };
}

// -- How it works: this server's models ---------------------------------------------------------

async function loadSystem() {
  try {
    const s = await api("/v1/system");
    $("#api-key-needed").hidden = true;
    for (const dd of $$("[data-model]")) dd.textContent = s.models?.[dd.dataset.model] ?? "–";
    const lib = s.library || {};
    const figures = `This server's library: ${lib.papers ?? "?"} papers, ${lib.chunks ?? "?"} chunks.`;
    $("#library-figures").textContent = figures;
    $("#footer-figures").textContent =
      `${lib.papers ?? "?"} papers · LLM: ${s.models?.llm ?? "?"} · arag ${s.version}`;
  } catch (exc) {
    for (const dd of $$("[data-model]")) dd.textContent = "unknown";
    if (exc.status === 401) openKeyBox(true);
  }
}

// -- the library build and the reranker training, live (GET /ready) -----------------------------

function fmtDuration(s) {
  if (s == null || !isFinite(s)) return null;
  if (s < 90) return `${Math.round(s)} s`;
  if (s < 5400) return `${Math.round(s / 60)} min`;
  return `${Math.floor(s / 3600)} h ${Math.round((s % 3600) / 60)} min`;
}

const RERANK_TEXT = {
  waiting: "Reranker: it trains once the library is built; until then searches use the fused order.",
  training: "Reranker: training; until it is installed searches use the fused order.",
  installed: "Reranker: installed; searches are reranked.",
  failed: "Reranker: training failed; searches use the fused order.",
  stopped: "Reranker: training stopped with the server; it restarts with it.",
  unavailable: "Reranker: no training data here; searches use the fused order.",
};

function renderBuild(r) {
  const box = $("#build-status");
  const b = r.build;
  const t = r.reranker;
  const building = b && (b.state === "loading" || b.state === "building");
  const training = t && (t.state === "waiting" || t.state === "training");
  const trouble = (b && b.state === "failed") || (t && t.state === "failed");
  const justDone = box.dataset.active === "true";
  if (!building && !training && !trouble && !justDone) {
    box.hidden = true;
    return false;
  }
  box.hidden = false;
  box.dataset.active = String(building || training);
  box.dataset.state = b ? b.state : "off";
  const n = (x) => Number(x).toLocaleString("en");
  let title;
  let figures = "";
  if (b && b.state === "loading") {
    title = "Preparing the library build (reading the papers)…";
  } else if (building) {
    title = `Building the library: ${n(b.papers)} of ${n(b.papers_total)} papers indexed. `
      + "Questions are answered from the papers indexed so far.";
    const left = fmtDuration(b.eta_s);
    figures = [
      `${n(b.papers_done)} of ${n(b.papers_todo)} papers this run`,
      `${n(b.chunks_done)} chunks`,
      b.chunks_per_s ? `${b.chunks_per_s.toFixed(1)} chunks/s` : null,
      left ? `about ${left} left` : null,
    ].filter(Boolean).join(" · ");
  } else if (b && b.state === "failed") {
    title = `The library build stopped: ${b.error}. ${b.fix || ""}`;
  } else {
    title = `The library is complete: ${n(r.papers)} papers, ${n(r.chunks)} chunks.`;
  }
  $("#build-title").textContent = title;
  const bar = $("#build-bar");
  bar.hidden = !building;
  bar.value = b && b.papers_total ? b.papers / b.papers_total : 0;
  $("#build-figures").textContent = figures;
  let rerank = t ? RERANK_TEXT[t.state] || "" : "";
  if (t && t.state === "training" && t.stage) {
    rerank += ` (${t.stage}${t.total ? `: ${n(t.done)} of ${n(t.total)}` : ""})`;
  }
  if (t && t.state === "failed" && t.error) rerank += ` ${t.error}`;
  $("#build-rerank").textContent = rerank;
  return building || training;
}

async function pollBuild() {
  let again = 30000;
  try {
    const res = await fetch("/ready", { headers: { Accept: "application/json" } });
    const r = await res.json();
    if (renderBuild(r)) again = 2000;
    // The footer and "How it works" figures follow the growing library (at most every 10 s).
    const box = $("#build-status");
    const now = Date.now();
    if (box.dataset.loaded !== String(r.papers) && (r.state === "complete" || now - (pollBuild.last || 0) > 10000)) {
      box.dataset.loaded = String(r.papers);
      pollBuild.last = now;
      loadSystem();
    }
  } catch (exc) {
    again = 5000;
  }
  setTimeout(pollBuild, again);
}

// -- start ----------------------------------------------------------------------------------------

function init() {
  initTabs();
  initKey();
  initAsk();
  initSearch();
  initPapers();
  initMap();
  $("#error-close").addEventListener("click", clearError);
  $("#scope-clear").addEventListener("click", () => setScope([]));
  const params = new URLSearchParams(location.search);
  const ids = (params.get("papers") || "").split(/[\s,]+/).filter(Boolean);
  if (ids.length) setScope(ids);
  selectTab(location.hash.slice(1) || "ask", { updateHash: false });
  loadSystem();
  pollBuild();
  document.documentElement.dataset.ready = "true";
}

init();

export { $, api, arxivLink, askAbout, el, paperActions, sectionPath, selectTab, setScope, showError, tabLoaders };
