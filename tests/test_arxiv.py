"""arXiv selection and fetching against a local fake arXiv (recorded Atom responses, tiny real PDFs).

No test touches the network: the API and PDF server is an http.server on 127.0.0.1.
"""

from __future__ import annotations

import json
import threading
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pymupdf
import pytest
import typer
from typer.testing import CliRunner

from arag.cli.corpus import corpus_app
from arag.corpus.arxiv import MIN_PDF_BYTES, ArxivClient, fetch, is_complete_pdf, parse_feed, select
from arag.corpus.manifest import (
    Gates,
    Manifest,
    ManifestEntry,
    SelectionSpec,
    load_spec,
    read_manifest,
    split_version,
    write_manifest,
)
from arag.errors import CorpusError, InputError, NetworkError
from arag.settings import ArxivSettings

FIXTURES = Path(__file__).parent / "fixtures" / "arxiv"
ATOM = "http://www.w3.org/2005/Atom"
OPENSEARCH = "http://a9.com/-/spec/opensearch/1.1/"
ARXIV = "http://arxiv.org/schemas/atom"
for _prefix, _uri in (("", ATOM), ("opensearch", OPENSEARCH), ("arxiv", ARXIV)):
    ET.register_namespace(_prefix, _uri)

QUERIES = {
    'abs:"retrieval-augmented generation"': "query_rag.xml",
    'abs:"dense retrieval"': "query_dense.xml",
}
PDF_IDS = ["1706.03762", "1810.04805", "2005.11401"]


def make_pdf(title: str) -> bytes:
    """A real two-page PDF with enough text to pass as a paper."""
    doc = pymupdf.open()
    for page_no in range(2):
        page = doc.new_page()
        text = (
            f"{title}\n\nPage {page_no + 1}. " + "Attention layers relate every token to every other. " * 30
        )
        page.insert_textbox(pymupdf.Rect(50, 50, 550, 800), text, fontsize=8)
    data = doc.tobytes()
    doc.close()
    assert len(data) > MIN_PDF_BYTES
    return data


class FakeArxiv:
    """A tiny arXiv: /api/query serves fixture entries by search_query or id_list, /pdf/<id> serves PDFs."""

    def __init__(self) -> None:
        self.pdfs = {pid: make_pdf(f"Paper {pid}") for pid in PDF_IDS}
        self.hits: list[tuple[float, str]] = []
        self.fail_next = 0  # answer this many coming requests with HTTP 503
        self.empty_next = 0  # answer this many API requests with a spuriously empty page
        self.drop_once: set[str] = set()  # PDFs whose next download breaks off mid-body
        self.range_requests = 0
        self.lock = threading.Lock()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                with fake.lock:
                    fake.hits.append((time.monotonic(), self.path))
                    failing = fake.fail_next > 0
                    fake.fail_next -= int(failing)
                if failing:
                    self._send(503, b"busy", "text/plain")
                elif self.path.startswith("/api/query"):
                    self._api()
                elif self.path.startswith("/pdf/"):
                    self._pdf(self.path.removeprefix("/pdf/"))
                else:
                    self._send(404, b"not found", "text/plain")

            def _send(
                self, status: int, body: bytes, ctype: str, headers: dict[str, str] | None = None
            ) -> None:
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(body)

            def _api(self) -> None:
                qs = {k: v[0] for k, v in parse_qs(urlsplit(self.path).query).items()}
                status, body = fake.feed(qs)
                self._send(status, body, "application/atom+xml; charset=utf-8")

            def _pdf(self, versioned: str) -> None:
                pid = split_version(versioned)[0]
                data = fake.pdfs.get(pid)
                if data is None:
                    self._send(404, b"no such paper", "text/plain")
                    return
                ctype = "application/pdf" if data.startswith(b"%PDF") else "text/html"
                rng = self.headers.get("Range")
                if rng:
                    fake.range_requests += 1
                    start = int(rng.removeprefix("bytes=").split("-")[0])
                    content_range = f"bytes {start}-{len(data) - 1}/{len(data)}"
                    self._send(206, data[start:], ctype, {"Content-Range": content_range})
                elif pid in fake.drop_once:
                    fake.drop_once.discard(pid)
                    # Promise the whole file, send half, hang up.
                    self.send_response(200)
                    self.send_header("Content-Type", ctype)
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data[: len(data) // 2])
                    self.wfile.flush()
                    self.close_connection = True
                else:
                    self._send(200, data, ctype)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()
        base = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.api_url = f"{base}/api/query"
        self.pdf_url = base + "/pdf/{id}"

    def feed(self, qs: dict[str, str]) -> tuple[int, bytes]:
        if qs.get("search_query") == "trigger:error":
            return 400, (FIXTURES / "error.xml").read_bytes()
        start, count = int(qs.get("start", "0")), int(qs.get("max_results", "10"))
        if "id_list" in qs:
            root = ET.parse(FIXTURES / "id_list.xml").getroot()
            by_id = {split_version(_entry_id(e))[0]: e for e in root.findall(f"{{{ATOM}}}entry")}
            wanted = [split_version(i)[0] for i in qs["id_list"].split(",")]
            entries, total = [by_id[i] for i in wanted if i in by_id], None
        else:
            name = QUERIES.get(qs.get("search_query", ""))
            root = ET.parse(FIXTURES / (name or "query_rag.xml")).getroot()
            entries = root.findall(f"{{{ATOM}}}entry") if name else []
            total = len(entries)
            entries = entries[start : start + count]
        with self.lock:
            if self.empty_next > 0:
                self.empty_next -= 1
                entries = []
        for e in root.findall(f"{{{ATOM}}}entry"):
            root.remove(e)
        root.extend(entries)
        root.find(f"{{{OPENSEARCH}}}totalResults").text = str(len(entries) if total is None else total)  # type: ignore[union-attr]
        root.find(f"{{{OPENSEARCH}}}startIndex").text = str(start)  # type: ignore[union-attr]
        return 200, ET.tostring(root, encoding="utf-8", xml_declaration=True)

    @property
    def count(self) -> int:
        return len(self.hits)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _entry_id(entry: ET.Element) -> str:
    return (entry.findtext(f"{{{ATOM}}}id") or "").rsplit("/abs/", 1)[-1]


@pytest.fixture
def fake() -> Iterator[FakeArxiv]:
    server = FakeArxiv()
    yield server
    server.close()


def settings_for(fake: FakeArxiv, **kw: float) -> ArxivSettings:
    values: dict[str, float] = {"delay_s": 0.0, "retries": 2, "backoff_s": 0.01, "timeout_s": 5.0}
    values.update(kw)
    return ArxivSettings(api_url=fake.api_url, pdf_url=fake.pdf_url, **values)  # type: ignore[arg-type]


SPEC = SelectionSpec.model_validate(
    {
        "name": "test",
        "papers": [
            "1706.03762",
            {"id": "1810.04805v2"},
            "1512.03385",  # cs.CV: outside the allow-list, kept because hand-picked
            "2005.11401",  # found again by the rag search: takes that topic
            "2104.08663",  # excluded even though hand-picked
            "2401.99999",  # not on (fake) arXiv
            {"id": "1706.03762v5", "canonical": False},  # same paper again: the first pick wins
        ],
        "topics": {
            "rag": {"queries": ['abs:"retrieval-augmented generation"'], "max_results": 10},
            "dense": ['abs:"dense retrieval"', 'abs:"nothing matches this"'],
        },
        "gates": {
            "categories": ["cs.CL", "cs.LG", "cs.AI", "stat.ML", "cs.IR"],
            "title_block": ["SURVEY", "re:^proceedings of"],
            "exclude": ["2104.08663v4"],
        },
    }
)


# -- parsing and ids ------------------------------------------------------------------------------


def test_parse_feed_reads_ids_versions_categories_and_dates() -> None:
    page = parse_feed((FIXTURES / "id_list.xml").read_bytes())
    assert page.total_results == 5
    assert [(e.id, e.version) for e in page.entries] == [
        ("1706.03762", "v7"),
        ("1810.04805", "v2"),
        ("1512.03385", "v1"),
        ("2005.11401", "v4"),
        ("2104.08663", "v4"),
    ]
    bert = page.entries[1]
    assert bert.title == "BERT: Pre-training of Deep Bidirectional Transformers for Language Understanding"
    assert bert.authors == ["Jacob Devlin", "Ming-Wei Chang", "Kenton Lee", "Kristina Toutanova"]
    assert (bert.published, bert.updated) == ("2018-10-11", "2019-05-24")
    beir = page.entries[4]
    assert beir.primary_category == "cs.IR"
    assert beir.categories == ["cs.IR", "cs.AI", "cs.CL"]
    assert page.entries[0].abstract.startswith(
        "The dominant sequence transduction models are based on complex"
    )
    assert "\n" not in page.entries[0].abstract
    assert page.entries[3].authors[6] == "Heinrich Küttler"


def test_parse_feed_error_entry_and_garbage() -> None:
    with pytest.raises(InputError, match="incorrect id format for 1706.0376"):
        parse_feed((FIXTURES / "error.xml").read_bytes())
    with pytest.raises(NetworkError, match="not Atom XML"):
        parse_feed(b"<html><body>Rate limited")


def test_split_version_new_and_old_ids() -> None:
    assert split_version("1706.03762v5") == ("1706.03762", "v5")
    assert split_version("2401.00001") == ("2401.00001", None)
    assert split_version("0704.0001v1") == ("0704.0001", "v1")
    assert split_version("hep-th/9901001v2") == ("hep-th/9901001", "v2")
    assert split_version("math.GT/0309136") == ("math.GT/0309136", None)
    with pytest.raises(InputError, match="not an arXiv id"):
        split_version("1706.0376")
    with pytest.raises(InputError, match="not an arXiv id"):
        split_version("0704.00001")
    entry = ManifestEntry(id="hep-th/9901001", version="v2", title="t")
    assert (entry.versioned_id, entry.filename) == ("hep-th/9901001v2", "hep-th_9901001.pdf")


def test_gates_title_block_and_category_allow_list() -> None:
    gates = Gates(categories=["cs.CL"], title_block=["survey", "re:^proceedings of", r"re:\bshared task\b"])
    assert gates.title_blocked("A SURVEY of Retrieval") == "survey"
    assert gates.title_blocked("Proceedings of the Workshop on X") == "re:^proceedings of"
    assert gates.title_blocked("The WMT Shared Task on Y") == r"re:\bshared task\b"
    assert gates.title_blocked("Workshop proceedings, sort of") is None
    assert gates.title_blocked("Attention Is All You Need") is None
    assert gates.category_allowed(["cs.CV", "cs.CL"])
    assert not gates.category_allowed(["cs.CV"])
    assert Gates().category_allowed(["q-bio.NC"])


def test_load_spec_toml_json_and_errors(tmp_path: Path) -> None:
    toml = tmp_path / "spec.toml"
    toml.write_text(
        'papers = ["1706.03762", {id = "2005.11401v4", canonical = false}]\n'
        '[topics]\nrag = [\'abs:"rag"\']\n[gates]\nexclude = ["2104.08663v4"]\n'
    )
    spec = load_spec(toml)
    assert [(p.id, p.canonical) for p in spec.papers] == [("1706.03762", True), ("2005.11401v4", False)]
    assert spec.topics["rag"].queries == ['abs:"rag"'] and spec.topics["rag"].max_results == 50
    assert spec.gates.exclude == ["2104.08663"]
    as_json = tmp_path / "spec.json"
    as_json.write_text(json.dumps(spec.model_dump()))
    assert load_spec(as_json).spec_hash() == spec.spec_hash()

    bad = tmp_path / "bad.toml"
    bad.write_text('papers = ["1706.0376"]\n')
    with pytest.raises(InputError, match="not an arXiv id") as err:
        load_spec(bad)
    assert str(bad) in str(err.value)
    bad.write_text('[gates]\ntitle_block = ["re:(unclosed"]\n')
    with pytest.raises(InputError, match="bad regular expression"):
        load_spec(bad)
    with pytest.raises(InputError, match="does not exist"):
        load_spec(tmp_path / "missing.toml")
    example = Path(__file__).parents[1] / "src" / "arag" / "corpus" / "example_selection.toml"
    assert len(load_spec(example).papers) >= 10


def test_manifest_round_trip_and_errors(tmp_path: Path) -> None:
    manifest = Manifest(spec_hash="abc", entries=[ManifestEntry(id="1706.03762", version="v7", title="T")])
    path = tmp_path / "sub" / "manifest.json"
    write_manifest(manifest, path)
    assert read_manifest(path) == manifest
    assert [p.name for p in path.parent.iterdir()] == ["manifest.json"]  # no temp file left behind
    path.write_text("{not json")
    with pytest.raises(CorpusError, match="not valid"):
        read_manifest(path)
    with pytest.raises(CorpusError, match="arag corpus select"):
        read_manifest(tmp_path / "none.json")


# -- selection ------------------------------------------------------------------------------------


def test_select_applies_gates_dedupes_and_counts(fake: FakeArxiv, tmp_path: Path) -> None:
    with ArxivClient(settings_for(fake), tmp_path) as client:
        manifest = select(SPEC, client)
    got = {e.id: e for e in manifest.entries}
    assert list(got) == [
        "1706.03762",
        "1810.04805",
        "1512.03385",
        "2005.11401",
        "2310.11511",
        "2002.08909",
        "2004.04906",
        "2112.09118",
        "2007.00808",
    ]
    # Hand-picked: canonical, the first pick of a paper wins, a given version is kept.
    assert got["1706.03762"].canonical and got["1706.03762"].version == "v7"
    assert got["1810.04805"].version == "v2" and got["1810.04805"].topic == "hand-picked"
    assert got["1512.03385"].canonical  # bypassed the category gate
    assert got["2005.11401"].topic == "rag" and got["2005.11401"].canonical
    # Search results: not canonical; Self-RAG appears in both topics and keeps the first.
    assert not got["2310.11511"].canonical and got["2310.11511"].topic == "rag"
    assert got["2004.04906"].topic == "dense"
    c = manifest.counts
    assert c.removed_exclude == ["2104.08663"]
    assert c.removed_category == ["2302.04858"]
    assert c.removed_title == ["2312.10997", "2211.05562"]
    assert c.missing == ["2401.99999"]
    assert c.duplicates == 2  # RAG (hand-picked) and Self-RAG (earlier topic)
    assert c.per_topic_found == {"hand-picked": 6, "rag": 5, "dense": 6}
    assert c.per_topic_kept == {"hand-picked": 3, "rag": 3, "dense": 3}
    assert manifest.spec_hash == SPEC.spec_hash()


def test_select_is_cached_so_changing_gates_costs_no_requests(fake: FakeArxiv, tmp_path: Path) -> None:
    with ArxivClient(settings_for(fake), tmp_path) as client:
        first = select(SPEC, client)
    assert fake.count == 4  # one id_list request, three searches
    assert len(list((tmp_path / "arxiv").glob("*.xml"))) == 4
    looser = SPEC.model_copy(update={"gates": Gates()})
    with ArxivClient(settings_for(fake), tmp_path) as client:
        second = select(looser, client)
        assert client.requests == 0
    assert fake.count == 4
    assert len(second.entries) == len(first.entries) + 4  # exclude, category and title gates now off


def test_search_pages_through_results(fake: FakeArxiv, tmp_path: Path) -> None:
    with ArxivClient(settings_for(fake), tmp_path, page_size=2) as client:
        entries = client.search('abs:"dense retrieval"', max_results=5)
    assert [e.id for e in entries] == ["2004.04906", "2112.09118", "2104.08663", "2310.11511", "2007.00808"]
    starts = [parse_qs(urlsplit(p).query)["start"][0] for _, p in fake.hits]
    assert starts == ["0", "2", "4"]


def test_by_ids_chunks_requests(fake: FakeArxiv, tmp_path: Path) -> None:
    ids = ["1706.03762"] + [f"2401.{n:05d}" for n in range(60)]
    with ArxivClient(settings_for(fake), tmp_path) as client:
        found = client.by_ids(ids)
    assert [e.id for e in found] == ["1706.03762"]
    sizes = [len(parse_qs(urlsplit(p).query)["id_list"][0].split(",")) for _, p in fake.hits]
    assert sizes == [50, 11]


def test_api_error_is_an_input_error(fake: FakeArxiv, tmp_path: Path) -> None:
    with ArxivClient(settings_for(fake), tmp_path) as client, pytest.raises(InputError, match="incorrect id"):
        client.query("trigger:error", 0, 10)
    assert fake.count == 1  # a rejected query is not retried
    assert not list((tmp_path / "arxiv").glob("*.xml"))  # nor cached


def test_politeness_delay_between_uncached_requests(fake: FakeArxiv, tmp_path: Path) -> None:
    with ArxivClient(settings_for(fake, delay_s=0.2), tmp_path) as client:
        client.query('abs:"dense retrieval"', 0, 3)
        client.query('abs:"retrieval-augmented generation"', 0, 3)
        t0 = time.monotonic()
        client.query('abs:"dense retrieval"', 0, 3)  # cached: no request, no wait
        assert time.monotonic() - t0 < 0.1
    assert fake.count == 2
    assert fake.hits[1][0] - fake.hits[0][0] >= 0.2


def test_retries_with_backoff_then_succeeds(fake: FakeArxiv, tmp_path: Path) -> None:
    fake.fail_next = 2
    with ArxivClient(settings_for(fake, retries=2, backoff_s=0.05), tmp_path) as client:
        entries = client.query('abs:"dense retrieval"', 0, 2)
    assert len(entries) == 2
    assert fake.count == 3
    gaps = [b[0] - a[0] for a, b in zip(fake.hits, fake.hits[1:], strict=False)]
    assert gaps[0] >= 0.05 and gaps[1] >= 0.1  # exponential: backoff, then twice that


def test_spurious_empty_page_is_retried(fake: FakeArxiv, tmp_path: Path) -> None:
    fake.empty_next = 1
    with ArxivClient(settings_for(fake), tmp_path) as client:
        assert len(client.query('abs:"dense retrieval"', 0, 3)) == 3
    assert fake.count == 2


def test_persistent_failure_raises_network_error_with_fix(fake: FakeArxiv, tmp_path: Path) -> None:
    fake.fail_next = 100
    with ArxivClient(settings_for(fake, retries=2), tmp_path) as client, pytest.raises(NetworkError) as err:
        client.query('abs:"dense retrieval"', 0, 2)
    assert fake.count == 3
    msg = str(err.value)
    assert f"cannot reach arXiv at {fake.api_url}" in msg and "after 3 tries" in msg and "HTTP 503" in msg
    assert "cached manifest" in msg and err.value.exit_code == 7


def test_unreachable_server_raises_network_error(tmp_path: Path) -> None:
    closed = ThreadingHTTPServer(("127.0.0.1", 0), BaseHTTPRequestHandler)
    port = closed.server_address[1]
    closed.server_close()
    settings = ArxivSettings(
        api_url=f"http://127.0.0.1:{port}/api/query", delay_s=0, retries=1, backoff_s=0.01
    )
    with ArxivClient(settings, tmp_path) as client, pytest.raises(NetworkError, match="after 2 tries"):
        client.by_ids(["1706.03762"])


# -- fetching -------------------------------------------------------------------------------------


def _manifest(*ids: str) -> Manifest:
    return Manifest(spec_hash="x", entries=[ManifestEntry(id=i, version="v1", title=i) for i in ids])


def test_fetch_downloads_all_then_nothing(fake: FakeArxiv, tmp_path: Path) -> None:
    dest = tmp_path / "pdfs"
    with ArxivClient(settings_for(fake), tmp_path) as client:
        report = fetch(_manifest(*PDF_IDS), dest, client, show_progress=False)
        assert report.downloaded == PDF_IDS and not report.failed and not report.skipped
        assert report.bytes_downloaded == sum(len(b) for b in fake.pdfs.values())
        for pid in PDF_IDS:
            assert (dest / f"{pid}.pdf").read_bytes() == fake.pdfs[pid]
        assert [p for _, p in fake.hits] == [f"/pdf/{pid}v1" for pid in PDF_IDS]
        again = fetch(_manifest(*PDF_IDS), dest, client, show_progress=False)
    assert again.skipped == PDF_IDS and not again.downloaded
    assert fake.count == 3
    assert sorted(p.name for p in dest.iterdir()) == sorted(f"{pid}.pdf" for pid in PDF_IDS)


def test_interrupted_download_leaves_no_final_file_and_resumes(fake: FakeArxiv, tmp_path: Path) -> None:
    dest = tmp_path / "pdfs"
    fake.drop_once.add("1810.04805")
    with ArxivClient(settings_for(fake, retries=0), tmp_path) as client:
        report = fetch(_manifest(*PDF_IDS), dest, client, show_progress=False)
    assert list(report.failed) == ["1810.04805"] and "after 1 try " in report.failed["1810.04805"]
    assert report.downloaded == ["1706.03762", "2005.11401"]
    assert not (dest / "1810.04805.pdf").exists()
    part = dest / "1810.04805.pdf.part"
    assert 0 < part.stat().st_size < len(fake.pdfs["1810.04805"])

    with ArxivClient(settings_for(fake, retries=0), tmp_path) as client:
        rerun = fetch(_manifest(*PDF_IDS), dest, client, show_progress=False)
    assert rerun.downloaded == ["1810.04805"] and rerun.skipped == ["1706.03762", "2005.11401"]
    assert fake.range_requests == 1  # resumed from the .part, not restarted
    assert (dest / "1810.04805.pdf").read_bytes() == fake.pdfs["1810.04805"]
    assert not part.exists()


def test_dropped_download_is_retried_within_one_fetch(fake: FakeArxiv, tmp_path: Path) -> None:
    fake.drop_once.add("1706.03762")
    with ArxivClient(settings_for(fake, retries=1), tmp_path) as client:
        report = fetch(_manifest("1706.03762"), tmp_path / "pdfs", client, show_progress=False)
    assert report.downloaded == ["1706.03762"] and fake.count == 2
    assert is_complete_pdf(tmp_path / "pdfs" / "1706.03762.pdf")


def test_non_pdf_or_missing_paper_is_reported_without_leftovers(fake: FakeArxiv, tmp_path: Path) -> None:
    fake.pdfs["2005.11401"] = b"<html>" + b"x" * 4000 + b"</html>"
    dest = tmp_path / "pdfs"
    with ArxivClient(settings_for(fake), tmp_path) as client:
        report = fetch(_manifest("2005.11401", "2401.00001"), dest, client, show_progress=False)
    assert "not a PDF" in report.failed["2005.11401"]
    assert "HTTP 404" in report.failed["2401.00001"]
    assert list(dest.iterdir()) == []


def test_is_complete_pdf(tmp_path: Path) -> None:
    pdf = make_pdf("x")
    path = tmp_path / "a.pdf"
    path.write_bytes(pdf)
    assert is_complete_pdf(path)
    path.write_bytes(pdf[: len(pdf) // 2])
    assert not is_complete_pdf(path)
    path.write_bytes(b"%PDF-1.7\n%%EOF\n")
    assert not is_complete_pdf(path)
    assert not is_complete_pdf(tmp_path / "missing.pdf")


# -- CLI ------------------------------------------------------------------------------------------


@pytest.fixture
def cli_env(fake: FakeArxiv, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.delenv("ARAG_CONFIG", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("ARAG_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("ARAG_ARXIV__API_URL", fake.api_url)
    monkeypatch.setenv("ARAG_ARXIV__PDF_URL", fake.pdf_url)
    monkeypatch.setenv("ARAG_ARXIV__DELAY_S", "0")
    monkeypatch.setenv("ARAG_ARXIV__RETRIES", "1")
    monkeypatch.setenv("ARAG_ARXIV__BACKOFF_S", "0.01")
    return tmp_path / "data"


def _app() -> typer.Typer:
    app = typer.Typer()
    app.add_typer(corpus_app, name="corpus")
    return app


def test_cli_select_then_fetch(fake: FakeArxiv, cli_env: Path, tmp_path: Path) -> None:
    spec = tmp_path / "spec.toml"
    spec.write_text(
        'name = "cli"\npapers = ["1706.03762", "1810.04805", "2005.11401"]\n'
        "[topics.rag]\nqueries = ['abs:\"retrieval-augmented generation\"']\nmax_results = 5\n"
        '[gates]\ncategories = ["cs.CL"]\ntitle_block = ["survey"]\n'
    )
    out = tmp_path / "manifest.json"
    runner = CliRunner()
    result = runner.invoke(_app(), ["corpus", "select", str(spec), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "rag" in result.output and "category allow-list" in result.output
    assert "wrote 5 papers" in result.output and "2 arXiv requests" in result.output
    assert read_manifest(out).ids() == ["1706.03762", "1810.04805", "2005.11401", "2310.11511", "2002.08909"]
    assert len(list((cli_env / "cache" / "arxiv").glob("*.xml"))) == 2

    again = runner.invoke(_app(), ["corpus", "select", str(spec), "--out", str(out)])
    assert again.exit_code == 0 and "0 arXiv requests" in again.output
    assert fake.count == 2

    # Only three of the five papers have PDFs on the fake server.
    result = runner.invoke(_app(), ["corpus", "fetch", str(out)])
    assert result.exit_code == 7
    assert "downloaded 3" in result.output and "failed 2" in result.output
    assert "to resume them" in result.output
    assert f"arag library add {cli_env / 'pdfs'}" in result.output
    assert sorted(p.name for p in (cli_env / "pdfs").iterdir()) == sorted(f"{i}.pdf" for i in PDF_IDS)

    fake.pdfs.update({"2310.11511": make_pdf("Self-RAG"), "2002.08909": make_pdf("REALM")})
    dest = tmp_path / "elsewhere"
    result = runner.invoke(_app(), ["corpus", "fetch", str(out), "--dest", str(dest)])
    assert result.exit_code == 0, result.output
    assert "downloaded 5" in result.output and f"arag library add {dest}" in result.output


def test_cli_errors_exit_with_their_codes(fake: FakeArxiv, cli_env: Path, tmp_path: Path) -> None:
    runner = CliRunner()
    result = runner.invoke(_app(), ["corpus", "select", str(tmp_path / "nope.toml")])
    assert result.exit_code == InputError.exit_code and "does not exist" in result.output
    result = runner.invoke(_app(), ["corpus", "fetch", str(tmp_path / "nope.json")])
    assert result.exit_code == CorpusError.exit_code and "arag corpus select" in result.output

    spec = tmp_path / "spec.toml"
    spec.write_text('papers = ["1706.03762"]\n')
    fake.fail_next = 100
    result = runner.invoke(_app(), ["corpus", "select", str(spec), "--out", str(tmp_path / "m.json")])
    assert result.exit_code == NetworkError.exit_code
    assert "cannot reach arXiv" in result.output and "cached manifest" in result.output
    assert not (tmp_path / "m.json").exists()
