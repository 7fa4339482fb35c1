// Research tools around one paper, on its view (Papers tab and the map): a cited summary and the
// related papers. Server text is only ever set as textContent.

import { api, arxivLink, el, sectionPath, showError } from "./app.js";

function citedText(text) {
  // "... [3]." -> the markers as quiet badges, the rest as text.
  const out = [];
  let last = 0;
  for (const m of text.matchAll(/\[(\d+(?:,\s*\d+)*)\]/g)) {
    out.push(text.slice(last, m.index));
    out.push(el("span", { class: "cite-badge", "data-n": m[1] }, `[${m[1]}]`));
    last = m.index + m[0].length;
  }
  out.push(text.slice(last));
  return out;
}

export function renderSummary(s) {
  const parts = s.parts.map((p) =>
    el("div", { class: "summary-part", "data-aspect": p.aspect },
      el("h4", { text: p.heading }),
      p.text
        ? el("p", {}, ...citedText(p.text))
        : el("p", { class: "muted", text: "Not stated in the paper's passages." }),
      p.mode === "extractive"
        ? el("p", { class: "muted small", text: p.note ? `Sentences taken from the paper: ${p.note.replace(/; sentences taken from the passages$/, "")}.` : "Sentences taken from the paper." })
        : null,
      p.dropped ? el("p", { class: "muted small", text: `${p.dropped} unsupported sentence(s) dropped.` }) : null));
  const sources = s.sources.map((src) =>
    el("li", { "data-n": String(src.n) },
      el("details", {},
        el("summary", {}, `[${src.n}] ${src.section ? sectionPath(src.section) : "Abstract"} · support ${src.support.toFixed(2)}`),
        el("p", { class: "passage", text: src.text }))));
  return el("section", { class: "paper-tool summary", "data-testid": "summary" },
    el("h3", { text: "Summary" }),
    ...parts,
    sources.length ? el("h4", { text: "Sources" }) : null,
    sources.length ? el("ul", { class: "summary-sources" }, ...sources) : null,
    el("p", { class: "muted small", text: `${s.llm} · ${(s.total_ms / 1000).toFixed(1)} s` }));
}

export function renderRelated(r) {
  const items = r.papers.map((p) =>
    el("li", { class: "related-paper", "data-id": p.paper_id },
      el("p", { class: "related-title" },
        el("strong", { text: p.title }), p.year ? ` (${p.year}) ` : " ",
        p.arxiv_url ? arxivLink(p.paper_id, "arXiv") : el("span", { class: "mono", text: p.paper_id })),
      el("p", { text: p.relation }),
      el("p", { class: "muted small",
        text: `vector rank ${p.dense_rank} · term rank ${p.term_rank} · shared: ${p.shared_terms.join(", ") || "–"}` })));
  return el("section", { class: "paper-tool related", "data-testid": "related" },
    el("h3", { text: "Related work" }),
    items.length ? el("ol", { class: "related-list" }, ...items) : el("p", { class: "muted", text: "No other paper." }),
    el("p", { class: "muted small", text: `How they are found: ${r.method}.` }));
}

// "Summarise" and "Related work" buttons for a paper; results go into `out`.
export function paperToolButtons(paperId, out) {
  const run = async (button, path, render, busy) => {
    button.disabled = true;
    out.replaceChildren(el("p", { class: "muted", role: "status", text: busy }));
    try {
      const r = await api(`/papers/${encodeURIComponent(paperId)}/${path}`);
      out.replaceChildren(render(r));
    } catch (exc) {
      out.replaceChildren();
      showError(exc);
    } finally {
      button.disabled = false;
    }
  };
  const summary = el("button", { type: "button", class: "btn" }, "Summarise");
  summary.addEventListener("click", () =>
    run(summary, "summary", renderSummary, "Summarising: each aspect is searched, written and checked…"));
  const related = el("button", { type: "button", class: "btn" }, "Related work");
  related.addEventListener("click", () => run(related, "related", renderRelated, "Finding related papers…"));
  return [summary, related];
}

export function toolOutput() {
  return el("div", { class: "paper-tool-out", "aria-live": "polite" });
}
