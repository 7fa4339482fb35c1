"""The web page in a real browser (Debian's Chromium driven by Playwright) against a live server on a
small library (6 QASPER papers, hash embedder, no reranking model, scripted LLM): the streamed
pipeline, the cited answer, abstention, errors, the API key, search, papers, and phone width.

Screenshots of each state go to $ARAG_TEST_ARTIFACTS when set, else to the test's tmp_path."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
from pydantic import SecretStr

from arag.api import Library
from arag.service import create_app
from arag.settings import Settings, get_settings
from conftest import isolate
from service_util import SMALL, echo_llm, running_server

CHROMIUM = Path("/usr/bin/chromium")
if not CHROMIUM.is_file():
    pytest.skip(f"{CHROMIUM} is missing (apt-get install chromium)", allow_module_level=True)
sync_api = pytest.importorskip("playwright.sync_api", reason="the playwright package is not installed")
Browser = sync_api.Browser
Page = sync_api.Page
expect = sync_api.expect

LAUNCH_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
ONTOLOGY = "How is the ontology induced from text?"
OFF_TOPIC = "What is the boiling point of tungsten in kelvin?"  # this library abstains on it
BROWSER_KEY = "browser-key-" + "x" * 24  # keys shorter than 32 characters are refused
WAIT_MS = 15_000
PIPELINE = ["route", "plan", "retrieve", "rerank", "grade", "reformulate", "synthesize", "verify"]


@pytest.fixture(scope="module")
def library(
    tmp_path_factory: pytest.TempPathFactory, small_library: Callable[..., Settings]
) -> Iterator[Library]:
    data = small_library("browser", **SMALL).data_dir  # its own: the page's questions write beside it
    # Module fixtures run before the per-test isolation: isolate the open here too.
    with pytest.MonkeyPatch.context() as mp:
        isolate(mp, tmp_path_factory.mktemp("browser"))
        settings = get_settings(data_dir=data, **SMALL)
    with Library(settings, llm=echo_llm()) as lib:
        yield lib


@pytest.fixture(scope="module")
def server(library: Library) -> Iterator[str]:
    with running_server(create_app(library.settings, library=library)) as url:
        yield url


@pytest.fixture(scope="module")
def keyed_server(library: Library) -> Iterator[str]:
    """The same library behind an API key."""
    settings = library.settings.model_copy(update={"api_keys": SecretStr(BROWSER_KEY)})
    with running_server(create_app(settings, library=library)) as url:
        yield url


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with sync_api.sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=LAUNCH_ARGS)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture
def artifacts(tmp_path: Path) -> Path:
    out = Path(os.environ.get("ARAG_TEST_ARTIFACTS") or tmp_path)
    out.mkdir(parents=True, exist_ok=True)
    return out


@dataclass
class Watch:
    """What a page did wrong: script errors, and requests that left the test server."""

    errors: list[str] = field(default_factory=list)
    foreign: list[str] = field(default_factory=list)

    def check(self) -> None:
        assert not self.errors, f"script errors on the page: {self.errors}"
        assert not self.foreign, f"the page fetched from outside the server: {self.foreign}"


def new_page(browser: Browser, width: int = 1280, height: int = 900) -> tuple[Page, Watch]:
    """A page in a fresh context (no stored key), watched."""
    context = browser.new_context(viewport={"width": width, "height": height})
    page = context.new_page()
    page.set_default_timeout(WAIT_MS)
    watch = Watch()
    page.on("pageerror", lambda exc: watch.errors.append(str(exc)))
    # The page is served under a Content-Security-Policy: anything it blocks is a broken page.
    page.on(
        "console",
        lambda msg: watch.errors.append(msg.text) if "Content Security Policy" in msg.text else None,
    )

    def on_request(req: sync_api.Request) -> None:
        if not req.url.startswith(("http://127.0.0.1:", "data:")):
            watch.foreign.append(req.url)

    page.on("request", on_request)
    return page, watch


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    p, watch = new_page(browser)
    yield p
    p.context.close()
    watch.check()


def stage(page: Page, name: str) -> sync_api.Locator:
    return page.locator(f'.stage[data-stage="{name}"]')


def ask(page: Page, question: str) -> None:
    page.get_by_label("Research question").fill(question)
    page.get_by_label("Research question").press("Enter")


def test_an_answer_lights_the_stages_in_order_and_its_citations_open_the_sources(
    page: Page, server: str, artifacts: Path
) -> None:
    page.goto(server)
    expect(page.get_by_role("tab", name="Ask")).to_have_attribute("aria-selected", "true")
    for name in PIPELINE:
        expect(stage(page, name)).to_have_attribute("data-state", "pending")
    page.get_by_role("button", name=ONTOLOGY).click()

    short = page.get_by_test_id("short-answer")
    expect(short).to_be_visible()
    expect(short).not_to_be_empty()
    expect(page.locator("#panel-ask")).to_have_attribute("data-status", "answered")
    order = page.evaluate("window.aragStageOrder")
    wanted = ["route", "plan", "retrieve", "grade", "synthesize", "verify"]
    assert [s for s in order if s in wanted] == wanted, order
    for name in PIPELINE:
        expect(stage(page, name)).to_have_attribute(
            "data-state", "skipped" if name == "reformulate" else "done"
        )
    expect(stage(page, "route").locator(".stage-ms")).to_have_text(re.compile(r"\d ms$"))
    expect(stage(page, "grade").locator(".stage-decision")).to_contain_text("sufficient")
    expect(stage(page, "reformulate")).to_have_class(re.compile(r"\bis-skipped\b"))

    cites = page.locator("#answer [data-cite]")
    expect(cites.first).to_be_visible()
    n = cites.first.get_attribute("data-cite")
    source = page.locator(f"#source-{n}")
    expect(source.locator(".passage")).to_be_hidden()  # collapsed until asked for
    cites.first.click()
    expect(page.locator(".source.highlight")).to_have_count(1)
    expect(source).to_have_class(re.compile(r"\bhighlight\b"))
    expect(source.locator(".passage")).to_be_visible()
    expect(source.locator(".passage")).not_to_be_empty()
    expect(source.locator("a.arxiv")).to_have_attribute(
        "href", re.compile(r"^https://arxiv\.org/abs/\d{4}\.\d{4,5}$")
    )
    expect(source.locator(".support")).to_contain_text("supported")
    expect(source).to_be_in_viewport()
    page.screenshot(path=artifacts / "browser-answer.png", full_page=True)


def test_an_off_topic_question_shows_the_abstention_with_the_closest_papers(
    page: Page, server: str, artifacts: Path
) -> None:
    page.goto(server)
    ask(page, OFF_TOPIC)  # typed, and Enter submits
    box = page.get_by_test_id("abstained")
    expect(box).to_be_visible()
    expect(box).to_contain_text("The library does not say")
    expect(box).to_contain_text("tungsten")  # what the passages lacked
    expect(box.locator(".closest-paper")).not_to_have_count(0)
    expect(page.get_by_test_id("short-answer")).to_have_count(0)
    # The grader found too little, so the one retry ran: reformulate is lit, nothing is skipped.
    expect(stage(page, "reformulate")).to_have_attribute("data-state", "done")
    assert page.evaluate("window.aragStageOrder").index("reformulate") > 0
    expect(page.locator("#panel-ask")).to_have_attribute("data-status", "abstained")
    page.screenshot(path=artifacts / "browser-abstained.png", full_page=True)


def test_errors_show_an_alert_with_the_fix(page: Page, server: str, artifacts: Path) -> None:
    # Restricted (by URL) to a paper the library does not hold: a 404 before the stream starts.
    page.goto(f"{server}/?papers=9999.99999")
    expect(page.locator("#scope")).to_contain_text("9999.99999")
    ask(page, ONTOLOGY)
    alert = page.get_by_test_id("error")
    expect(alert).to_be_visible()
    expect(alert).to_have_attribute("role", "alert")
    expect(alert).to_contain_text("unknown paper id")
    expect(alert.locator(".alert-fix")).to_contain_text("How to fix:")
    expect(alert).to_contain_text("HTTP 404")
    expect(page.locator("#panel-ask")).to_have_attribute("data-status", "error")
    page.screenshot(path=artifacts / "browser-error.png", full_page=True)

    # A question over the limit: the API's 422 message.
    page.get_by_role("button", name="Use the whole library").click()
    expect(page.locator("#scope")).to_be_hidden()
    ask(page, "x" * 2001)
    expect(alert).to_contain_text("at most 2,000")
    expect(page.locator("#question-count")).to_have_class(re.compile(r"\bover\b"))

    # The network fails: still an alert, not a silent page.
    page.route("**/query/stream", lambda route: route.abort())
    ask(page, ONTOLOGY)
    expect(alert).to_contain_text("could not reach")
    page.get_by_role("button", name="Dismiss the error").click()
    expect(alert).to_be_hidden()


def sse_body(*events: tuple[str, dict[str, object]]) -> str:
    return "".join(f"event: {kind}\ndata: {json.dumps(data)}\n\n" for kind, data in events)


def test_an_error_event_mid_stream_and_unsupported_citations(page: Page, server: str) -> None:
    # Canned streams (the page's parsing and states, not the agent): an answer whose citation the
    # verifier did not support, then a stream that fails after its first step.
    answer = httpx.post(f"{server}/query", json={"question": ONTOLOGY}, timeout=30).json()
    n = answer["citations"][0]["n"]
    answer["citations"][0].update(supported=False, support=0.12)
    router = {"node": "router", "ms": 0.2, "decision": "research (" + "very " * 40 + "long)", "counts": {}}
    streams = [
        sse_body(("start", {"request_id": "r1", "question": ONTOLOGY}), ("node", router), ("answer", answer)),
        sse_body(
            ("start", {"request_id": "r2", "question": ONTOLOGY}),
            ("node", router),
            (
                "error",
                {
                    "error": "the LLM server stopped",
                    "where": "synthesizer",
                    "fix": "restart it",
                    "status": 503,
                },
            ),
        ),
    ]
    page.route(
        "**/query/stream",
        lambda route: route.fulfill(status=200, content_type="text/event-stream", body=streams.pop(0)),
    )
    page.goto(server)
    ask(page, ONTOLOGY)
    cite = page.locator(f'#answer [data-cite="{n}"]').first
    expect(cite).to_have_class(re.compile(r"\bunsupported\b"))
    expect(page.locator(f"#source-{n} .support")).to_contain_text("not supported")
    route_stage = stage(page, "route")
    expect(route_stage).to_have_attribute("title", re.compile(r"very very .*long\)$"))  # the full decision
    expect(route_stage.locator(".stage-decision")).to_have_text(re.compile(r"…$"))  # shown cut short

    ask(page, ONTOLOGY)
    alert = page.get_by_test_id("error")
    expect(alert).to_contain_text("the LLM server stopped")
    expect(alert).to_contain_text("restart it")
    expect(alert).to_contain_text("r2")  # the request id, to report it
    expect(route_stage).to_have_attribute("data-state", "done")
    expect(stage(page, "plan")).to_have_attribute("data-state", "pending")  # never ran, never skipped


def test_small_talk_lights_only_route_and_synthesize(page: Page, server: str) -> None:
    page.goto(server)
    ask(page, "hello")
    expect(page.locator("#panel-ask")).to_have_attribute("data-status", "answered")
    expect(page.get_by_test_id("explanation")).to_contain_text("Hello")
    for name in PIPELINE:
        want = "done" if name in ("route", "synthesize") else "skipped"
        expect(stage(page, name)).to_have_attribute("data-state", want)
    assert page.evaluate("window.aragStageOrder") == ["route", "synthesize"]
    expect(page.locator("#sources")).to_contain_text("No passages")


def test_an_api_key_is_asked_for_then_sent(page: Page, keyed_server: str) -> None:
    page.goto(keyed_server)
    ask(page, ONTOLOGY)
    alert = page.get_by_test_id("error")
    expect(alert).to_contain_text("API key")
    expect(page.locator("#key-box")).to_have_attribute("open", "")
    page.get_by_label("API key (optional)").fill(BROWSER_KEY)
    ask(page, ONTOLOGY)
    expect(page.get_by_test_id("short-answer")).to_be_visible()
    expect(alert).to_be_hidden()
    page.reload()  # the key is kept in this tab, not in the browser's lasting storage
    expect(page.get_by_label("API key (optional)")).to_have_value(BROWSER_KEY)
    assert page.evaluate("window.localStorage.getItem('arag.apiKey')") is None
    page.locator("#key-box summary").click()
    page.get_by_label("Remember on this computer").check()  # now it is
    assert page.evaluate("window.localStorage.getItem('arag.apiKey')") == BROWSER_KEY
    page.get_by_label("Remember on this computer").uncheck()
    assert page.evaluate("window.localStorage.getItem('arag.apiKey')") is None
    assert page.evaluate("window.sessionStorage.getItem('arag.apiKey')") == BROWSER_KEY


def test_search_shows_scores_and_papers_lists_and_filters(page: Page, server: str, artifacts: Path) -> None:
    page.goto(server)
    page.get_by_role("tab", name="Ask").focus()
    page.keyboard.press("ArrowRight")  # tabs move with the arrow keys
    expect(page.get_by_role("tab", name="Search")).to_have_attribute("aria-selected", "true")
    expect(page.locator("#panel-search")).to_be_visible()
    page.get_by_label("Search the passages").fill("How are the networks assembled?")
    page.get_by_label("Passages", exact=True).select_option("5")
    page.get_by_label("Search the passages").press("Enter")
    hits = page.locator(".hit")
    expect(hits).to_have_count(5)
    first = hits.first
    expect(first).to_have_attribute("data-rank", "1")
    expect(first.locator('[data-score="score"]')).to_have_text(re.compile(r"^\d+\.\d{4}$"))
    expect(first.locator('[data-score="rerank"]')).to_have_text("–")  # no reranking model here
    for label in ("fused rank", "fused (RRF)", "found by"):
        expect(first.locator("dt", has_text=label)).to_have_count(1)
    expect(first.locator("dd").nth(4)).to_contain_text("#")  # e.g. "passages #2, BM25 #1"
    expect(page.locator(".hit.kept")).not_to_have_count(0)
    expect(page.locator(".kept-mark").first).to_contain_text("kept")
    page.screenshot(path=artifacts / "browser-search.png", full_page=True)

    page.get_by_role("tab", name="Papers").click()
    papers = page.locator(".paper")
    expect(papers).to_have_count(6)
    expect(page.locator("#papers-summary")).to_contain_text("of 6")
    expect(page.get_by_role("button", name="Next")).to_be_disabled()
    page.get_by_label("Filter by title").fill("ontology")
    expect(papers).to_have_count(1)
    paper = papers.first
    expect(paper).to_have_attribute("data-id", "1601.00901")
    expect(paper.get_by_role("link", name="arXiv")).to_have_attribute(
        "href", "https://arxiv.org/abs/1601.00901"
    )
    expect(paper).to_contain_text("2016")
    expect(paper).to_contain_text("chunks")
    paper.locator(".paper-title").click()
    expect(paper.locator(".abstract")).not_to_be_empty()
    page.screenshot(path=artifacts / "browser-papers.png", full_page=True)
    # From a paper to a question about it: the question is scoped to the paper.
    paper.get_by_role("button", name="Ask about this paper").click()
    expect(page.locator("#panel-ask")).to_be_visible()
    expect(page.locator("#scope")).to_contain_text("1601.00901")

    page.get_by_role("tab", name="How it works").click()
    about = page.locator("#panel-about")
    expect(about).to_contain_text("Dasigi")
    expect(about.locator('[data-model="llm"]')).to_have_text("scripted")


def test_phone_width_has_no_horizontal_scroll(browser: Browser, server: str, artifacts: Path) -> None:
    page, watch = new_page(browser, 375, 740)
    try:
        page.goto(server)
        page.get_by_role("button", name=ONTOLOGY).click()
        expect(page.get_by_test_id("short-answer")).to_be_visible()
        page.locator("#answer [data-cite]").first.click()
        expect(page.locator(".source.highlight .passage")).to_be_visible()
        widths = page.evaluate("[document.documentElement.scrollWidth, document.documentElement.clientWidth]")
        assert widths[0] <= widths[1], f"the page scrolls sideways at 375 px: {widths}"
        page.screenshot(path=artifacts / "browser-phone.png", full_page=True)
    finally:
        page.context.close()
    watch.check()


def test_the_map_draws_the_papers_and_a_click_opens_one(page: Page, server: str, artifacts: Path) -> None:
    page.goto(server)
    page.get_by_role("tab", name="Map").click()
    dots = page.locator("#map-svg .map-dot")
    expect(dots).to_have_count(6)
    expect(page.locator("#map-svg .map-label")).to_have_count(2)  # k = 2 topics, labelled
    expect(page.locator("#map-summary")).to_contain_text("6 papers, 2 topics")
    # Every dot lies inside the drawing, and they do not all sit on one spot.
    boxes = [dots.nth(i).bounding_box() for i in range(6)]
    svg_box = page.locator("#map-svg").bounding_box()
    assert svg_box is not None and all(b is not None for b in boxes)
    for b in boxes:
        assert b is not None
        assert svg_box["x"] <= b["x"] <= svg_box["x"] + svg_box["width"]
        assert svg_box["y"] <= b["y"] <= svg_box["y"] + svg_box["height"]
    assert len({(round(b["x"]), round(b["y"])) for b in boxes if b}) > 3
    # A dot no label covers (labels sit at the topics' centres), hovered then clicked as a user would.
    pid = page.evaluate(
        """() => [...document.querySelectorAll('#map-svg .map-dot')].find((d) => {
             const r = d.getBoundingClientRect();
             return document.elementFromPoint(r.x + r.width / 2, r.y + r.height / 2) === d;
           })?.dataset.id"""
    )
    assert pid, "every dot is covered by a label"
    dot = page.locator(f'#map-svg .map-dot[data-id="{pid}"]')
    title = httpx.get(f"{server}/papers/{pid}").json()["title"]
    dot.hover()
    expect(page.locator("#map-tip")).to_contain_text(title)
    dot.click()
    pane = page.locator("#map-paper")
    expect(pane.locator(".map-paper-title")).to_have_text(title)
    expect(pane.locator(".abstract")).not_to_be_empty()
    expect(pane.get_by_role("link", name="arXiv")).to_have_attribute("href", f"https://arxiv.org/abs/{pid}")
    expect(dot).to_have_class(re.compile(r"\bselected\b"))
    page.screenshot(path=artifacts / "browser-map.png", full_page=True)
    # The paper's research tools, from its view on the map.
    pane.get_by_role("button", name="Related work").click()
    expect(pane.locator(".related-paper")).to_have_count(5)
    expect(pane.locator(".related-paper").first.get_by_role("link", name="arXiv")).to_be_visible()
    pane.get_by_role("button", name="Summarise").click()
    expect(pane.locator(".summary-part")).to_have_count(5)
    expect(pane.locator(".summary .cite-badge").first).to_be_visible()
    page.screenshot(path=artifacts / "browser-map-summary.png", full_page=True)
    # A topic asks about itself over the whole library.
    page.locator("#map-topics .linklike").first.click()
    expect(page.locator("#panel-ask")).to_be_visible()
    expect(page.get_by_label("Research question")).to_have_value(
        re.compile(r"^What do the library's papers on ")
    )
    expect(stage(page, "route")).to_have_attribute("data-state", "done")
