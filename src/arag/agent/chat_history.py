"""Conversations: each session's turns (messages, the standalone questions they became, the answers)
in SQLite, shared by the CLI, the API and the service."""

from __future__ import annotations

import re
import sqlite3
import time
import uuid
from collections.abc import Iterator
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict

from arag.errors import InputError, StoreError
from arag.records import Answer
from arag.settings import Settings

_SCHEMA = """
CREATE TABLE IF NOT EXISTS sessions (
    id TEXT PRIMARY KEY,
    created REAL NOT NULL,
    updated REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS turns (
    session_id TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
    turn INTEGER NOT NULL,
    role TEXT NOT NULL CHECK (role IN ('user', 'assistant')),
    text TEXT NOT NULL,
    standalone TEXT,
    answer_json TEXT,
    created REAL NOT NULL,
    PRIMARY KEY (session_id, turn)
);
"""
SESSION_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}$")
# Seconds a writer waits for another (a second process, the service's threads) to commit.
BUSY_TIMEOUT_S = 30.0


def chat_db(settings: Settings) -> Path:
    """Where the chat history lives: ``<data dir>/chat.sqlite3``."""
    return settings.data_dir / "chat.sqlite3"


def new_session_id() -> str:
    """A fresh session id."""
    return uuid.uuid4().hex[:12]


def validate_session_id(session_id: str) -> str:
    """The id stripped; an InputError unless it is 1-64 letters, digits and ``_ . : -``."""
    sid = (session_id or "").strip()
    if not SESSION_ID.match(sid):
        raise InputError(
            f"invalid session id {session_id!r}",
            where="session id",
            fix="use 1-64 letters, digits, '_', '.', ':' or '-' (starting with a letter or digit)",
        )
    return sid


class ChatTurn(BaseModel):
    """One row of a session: a user message (with the standalone question it became) or an answer."""

    model_config = ConfigDict(frozen=True)

    session_id: str
    turn: int
    role: Literal["user", "assistant"]
    text: str
    standalone: str | None = None
    answer: Answer | None = None
    created: float


class Exchange(BaseModel):
    """A user message, the question the agent was asked, and its answer (numbered from 1)."""

    model_config = ConfigDict(frozen=True)

    n: int
    message: str
    standalone: str
    answer: Answer | None = None
    created: float


class SessionInfo(BaseModel):
    """A session: its id, when it started and last changed, and its exchanges."""

    id: str
    created: float
    updated: float
    exchanges: int


class ChatHistory:
    """Sessions and their turns in one SQLite file (WAL). Each call opens its own connection, so one
    instance is safe to share between threads, and several processes may write the same file."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        with self._connect() as con:
            con.execute("PRAGMA journal_mode=WAL")
            con.executescript(_SCHEMA)

    @contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        try:
            with closing(sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_S, isolation_level=None)) as con:
                con.execute("PRAGMA foreign_keys=ON")
                yield con
        except sqlite3.Error as exc:
            raise StoreError(
                f"the chat history could not be read or written: {exc}",
                where=str(self.path),
                fix="check the data directory is writable; delete the file to start the history afresh",
            ) from exc

    def record(self, session_id: str, message: str, standalone: str, answer: Answer) -> Exchange:
        """Append an exchange (the user turn, then the answer turn) to a session, creating it."""
        now = time.time()
        with self._connect() as con:
            # IMMEDIATE: the next turn number is read and used under the one write lock.
            con.execute("BEGIN IMMEDIATE")
            try:
                con.execute(
                    "INSERT INTO sessions (id, created, updated) VALUES (?, ?, ?) "
                    "ON CONFLICT(id) DO UPDATE SET updated = excluded.updated",
                    (session_id, now, now),
                )
                last = con.execute(
                    "SELECT COALESCE(MAX(turn), 0) FROM turns WHERE session_id = ?", (session_id,)
                ).fetchone()[0]
                con.executemany(
                    "INSERT INTO turns (session_id, turn, role, text, standalone, answer_json, created) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?)",
                    [
                        (session_id, last + 1, "user", message, standalone, None, now),
                        (session_id, last + 2, "assistant", answer.text, None, answer.model_dump_json(), now),
                    ],
                )
                n = con.execute(
                    "SELECT COUNT(*) FROM turns WHERE session_id = ? AND role = 'user'", (session_id,)
                ).fetchone()[0]
                con.execute("COMMIT")
            except BaseException:
                con.execute("ROLLBACK")
                raise
        return Exchange(n=n, message=message, standalone=standalone, answer=answer, created=now)

    def turns(self, session_id: str) -> list[ChatTurn]:
        """A session's turns in order (none for an unknown session)."""
        with self._connect() as con:
            rows = con.execute(
                "SELECT turn, role, text, standalone, answer_json, created FROM turns "
                "WHERE session_id = ? ORDER BY turn",
                (session_id,),
            ).fetchall()
        return [
            ChatTurn(
                session_id=session_id,
                turn=turn,
                role=role,
                text=text,
                standalone=standalone,
                answer=Answer.model_validate_json(answer_json) if answer_json else None,
                created=created,
            )
            for turn, role, text, standalone, answer_json, created in rows
        ]

    def exchanges(self, session_id: str) -> list[Exchange]:
        """A session's exchanges in order: each user turn with the answer turn after it."""
        out: list[Exchange] = []
        for t in self.turns(session_id):
            if t.role == "user":
                out.append(
                    Exchange(
                        n=len(out) + 1, message=t.text, standalone=t.standalone or t.text, created=t.created
                    )
                )
            elif out and out[-1].answer is None:
                out[-1] = out[-1].model_copy(update={"answer": t.answer})
        return out

    def sessions(self) -> list[SessionInfo]:
        """Every session, the most recently used first."""
        with self._connect() as con:
            rows = con.execute(
                "SELECT s.id, s.created, s.updated, "
                "(SELECT COUNT(*) FROM turns t WHERE t.session_id = s.id AND t.role = 'user') "
                "FROM sessions s ORDER BY s.updated DESC, s.id"
            ).fetchall()
        return [SessionInfo(id=i, created=c, updated=u, exchanges=n) for i, c, u, n in rows]
