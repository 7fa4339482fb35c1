"""Selection specs and manifests: the manifest *is* the corpus.

A selection spec (TOML or JSON) names hand-picked arXiv ids, per-topic keyword searches and the
gates that filter search results. ``arag corpus select`` turns it into a manifest (JSON): the exact
list of papers, pinned to the version seen at selection time, that ``arag corpus fetch`` downloads.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import tempfile
import tomllib
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError, field_validator, model_validator

from arag.errors import CorpusError, InputError

# New-style ids (0704.0001 onward) and old-style ids (hep-th/9901001), each with an optional version.
_NEW_ID = re.compile(r"^(\d{4}\.\d{4,5})(v\d+)?$")
_OLD_ID = re.compile(r"^([a-z][a-z\-]*(?:\.[A-Z]{2})?/\d{7})(v\d+)?$")
REGEX_PREFIX = "re:"
HAND_PICKED_TOPIC = "hand-picked"


def split_version(arxiv_id: str) -> tuple[str, str | None]:
    """``"1706.03762v5"`` -> ``("1706.03762", "v5")``; raises InputError for a malformed id."""
    text = arxiv_id.strip()
    m = _NEW_ID.match(text)
    # Numbers have 4 digits up to 1412 and 5 digits from 1501 on.
    if m and (len(m.group(1)) == 10) == (int(text[:4]) >= 1501):
        return m.group(1), m.group(2)
    m = _OLD_ID.match(text)
    if m:
        return m.group(1), m.group(2)
    raise InputError(
        f"{arxiv_id!r} is not an arXiv id",
        where="selection spec",
        fix="write ids as 1706.03762 or 1706.03762v5 (old style: hep-th/9901001)",
    )


def base_id(arxiv_id: str) -> str:
    """The id without its version suffix: the key used to deduplicate papers."""
    return split_version(arxiv_id)[0]


def _checked_id(arxiv_id: str) -> str:
    # Inside validators: a ValueError becomes a ValidationError that load_spec reports with the file.
    try:
        split_version(arxiv_id)
    except InputError as exc:
        raise ValueError(exc.what) from None
    return arxiv_id.strip()


class HandPicked(BaseModel):
    """One hand-picked paper. Hand-picked papers are canonical unless marked otherwise."""

    id: str
    canonical: bool = True
    topic: str | None = None

    @field_validator("id")
    @classmethod
    def _valid_id(cls, v: str) -> str:
        return _checked_id(v)


class TopicSpec(BaseModel):
    """The keyword searches of one topic (arXiv API ``search_query`` syntax)."""

    queries: list[str]
    # Per query: the search pages until it has this many results or arXiv has no more.
    max_results: int = Field(default=50, ge=1, le=2000)
    sort_by: Literal["relevance", "submittedDate", "lastUpdatedDate"] = "relevance"


class Gates(BaseModel):
    """Filters applied to search results after fetching (changing them costs no requests)."""

    # Keep an entry if any of its categories is listed; an empty list keeps everything.
    categories: list[str] = Field(default_factory=list)
    # Case-insensitive substrings of the title; entries prefixed "re:" are regular expressions.
    title_block: list[str] = Field(default_factory=list)
    exclude: list[str] = Field(default_factory=list)

    @field_validator("title_block")
    @classmethod
    def _valid_patterns(cls, v: list[str]) -> list[str]:
        for pat in v:
            if pat.startswith(REGEX_PREFIX):
                try:
                    re.compile(pat[len(REGEX_PREFIX) :])
                except re.error as exc:
                    raise ValueError(f"bad regular expression {pat!r}: {exc}") from exc
        return v

    @field_validator("exclude")
    @classmethod
    def _valid_ids(cls, v: list[str]) -> list[str]:
        return [base_id(_checked_id(i)) for i in v]

    def title_blocked(self, title: str) -> str | None:
        """The block-list pattern that matches ``title``, or None."""
        low = title.lower()
        for pat in self.title_block:
            if pat.startswith(REGEX_PREFIX):
                if re.search(pat[len(REGEX_PREFIX) :], title, flags=re.IGNORECASE):
                    return pat
            elif pat.lower() in low:
                return pat
        return None

    def category_allowed(self, categories: list[str]) -> bool:
        """True if the allow-list is empty or shares a category with ``categories``."""
        return not self.categories or any(c in self.categories for c in categories)


class SelectionSpec(BaseModel):
    """What to select from arXiv: hand-picked ids, topic searches, gates."""

    name: str = "selection"
    papers: list[HandPicked] = Field(default_factory=list)
    topics: dict[str, TopicSpec] = Field(default_factory=dict)
    gates: Gates = Field(default_factory=Gates)

    @field_validator("papers", mode="before")
    @classmethod
    def _plain_ids(cls, v: Any) -> Any:
        # A bare string in the list is shorthand for {id = "..."}.
        if isinstance(v, list):
            return [{"id": x} if isinstance(x, str) else x for x in v]
        return v

    @field_validator("topics", mode="before")
    @classmethod
    def _plain_queries(cls, v: Any) -> Any:
        # topic = ["query", ...] is shorthand for topic = {queries = [...]}.
        if isinstance(v, dict):
            return {k: {"queries": q} if isinstance(q, list) else q for k, q in v.items()}
        return v

    @model_validator(mode="after")
    def _no_reserved_topic(self) -> SelectionSpec:
        if HAND_PICKED_TOPIC in self.topics:
            raise ValueError(f"topic name {HAND_PICKED_TOPIC!r} is reserved for hand-picked papers")
        return self

    def spec_hash(self) -> str:
        """SHA-256 of the spec's canonical JSON: a manifest records the spec it came from."""
        payload = json.dumps(self.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(payload.encode()).hexdigest()


class ManifestEntry(BaseModel):
    """One selected paper."""

    id: str = Field(description="arXiv id without version, e.g. 1706.03762")
    version: str | None = Field(default=None, description="pinned version, e.g. v7; None fetches the latest")
    title: str
    authors: list[str] = Field(default_factory=list)
    published: str = Field(default="", description="first-version date, YYYY-MM-DD")
    updated: str = ""
    categories: list[str] = Field(default_factory=list)
    primary_category: str = ""
    topic: str = HAND_PICKED_TOPIC
    canonical: bool = False
    abstract: str = ""

    @property
    def versioned_id(self) -> str:
        """The id to fetch: with the pinned version when there is one."""
        return f"{self.id}{self.version or ''}"

    @property
    def filename(self) -> str:
        """The PDF's file name (old-style ids contain a slash)."""
        return self.id.replace("/", "_") + ".pdf"


class GateCounts(BaseModel):
    """What selection kept and what each gate removed (ids, in the order seen)."""

    per_topic_found: dict[str, int] = Field(default_factory=dict)
    per_topic_kept: dict[str, int] = Field(default_factory=dict)
    removed_category: list[str] = Field(default_factory=list)
    removed_title: list[str] = Field(default_factory=list)
    removed_exclude: list[str] = Field(default_factory=list)
    duplicates: int = 0
    missing: list[str] = Field(default_factory=list, description="hand-picked ids arXiv did not return")


class Manifest(BaseModel):
    """The selected corpus."""

    created: str = Field(default_factory=lambda: datetime.now(UTC).isoformat(timespec="seconds"))
    spec_name: str = ""
    spec_hash: str
    entries: list[ManifestEntry] = Field(default_factory=list)
    counts: GateCounts = Field(default_factory=GateCounts)

    def ids(self) -> list[str]:
        """The entries' ids, in manifest order."""
        return [e.id for e in self.entries]


def load_spec(path: Path) -> SelectionSpec:
    """Read a selection spec from a ``.toml`` or ``.json`` file."""
    if not path.is_file():
        raise InputError(
            f"selection spec {path} does not exist",
            where=str(path),
            fix="pass the path of a TOML or JSON spec (see arag/corpus/example_selection.toml)",
        )
    try:
        if path.suffix.lower() == ".json":
            data = json.loads(path.read_text(encoding="utf-8"))
        else:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise InputError(
            f"selection spec is not valid {'JSON' if path.suffix.lower() == '.json' else 'TOML'}: {exc}",
            where=str(path),
            fix="fix the syntax error named above",
        ) from exc
    try:
        return SelectionSpec.model_validate(data)
    except ValidationError as exc:
        raise InputError(
            f"invalid selection spec: {exc}",
            where=str(path),
            fix="correct the fields named above (see arag/corpus/example_selection.toml)",
        ) from exc


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` via a temporary file and ``os.replace``: readers never see half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def write_manifest(manifest: Manifest, path: Path) -> None:
    """Write the manifest as indented JSON, atomically."""
    atomic_write_bytes(path, (manifest.model_dump_json(indent=2) + "\n").encode("utf-8"))


def read_manifest(path: Path) -> Manifest:
    """Read a manifest written by :func:`write_manifest`."""
    if not path.is_file():
        raise CorpusError(
            f"manifest {path} does not exist",
            where=str(path),
            fix="create it with `arag corpus select SPEC --out MANIFEST`",
        )
    try:
        return Manifest.model_validate_json(path.read_bytes())
    except ValidationError as exc:
        raise CorpusError(
            f"manifest is not valid: {exc}",
            where=str(path),
            fix="recreate it with `arag corpus select SPEC --out MANIFEST`",
        ) from exc
