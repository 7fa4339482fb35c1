"""The arXiv API client, selection (spec -> manifest) and resumable PDF fetching.

Every API response is cached on disk by request URL, so re-running a selection with different
gates costs no requests. Network requests are spaced by ``delay_s`` (arXiv asks for one request
every three seconds) and retried with exponential backoff on transient failures.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import httpx
from pydantic import BaseModel, Field
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from arag.corpus.manifest import (
    HAND_PICKED_TOPIC,
    GateCounts,
    HandPicked,
    Manifest,
    ManifestEntry,
    SelectionSpec,
    atomic_write_bytes,
    base_id,
    split_version,
)
from arag.errors import AragError, InputError, NetworkError
from arag.http_retry import backoff_delay, retry_after_s
from arag.settings import ArxivSettings
from arag.version import __version__

log = logging.getLogger(__name__)

NS = {
    "atom": "http://www.w3.org/2005/Atom",
    "opensearch": "http://a9.com/-/spec/opensearch/1.1/",
    "arxiv": "http://arxiv.org/schemas/atom",
}
IDS_PER_REQUEST = 50
# Smaller files are error pages or truncated downloads, never a paper.
MIN_PDF_BYTES = 1024
# Honour a server's Retry-After, but never sleep longer than this per try.
MAX_RETRY_AFTER_S = 60.0

T = TypeVar("T")


@dataclass
class ArxivPage:
    """One page of API results."""

    entries: list[ManifestEntry]
    total_results: int
    start_index: int = 0


class _Retryable(Exception):
    """A transient failure (HTTP 429/5xx, garbled or spuriously empty response): try again."""

    def __init__(self, reason: str, retry_after: float | None = None) -> None:
        super().__init__(reason)
        self.retry_after = retry_after


def _text(el: ET.Element, path: str) -> str:
    return " ".join((el.findtext(path, default="", namespaces=NS) or "").split())


def _parse_entry(el: ET.Element, where: str) -> ManifestEntry | None:
    raw_id = _text(el, "atom:id")
    if "/api/errors" in raw_id:
        raise InputError(
            f"arXiv rejected the request: {_text(el, 'atom:summary') or raw_id}",
            where=where,
            fix="check the ids and the search_query syntax in the selection spec",
        )
    try:
        bid, version = split_version(raw_id.rsplit("/abs/", 1)[-1])
    except InputError:
        log.warning("skipping arXiv entry with unreadable id %r", raw_id)
        return None
    title = _text(el, "atom:title")
    if not title:  # arXiv answers an unknown id with an empty entry
        return None
    primary_el = el.find("arxiv:primary_category", NS)
    primary = primary_el.get("term", "") if primary_el is not None else ""
    categories = [primary] if primary else []
    for cat in el.findall("atom:category", NS):
        term = cat.get("term", "")
        if term and term not in categories:
            categories.append(term)
    return ManifestEntry(
        id=bid,
        version=version,
        title=title,
        authors=[_text(a, "atom:name") for a in el.findall("atom:author", NS)],
        published=_text(el, "atom:published")[:10],
        updated=_text(el, "atom:updated")[:10],
        categories=categories,
        primary_category=primary,
        abstract=_text(el, "atom:summary"),
    )


def _parse_root(root: ET.Element, where: str) -> ArxivPage:
    entries = [e for el in root.findall("atom:entry", NS) if (e := _parse_entry(el, where)) is not None]
    total = _text(root, "opensearch:totalResults")
    start = _text(root, "opensearch:startIndex")
    return ArxivPage(
        entries=entries,
        total_results=int(total) if total.isdigit() else len(entries),
        start_index=int(start) if start.isdigit() else 0,
    )


def parse_feed(data: bytes, where: str = "arXiv response") -> ArxivPage:
    """Parse an arXiv API Atom feed; raises InputError for an API error entry."""
    try:
        root = ET.fromstring(data)
    except ET.ParseError as exc:
        raise NetworkError(
            f"arXiv returned a response that is not Atom XML: {exc}",
            where=where,
            fix="try again later; delete the cached response if the problem persists",
        ) from exc
    return _parse_root(root, where)


def is_complete_pdf(path: Path) -> bool:
    """True if ``path`` looks like a whole PDF: the magic header, a non-trivial size, a final %%EOF."""
    try:
        size = path.stat().st_size
        if size < MIN_PDF_BYTES:
            return False
        with open(path, "rb") as fh:
            head = fh.read(5)
            fh.seek(max(0, size - 2048))
            tail = fh.read()
    except OSError:
        return False
    return head == b"%PDF-" and b"%%EOF" in tail


def _check_status(resp: httpx.Response, url: str) -> None:
    if resp.status_code == 429 or resp.status_code >= 500:
        raise _Retryable(
            f"HTTP {resp.status_code}", retry_after_s(resp.headers.get("Retry-After"), MAX_RETRY_AFTER_S)
        )
    if resp.status_code >= 400:
        raise NetworkError(
            f"arXiv answered HTTP {resp.status_code}",
            where=url,
            fix="check the id or query; the paper may have been withdrawn",
        )


class ArxivClient:
    """A polite, caching, retrying client for the arXiv API and PDF server."""

    def __init__(
        self,
        settings: ArxivSettings,
        cache_dir: Path,
        client: httpx.Client | None = None,
        *,
        page_size: int = 100,
    ) -> None:
        self.settings = settings
        self.cache_dir = cache_dir / "arxiv"
        self.page_size = page_size
        self._owns_http = client is None
        self._http = client or httpx.Client(
            timeout=settings.timeout_s,
            follow_redirects=True,
            headers={"User-Agent": f"arag/{__version__} (research corpus selection)"},
        )
        self._last_request: float | None = None
        self.requests = 0  # real network requests made, cache hits excluded

    def close(self) -> None:
        """Close the HTTP client if this object created it."""
        if self._owns_http:
            self._http.close()

    def __enter__(self) -> ArxivClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- network policy -------------------------------------------------------------------------

    def _wait_turn(self) -> None:
        if self._last_request is not None:
            wait = self._last_request + self.settings.delay_s - time.monotonic()
            if wait > 0:
                time.sleep(wait)

    def _with_retries(self, url: str, attempt: Callable[[], T]) -> T:
        tries = self.settings.retries + 1
        reason = ""
        retry_after: float | None = None
        for n in range(tries):
            if n:
                backoff = backoff_delay(n - 1, self.settings.backoff_s)
                time.sleep(max(backoff, retry_after or 0.0))
                log.info("retrying %s (try %d of %d) after %s", url, n + 1, tries, reason)
                retry_after = None
            self._wait_turn()
            self.requests += 1
            try:
                return attempt()
            except _Retryable as exc:
                reason, retry_after = str(exc), exc.retry_after
            except httpx.TransportError as exc:  # connect/read errors, timeouts, dropped connections
                reason = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            finally:
                self._last_request = time.monotonic()
        raise NetworkError(
            f"cannot reach arXiv at {url} after {tries} {'try' if tries == 1 else 'tries'} "
            f"(last error: {reason})",
            where=url,
            fix="check your connection and try again later, or use the cached manifest",
        )

    # -- API ------------------------------------------------------------------------------------

    def _cache_path(self, url: str) -> Path:
        return self.cache_dir / f"{hashlib.sha256(url.encode()).hexdigest()}.xml"

    def _api(self, params: dict[str, str]) -> ArxivPage:
        url = str(httpx.URL(self.settings.api_url, params=params))
        cached = self._cache_path(url)
        if cached.is_file():
            try:
                return parse_feed(cached.read_bytes(), where=str(cached))
            except NetworkError:
                log.warning("cached response %s is unreadable; fetching it again", cached)
                cached.unlink(missing_ok=True)

        def attempt() -> tuple[bytes, ArxivPage]:
            resp = self._http.get(url)
            if resp.status_code == 400:  # a bad query: the body's error entry says what was wrong
                with contextlib.suppress(ET.ParseError):
                    _parse_root(ET.fromstring(resp.content), url)
            _check_status(resp, url)
            try:
                root = ET.fromstring(resp.content)
            except ET.ParseError as exc:
                raise _Retryable(f"unreadable XML: {exc}") from exc
            page = _parse_root(root, url)
            # arXiv sometimes answers a valid query with an empty page; a retry usually fills it.
            if not page.entries and page.total_results > int(params.get("start", "0")):
                raise _Retryable("empty page although results remain")
            return resp.content, page

        content, page = self._with_retries(url, attempt)
        atomic_write_bytes(cached, content)
        return page

    def query_page(
        self, search_query: str, start: int, max_results: int, sort_by: str = "relevance"
    ) -> ArxivPage:
        """One page of a keyword search (arXiv ``search_query`` syntax)."""
        return self._api(
            {
                "search_query": search_query,
                "start": str(start),
                "max_results": str(max_results),
                "sortBy": sort_by,
                "sortOrder": "descending",
            }
        )

    def query(self, search_query: str, start: int, max_results: int) -> list[ManifestEntry]:
        """The entries of one page of a keyword search."""
        return self.query_page(search_query, start, max_results).entries

    def search(self, search_query: str, max_results: int, sort_by: str = "relevance") -> list[ManifestEntry]:
        """Up to ``max_results`` entries of a search, paging ``page_size`` at a time."""
        out: list[ManifestEntry] = []
        start = 0
        while start < max_results:
            n = min(self.page_size, max_results - start)
            page = self.query_page(search_query, start, n, sort_by)
            out.extend(page.entries)
            start += n
            if len(page.entries) < n or start >= page.total_results:
                break
        return out

    def by_ids(self, ids: list[str]) -> list[ManifestEntry]:
        """Metadata for the given ids (versions honoured), ``IDS_PER_REQUEST`` ids per request."""
        out: list[ManifestEntry] = []
        for i in range(0, len(ids), IDS_PER_REQUEST):
            chunk = ids[i : i + IDS_PER_REQUEST]
            params = {"id_list": ",".join(chunk), "start": "0", "max_results": str(len(chunk))}
            out.extend(self._api(params).entries)
        return out

    # -- PDFs -----------------------------------------------------------------------------------

    def download_pdf(self, arxiv_id: str, final: Path) -> int:
        """Download one PDF to ``final`` via ``final.part`` (resumed by HTTP Range); returns its size."""
        url = self.settings.pdf_url.format(id=arxiv_id)
        part = final.with_name(final.name + ".part")
        final.parent.mkdir(parents=True, exist_ok=True)

        def attempt() -> None:
            have = part.stat().st_size if part.exists() else 0
            headers = {"Range": f"bytes={have}-"} if have else {}
            with self._http.stream("GET", url, headers=headers) as resp:
                if resp.status_code == 416:  # the .part no longer matches the file: start over
                    part.unlink(missing_ok=True)
                    raise _Retryable("HTTP 416 for a stale partial download")
                _check_status(resp, url)
                append = resp.status_code == 206
                if append and not resp.headers.get("Content-Range", "").startswith(f"bytes {have}-"):
                    part.unlink(missing_ok=True)
                    raise _Retryable("server resumed at the wrong offset")
                with open(part, "ab" if append else "wb") as fh:
                    for chunk in resp.iter_bytes():
                        fh.write(chunk)

        self._with_retries(url, attempt)
        if not is_complete_pdf(part):
            part.unlink(missing_ok=True)
            raise NetworkError(
                f"the download of {arxiv_id} is not a PDF",
                where=url,
                fix="open the URL in a browser; arXiv may not have a PDF for this paper yet",
            )
        size = part.stat().st_size
        part.replace(final)
        return size


def _gate(entry: ManifestEntry, spec: SelectionSpec, exclude: set[str], counts: GateCounts) -> bool:
    """Apply the gates to a search result; False (and a logged, counted reason) if it is removed."""
    gates = spec.gates
    if entry.id in exclude:
        counts.removed_exclude.append(entry.id)
        log.info("gate exclude removed %s: %s", entry.id, entry.title)
        return False
    if not gates.category_allowed(entry.categories):
        counts.removed_category.append(entry.id)
        log.info("gate category removed %s (%s): %s", entry.id, ",".join(entry.categories), entry.title)
        return False
    pattern = gates.title_blocked(entry.title)
    if pattern is not None:
        counts.removed_title.append(entry.id)
        log.info("gate title removed %s (matches %r): %s", entry.id, pattern, entry.title)
        return False
    return True


def select(spec: SelectionSpec, client: ArxivClient) -> Manifest:
    """Resolve hand-picked ids and topic searches, apply the gates, dedupe: the manifest.

    Hand-picked papers bypass the category and title gates (they were chosen on purpose) but not
    the exclude list. A paper found twice keeps its first place: hand-picked first, then topics in
    spec order. A hand-picked paper without a topic takes the first topic whose search finds it.
    """
    counts = GateCounts()
    exclude = set(spec.gates.exclude)
    kept: dict[str, ManifestEntry] = {}
    removed: set[str] = set()

    picks: dict[str, HandPicked] = {}
    for pick in spec.papers:
        picks.setdefault(base_id(pick.id), pick)
    found = {e.id: e for e in client.by_ids([p.id for p in picks.values()])}
    adoptable: set[str] = set()
    for bid, pick in picks.items():
        entry = found.get(bid)
        if entry is None:
            counts.missing.append(pick.id)
            log.warning("hand-picked %s was not found on arXiv", pick.id)
        elif bid in exclude:
            counts.removed_exclude.append(bid)
            removed.add(bid)
            log.info("gate exclude removed hand-picked %s: %s", bid, entry.title)
        else:
            kept[bid] = entry.model_copy(
                update={"canonical": pick.canonical, "topic": pick.topic or HAND_PICKED_TOPIC}
            )
            if pick.topic is None:
                adoptable.add(bid)
    if picks:
        counts.per_topic_found[HAND_PICKED_TOPIC] = len(picks)

    for topic, tspec in spec.topics.items():
        seen: set[str] = set()
        for query in tspec.queries:
            results = client.search(query, tspec.max_results, tspec.sort_by)
            log.info("topic %s: query %r returned %d entries", topic, query, len(results))
            for entry in results:
                if entry.id in seen:
                    counts.duplicates += 1
                    continue
                seen.add(entry.id)
                if entry.id in kept:
                    counts.duplicates += 1
                    if entry.id in adoptable:
                        kept[entry.id] = kept[entry.id].model_copy(update={"topic": topic})
                        adoptable.discard(entry.id)
                elif entry.id not in removed:
                    if _gate(entry, spec, exclude, counts):
                        kept[entry.id] = entry.model_copy(update={"topic": topic, "canonical": False})
                    else:
                        removed.add(entry.id)
        counts.per_topic_found[topic] = len(seen)

    entries = list(kept.values())
    for entry in entries:
        counts.per_topic_kept[entry.topic] = counts.per_topic_kept.get(entry.topic, 0) + 1
    log.info(
        "selected %d papers; removed by exclude %d, category %d, title %d; %d duplicates; %d missing",
        len(entries),
        len(counts.removed_exclude),
        len(counts.removed_category),
        len(counts.removed_title),
        counts.duplicates,
        len(counts.missing),
    )
    return Manifest(spec_name=spec.name, spec_hash=spec.spec_hash(), entries=entries, counts=counts)


class FetchReport(BaseModel):
    """What a fetch did, by id."""

    downloaded: list[str] = Field(default_factory=list)
    skipped: list[str] = Field(default_factory=list, description="already complete on disk")
    failed: dict[str, str] = Field(default_factory=dict, description="id -> what went wrong")
    bytes_downloaded: int = 0


def fetch(
    manifest: Manifest,
    dest: Path,
    client: ArxivClient,
    *,
    show_progress: bool = True,
    console: Console | None = None,
) -> FetchReport:
    """Download every entry's PDF to ``dest/<id>.pdf``, skipping complete files; safe to rerun."""
    dest.mkdir(parents=True, exist_ok=True)
    report = FetchReport()
    entries = list(_unique(manifest.entries))
    progress = Progress(
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        disable=not show_progress,
    )
    with progress:
        task = progress.add_task("fetching", total=len(entries))
        for entry in entries:
            final = dest / entry.filename
            if is_complete_pdf(final):
                report.skipped.append(entry.id)
            else:
                try:
                    report.bytes_downloaded += client.download_pdf(entry.versioned_id, final)
                    report.downloaded.append(entry.id)
                except AragError as exc:
                    report.failed[entry.id] = exc.what
                    log.warning("could not fetch %s: %s", entry.id, exc.what)
            progress.update(task, advance=1, description=entry.id)
    return report


def _unique(entries: Iterable[ManifestEntry]) -> Iterable[ManifestEntry]:
    seen: set[str] = set()
    for e in entries:
        if e.id not in seen:
            seen.add(e.id)
            yield e
