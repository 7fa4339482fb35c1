"""Build state: which papers are in the index, under which build key, and what failed.

A paper is recorded here only after its chunks were flushed to the store, so a killed build
resumes at the first paper not recorded, and re-writing that paper's points is idempotent.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from arag.errors import StoreError

_SCHEMA = """
CREATE TABLE IF NOT EXISTS papers (
    id TEXT PRIMARY KEY,
    title TEXT NOT NULL,
    source TEXT NOT NULL,
    source_path TEXT,
    build_key TEXT NOT NULL,
    n_chunks INTEGER NOT NULL,
    year INTEGER,
    month INTEGER,
    authors TEXT NOT NULL DEFAULT '[]',
    topic INTEGER,
    topic_label TEXT,
    abstract_text TEXT NOT NULL DEFAULT '',
    added_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS failures (
    key TEXT PRIMARY KEY,
    source TEXT NOT NULL,
    reason TEXT NOT NULL,
    at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS meta (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
"""


class PaperRow(BaseModel):
    """A paper as the library records it."""

    id: str
    title: str
    source: str
    source_path: str | None
    build_key: str
    n_chunks: int
    year: int | None
    month: int | None
    authors: list[str]
    topic: int | None
    topic_label: str | None
    # The abstract chunk's embedded text: its vector (from the embedding cache) places the paper in a topic.
    abstract_text: str = ""


class Failure(BaseModel):
    """A document that could not be ingested, and why."""

    key: str
    source: str
    reason: str


class LibraryState:
    """The sqlite file beside the index (``<data dir>/library.sqlite3``)."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self._db = sqlite3.connect(path, timeout=30)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.executescript(_SCHEMA)
        except sqlite3.DatabaseError as exc:
            raise StoreError(
                f"the library state file is unreadable: {exc}",
                where=str(path),
                fix="rebuild the library: arag library build --rebuild",
            ) from exc
        self.path = path

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> LibraryState:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # papers
    def papers(self, *, topic: int | None = None) -> list[PaperRow]:
        sql = "SELECT * FROM papers"
        args: tuple[Any, ...] = ()
        if topic is not None:
            sql += " WHERE topic = ?"
            args = (topic,)
        cur = self._db.execute(sql + " ORDER BY id", args)
        cols = [c[0] for c in cur.description]
        rows = []
        for raw in cur.fetchall():
            rec = dict(zip(cols, raw, strict=True))
            rec["authors"] = json.loads(rec["authors"])
            rec.pop("added_at")
            rows.append(PaperRow(**rec))
        return rows

    def build_keys(self) -> dict[str, str]:
        return dict(self._db.execute("SELECT id, build_key FROM papers").fetchall())

    def record_papers(self, rows: Sequence[PaperRow]) -> None:
        """Mark papers as indexed (call after the store flushed their chunks)."""
        now = time.time()
        with self._db:
            self._db.executemany(
                "INSERT OR REPLACE INTO papers (id, title, source, source_path, build_key, n_chunks, year, "
                "month, authors, topic, topic_label, abstract_text, added_at) "
                "VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
                [
                    (
                        r.id,
                        r.title,
                        r.source,
                        r.source_path,
                        r.build_key,
                        r.n_chunks,
                        r.year,
                        r.month,
                        json.dumps(r.authors),
                        r.topic,
                        r.topic_label,
                        r.abstract_text,
                        now,
                    )
                    for r in rows
                ],
            )
            self._db.executemany("DELETE FROM failures WHERE key = ?", [(r.id,) for r in rows])
            if rows and rows[0].source_path:
                self._db.executemany(
                    "DELETE FROM failures WHERE key = ?", [(r.source_path,) for r in rows if r.source_path]
                )

    def forget_papers(self, ids: Iterable[str]) -> None:
        with self._db:
            self._db.executemany("DELETE FROM papers WHERE id = ?", [(i,) for i in ids])

    def set_topics(self, topics: dict[str, tuple[int, str]]) -> None:
        with self._db:
            self._db.executemany(
                "UPDATE papers SET topic = ?, topic_label = ? WHERE id = ?",
                [(t, label, pid) for pid, (t, label) in topics.items()],
            )

    # failures
    def record_failures(self, failures: Sequence[Failure]) -> None:
        now = time.time()
        with self._db:
            self._db.executemany(
                "INSERT OR REPLACE INTO failures (key, source, reason, at) VALUES (?,?,?,?)",
                [(f.key, f.source, f.reason, now) for f in failures],
            )

    def failures(self) -> list[Failure]:
        rows = self._db.execute("SELECT key, source, reason FROM failures ORDER BY key").fetchall()
        return [Failure(key=k, source=s, reason=r) for k, s, r in rows]

    # meta
    def get_meta(self, key: str) -> Any | None:
        row = self._db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return json.loads(row[0]) if row else None

    def set_meta(self, key: str, value: Any) -> None:
        with self._db:
            self._db.execute(
                "INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (key, json.dumps(value))
            )

    def delete_meta(self, key: str) -> None:
        with self._db:
            self._db.execute("DELETE FROM meta WHERE key = ?", (key,))
