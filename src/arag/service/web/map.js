// The map of the library: each paper a dot at its 2-D point (a projection of its abstract vector,
// computed when the library is built), coloured by topic, topic labels at their centres. Hover a dot
// for its title; click it to open the paper; click a topic to ask about it. Plain SVG.

import { $, api, arxivLink, askAbout, el, paperActions, showError, tabLoaders } from "./app.js";
import { toolOutput } from "./papertools.js";

const SVG = "http://www.w3.org/2000/svg";
const W = 1000;
const H = 640;
const PAD = 24;
const state = { loaded: false, data: null, selected: null };

function svg(tag, attrs = {}) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, String(v));
  return node;
}

// Twenty colours told apart on white (the default k is 20); past them the hues repeat, lighter.
const PALETTE = [
  "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22",
  "#393b79", "#ad494a", "#637939", "#7b4173", "#3182bd", "#e6550d", "#31a354", "#756bb1", "#843c39",
  "#636363", "#d6616b",
];

export function topicColour(topic) {
  if (topic === null || topic === undefined) return "#8a94a3";
  const base = PALETTE[topic % PALETTE.length];
  return topic < PALETTE.length ? base : `color-mix(in srgb, ${base} 60%, white)`;
}

// Labels that overlap a bigger topic's label move down (then up) until they are clear.
function spreadLabels(texts) {
  const placed = [];
  const overlaps = (a, b) => a.x < b.x + b.width && b.x < a.x + a.width && a.y < b.y + b.height && b.y < a.y + a.height;
  for (const text of texts) {
    const y0 = Number(text.getAttribute("y"));
    let box = text.getBBox();
    for (let i = 1; i <= 8 && placed.some((p) => overlaps(box, p)); i += 1) {
      const step = Math.ceil(i / 2) * (box.height + 2) * (i % 2 ? 1 : -1);
      text.setAttribute("y", String(y0 + step));
      box = text.getBBox();
    }
    placed.push(box);
  }
}

function focusTopic(topic) {
  for (const dot of document.querySelectorAll("#map-svg .map-dot")) {
    dot.classList.toggle("dim", topic !== null && dot.dataset.topic !== String(topic));
  }
}

function fit(papers) {
  const xs = papers.map((p) => p.x);
  const ys = papers.map((p) => p.y);
  const [x0, x1, y0, y1] = [Math.min(...xs), Math.max(...xs), Math.min(...ys), Math.max(...ys)];
  const s = Math.min((W - 2 * PAD) / Math.max(x1 - x0, 1e-9), (H - 2 * PAD) / Math.max(y1 - y0, 1e-9));
  const ox = (W - s * (x1 - x0)) / 2;
  const oy = (H - s * (y1 - y0)) / 2;
  // Screen y grows downwards: flip it so the picture matches the projection's axes.
  return (x, y) => [ox + s * (x - x0), H - (oy + s * (y - y0))];
}

function topicQuestion(label) {
  return `What do the library's papers on ${label} study, and how?`;
}

function openPaper(id) {
  const pane = $("#map-paper");
  state.selected = id;
  for (const dot of document.querySelectorAll("#map-svg .map-dot.selected")) dot.classList.remove("selected");
  document.querySelector(`#map-svg .map-dot[data-id="${CSS.escape(id)}"]`)?.classList.add("selected");
  pane.replaceChildren(el("p", { class: "muted", text: "Loading…" }));
  pane.hidden = false;
  api(`/papers/${encodeURIComponent(id)}`).then((d) => {
    if (state.selected !== id) return;
    const out = toolOutput();
    pane.replaceChildren(
      el("h3", { class: "map-paper-title", text: d.title }),
      el("p", { class: "paper-meta" },
        el("span", { class: "mono", text: d.id }),
        d.year ? el("span", { text: String(d.year) }) : null,
        d.topic_label ? el("span", { text: `Topic: ${d.topic_label}` }) : null,
        arxivLink(d.id, "arXiv")),
      el("p", { class: "abstract", text: (d.abstract || "").trim() || "(no abstract)" }),
      paperActions(d, out, "btn btn-primary"),
      out);
  }).catch((exc) => {
    pane.replaceChildren();
    showError(exc);
  });
}

function showTip(p, x, y) {
  const tip = $("#map-tip");
  tip.replaceChildren(
    el("strong", { text: p.title }),
    el("span", { class: "muted small", text: ` ${p.id}${p.year ? ` · ${p.year}` : ""}${p.topic_label ? ` · ${p.topic_label}` : ""}` }));
  tip.hidden = false;
  const box = $("#map-svg").getBoundingClientRect();
  const wrap = $(".map-wrap").getBoundingClientRect();
  const left = box.left - wrap.left + (x / W) * box.width;
  const top = box.top - wrap.top + (y / H) * box.height;
  tip.style.left = `${Math.min(left + 12, wrap.width - 280)}px`;
  tip.style.top = `${top + 12}px`;
}

export function renderMap(m) {
  const place = fit(m.papers);
  const root = $("#map-svg");
  root.replaceChildren();
  root.setAttribute("viewBox", `0 0 ${W} ${H}`);
  const dots = svg("g", { class: "map-dots" });
  // Big dots for a few papers, small ones for thousands.
  const radius = Math.max(3.5, Math.min(9, 11 - 1.1 * Math.log(m.papers.length + 1)));
  const byId = new Map();
  for (const p of m.papers) {
    const [x, y] = place(p.x, p.y);
    byId.set(p.id, { p, x, y });
    const dot = svg("circle", {
      class: "map-dot", cx: x.toFixed(1), cy: y.toFixed(1), r: radius.toFixed(1), fill: topicColour(p.topic), "data-id": p.id,
      "data-topic": p.topic ?? "",
    });
    const title = svg("title");
    title.textContent = p.title;
    dot.append(title);
    dots.append(dot);
  }
  dots.addEventListener("mouseover", (e) => {
    const hit = byId.get(e.target?.dataset?.id);
    if (hit) showTip(hit.p, hit.x, hit.y);
  });
  dots.addEventListener("mouseout", () => { $("#map-tip").hidden = true; });
  dots.addEventListener("click", (e) => {
    const id = e.target?.dataset?.id;
    if (id) openPaper(id);
  });
  const labels = svg("g", { class: "map-labels" });
  for (const t of m.topics) {
    const [x, y] = place(t.x, t.y);
    const short = t.label.split(", ").slice(0, 2).join(", ");
    // Above the topic's centre, so the label does not hide the paper that may sit there.
    const text = svg("text", {
      class: "map-label", x: x.toFixed(1), y: (y - 2 * radius).toFixed(1), "text-anchor": "middle", "data-topic": t.topic,
    });
    text.textContent = short;
    const title = svg("title");
    title.textContent = `${t.label} (${t.papers} papers): click to ask about this topic`;
    text.append(title);
    text.addEventListener("click", () => askAbout(topicQuestion(t.label)));
    text.addEventListener("mouseenter", () => focusTopic(t.topic));
    text.addEventListener("mouseleave", () => focusTopic(null));
    labels.append(text);
  }
  root.append(dots, labels);
  // Biggest topics keep their place; smaller ones make way.
  const order = new Map(m.topics.map((t) => [String(t.topic), t.papers]));
  spreadLabels([...labels.children].sort((a, b) => order.get(b.dataset.topic) - order.get(a.dataset.topic)));
  root.setAttribute("aria-label", `A map of ${m.papers.length} papers in ${m.topics.length} topics`);
  $("#map-summary").textContent =
    `${m.papers.length} papers, ${m.topics.length} topics; drawn by ${m.method === "tsne" ? "t-SNE" : "PCA"} of the abstract vectors.`;
  $("#map-topics").replaceChildren(...m.topics.map((t) =>
    el("li", {
      class: "map-topic", "data-topic": String(t.topic),
      onmouseenter: () => focusTopic(t.topic), onmouseleave: () => focusTopic(null),
    },
      swatch(topicColour(t.topic)),
      el("button", {
        type: "button", class: "linklike", title: "Ask about this topic",
        onclick: () => askAbout(topicQuestion(t.label)),
      }, t.label),
      el("span", { class: "muted small", text: ` ${t.papers}` }))));
}

async function loadMap() {
  try {
    state.data = await api("/map");
    state.loaded = true;
    renderMap(state.data);
  } catch (exc) {
    $("#map-summary").textContent = "No map to show.";
    showError(exc);
  }
}

export function initMap() {
  tabLoaders.map = () => {
    if (!state.loaded) loadMap();
  };
}

// A topic's colour dot. Set through the CSSOM: a style attribute is inline style, which the page's
// Content-Security-Policy (style-src 'self') refuses.
function swatch(colour) {
  const dot = el("span", { class: "swatch", "aria-hidden": "true" });
  dot.style.background = colour;
  return dot;
}
