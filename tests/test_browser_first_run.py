"""The page on a first run, in a real browser: the library builds in the server's background, the page
shows its progress live, answers say how much of the library they searched, and the progress panel
says when the library is complete (hash embedder, scripted LLM, 80 QASPER papers)."""

from __future__ import annotations

import re
from pathlib import Path

from arag.service import create_app
from arag.service.background import open_serving_library
from arag.settings import get_settings
from service_util import SMALL, echo_llm, running_server

# The browser and the artifacts folder are test_browser's fixtures (one launch recipe for both modules).
from test_browser import Browser, artifacts, browser, expect, new_page  # noqa: F401

PAPERS = 80  # enough that the build spans several of the page's 2 s polls


def test_the_page_shows_the_build_progress_and_how_much_each_answer_searched(
    browser: Browser,  # noqa: F811 (the imported fixture)
    tmp_path: Path,
    qasper_path: Path,
    artifacts: Path,  # noqa: F811 (imported fixtures)
) -> None:
    settings = get_settings(
        data_dir=tmp_path / "data", corpus={"max_papers": PAPERS}, store={"papers_per_batch": 2}, **SMALL
    )
    lib = open_serving_library(settings, llm=echo_llm())
    try:
        with running_server(create_app(settings, library=lib, background=True)) as url:
            page, watch = new_page(browser)
            page.set_default_timeout(120_000)
            page.goto(url)
            panel = page.get_by_test_id("build-status")
            expect(panel).to_be_visible()
            expect(page.locator("#build-title")).to_contain_text(
                re.compile(r"Preparing the library build|Building the library")
            )
            expect(page.locator("#build-title")).to_contain_text(
                re.compile(rf"Building the library: [1-9]\d* of {PAPERS} papers indexed")
            )
            expect(page.get_by_test_id("build-figures")).to_contain_text(re.compile(r"\d+ chunks"))
            expect(page.get_by_test_id("build-figures")).to_contain_text("chunks/s")
            assert float(page.locator("#build-bar").get_attribute("value") or 0) > 0
            page.screenshot(path=artifacts / "browser-first-run-building.png", full_page=True)

            page.get_by_label("Research question").fill("How is the model trained?")
            page.get_by_label("Research question").press("Enter")
            status = page.locator("#panel-ask")
            expect(status).to_have_attribute("data-status", re.compile("answered|abstained"))
            meta = page.locator("#results .meta")
            expect(meta.first).to_contain_text(
                re.compile(rf"searched (all {PAPERS} papers|\d+ of {PAPERS} papers \(the library is still)")
            )

            expect(page.locator("#build-title")).to_contain_text(
                f"The library is complete: {PAPERS} papers", timeout=180_000
            )
            expect(page.locator("#build-bar")).to_be_hidden()
            page.screenshot(path=artifacts / "browser-first-run-complete.png", full_page=True)
            page.context.close()
            watch.check()
    finally:
        lib.close()
