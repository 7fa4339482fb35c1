"""API fuzzing: schemathesis against a running service's ``/openapi.json``, every operation, with
generated valid (positive) and invalid (negative) requests, schemathesis's boundary-value cases, and
requests built from ids the service holds (papers, ingest jobs).

Each response is checked for a server error (5xx) and for conformance to the schema: the status
code is documented, the content type is the documented one, the body matches the documented schema.
A ``POST /query/stream`` answer is an event stream: its events are checked here, each against the
model the service sends (see ``_check_sse``). Pass: no server error, no schema violation, no request
the server left unanswered, and ``/ready`` still ready after the run (``POST /ingest`` got generated
bodies; a corrupted library fails readiness).

Answering runs the agent (or a paper tool), so ``/query``, ``/query/stream``, ``/chat`` and a paper's
summary and related papers get fewer examples (``answer_examples``): run against a small library with
a scripted or extractive LLM.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
from pydantic import BaseModel, Field, ValidationError

from arag.records import NodeEvent
from arag.service.schemas import ErrorBody, QueryResponse, StartEvent, TokenEvent

# Operations that run the agent: each positive case is a full answer.
ANSWERING = frozenset(
    {
        "POST /query",
        "POST /query/stream",
        "POST /chat",
        "GET /papers/{paper_id}/summary",
        "GET /papers/{paper_id}/related",
    }
)
SSE_OPERATION = "POST /query/stream"
# An answer's stream: start, ~10 nodes, a token per piece of the answer, the answer.
MAX_STREAM_EVENTS = 100_000
# What each check's failure counts as.
SERVER_CHECKS = frozenset({"not_a_server_error", "sse_server_error"})
SCHEMA_CHECKS = frozenset(
    {
        "status_code_conformance",
        "content_type_conformance",
        "response_schema_conformance",
        "response_headers_conformance",
        "sse_conformance",
        "invalid_schema",
    }
)
EXCLUDED = [
    "response_schema_conformance on POST /query/stream 200: the schema documents the body as "
    '{"type": "string"} (OpenAPI 3.1: the whole text/event-stream body is a string), while '
    "schemathesis reads an event stream's `schema` as the schema of each event, so every stream "
    "fails it; the events are checked here instead (sse_conformance, sse_server_error)"
]


# The data model of each event the stream sends (routes.py, SSE_DOC).
SSE_MODELS: dict[str, type[BaseModel]] = {
    "start": StartEvent,
    "node": NodeEvent,
    "token": TokenEvent,
    "answer": QueryResponse,
    "error": ErrorBody,
}


class FuzzFailure(BaseModel):
    """One distinct failure (check, operation, kind, status) and the smallest request that hit it."""

    check: str
    operation: str
    title: str
    status: int | None = None
    message: str
    method: str
    path: str = Field(description="the path as sent, with its query string")
    body: str | None = Field(default=None, description="the request body (JSON, or a repr for forms)")
    curl: str = ""
    cases: int = Field(default=1, description="cases that hit this same failure")


class OperationStats(BaseModel):
    operation: str
    cases: int = 0
    by_phase: dict[str, int] = Field(default_factory=dict, description="coverage, positive, negative, seeded")
    statuses: dict[str, int] = Field(default_factory=dict)
    failures: int = 0
    unsendable: int = Field(default=0, description="generated requests the HTTP client refused to send")
    notes: list[str] = Field(default_factory=list)


class FuzzReport(BaseModel):
    base_url: str
    seed: int
    max_examples: int
    answer_examples: int
    operations_tested: int
    cases: int
    operations: list[OperationStats]
    failures: list[FuzzFailure]
    failures_by_check: dict[str, int] = Field(description="distinct failures per check")
    server_errors: int = Field(description="distinct 5xx failures (responses, or error events in a stream)")
    schema_violations: int
    transport_errors: int = Field(description="requests the server left unanswered (reset, timeout)")
    excluded: list[str] = Field(description="checks not applied, and why")
    ingest_jobs: dict[str, int] = Field(description="ingest jobs by state after the run")
    papers_before: int | None
    papers_after: int | None
    ready_after: bool
    ready_checks: dict[str, str]
    seconds: float
    passed: bool


def run_fuzz(
    base_url: str,
    *,
    max_examples: int = 25,
    answer_examples: int | None = None,
    seed: int = 0,
    coverage: bool = True,
    timeout_s: float = 60.0,
    headers: dict[str, str] | None = None,
    ingest_probe: bool = True,
) -> FuzzReport:
    """Fuzz every operation of the service at ``base_url``: ``max_examples`` generated cases per
    operation and mode (positive, negative), ``answer_examples`` (default: a fifth, at least 2) for
    the operations that answer; schemathesis's boundary cases too when ``coverage``. ``headers`` go
    with every request (an API key). ``ingest_probe`` uploads one junk PDF (see ``ingest_probe``): it
    leaves a failed document in the library's failure list, so leave it off against a real library."""
    import requests
    import schemathesis
    from schemathesis.core.result import Err

    t0 = time.perf_counter()
    base_url = base_url.rstrip("/")
    answer_n = answer_examples if answer_examples is not None else max(2, max_examples // 5)
    # Our own configuration, not a schemathesis.toml found in the working directory. An event stream
    # is read to its end (schemathesis stops after 20 events by default): the answer comes last.
    config = schemathesis.Config.from_dict({"max-stream-events": MAX_STREAM_EVENTS})
    schema = schemathesis.openapi.from_url(
        f"{base_url}/openapi.json", config=config, headers=headers or {}, timeout=30
    )
    papers_before = _papers_total(base_url, headers)
    with requests.Session() as session:
        session.headers.update(headers or {})
        fuzzer = _Fuzzer(base_url, session, timeout_s)
        for result in schema.get_all_operations():
            if isinstance(result, Err):  # an operation the schema describes wrongly: a violation
                fuzzer.invalid_operation(result.err())
                continue
            operation = result.ok()
            n = answer_n if operation.label in ANSWERING else max_examples
            fuzzer.fuzz_operation(operation, n, seed=seed, coverage=coverage)
        if ingest_probe:
            fuzzer.ingest_probe(schema)
        fuzzer.seeded(schema, headers)
    jobs = _settle_ingest(base_url, headers, timeout_s)
    ready, ready_checks = _ready(base_url, headers)
    return fuzzer.report(
        seed=seed,
        max_examples=max_examples,
        answer_examples=answer_n,
        ingest_jobs=jobs,
        papers_before=papers_before,
        papers_after=_papers_total(base_url, headers),
        ready=ready,
        ready_checks=ready_checks,
        seconds=time.perf_counter() - t0,
    )


class _Fuzzer:
    """Sends cases, runs the checks, collects the failures (deduplicated) and the counts."""

    def __init__(self, base_url: str, session: Any, timeout_s: float) -> None:
        self.base_url = base_url
        self.session = session
        self.timeout_s = timeout_s
        self.ops: dict[str, OperationStats] = {}
        self.failures: dict[tuple[str, str, str, int | None], FuzzFailure] = {}

    def invalid_operation(self, exc: Exception) -> None:
        method, path = str(getattr(exc, "method", "") or "").upper(), str(getattr(exc, "path", "") or "")
        label = f"{method} {path}".strip() or "schema"
        self.failures[("invalid_schema", label, "", None)] = FuzzFailure(
            check="invalid_schema",
            operation=label,
            title="the operation's schema cannot be read",
            message=str(exc)[:600],
            method=method,
            path=path,
        )

    def stats(self, label: str) -> OperationStats:
        return self.ops.setdefault(label, OperationStats(operation=label))

    def fuzz_operation(self, operation: Any, n: int, *, seed: int, coverage: bool) -> None:
        from hypothesis import HealthCheck, Phase, given, settings
        from hypothesis import seed as hseed
        from hypothesis.errors import Unsatisfiable
        from schemathesis import GenerationMode

        label = operation.label
        stats = self.stats(label)
        if coverage:
            self._coverage(operation, n if label in ANSWERING else None)
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            phase = mode.value

            # No shrinking: a failure is recorded, never raised, so every example runs.
            @settings(
                max_examples=n,
                deadline=None,
                database=None,
                derandomize=False,
                suppress_health_check=list(HealthCheck),
                phases=[Phase.explicit, Phase.generate],
            )
            @hseed(seed)
            @given(case=operation.as_strategy(generation_mode=mode))
            def one(case: Any) -> None:
                self.send(case, phase)  # noqa: B023 (called before the loop moves on)

            try:
                one()
            except Unsatisfiable:
                stats.notes.append(
                    f"no {phase} cases: every input is {'invalid' if phase == 'positive' else 'valid'}"
                )
            except Exception as exc:  # generation failed: say so, go on with the next
                stats.notes.append(f"{phase} generation failed: {type(exc).__name__}: {str(exc)[:200]}")

    def _coverage(self, operation: Any, answer_cap: int | None) -> None:
        """schemathesis's deterministic boundary cases (lengths at and past each limit, missing and
        extra fields, wrong types); at most ``answer_cap`` positive ones for an answering route."""
        from schemathesis import GenerationMode

        schema = operation.schema
        stats = self.stats(operation.label)
        try:
            config = schema.config.generation_for(operation=operation, phase="coverage")
            cases = schema.iter_coverage_cases(
                operation,
                generation_modes=[GenerationMode.POSITIVE, GenerationMode.NEGATIVE],
                generation_config=config,
            )
            positive = 0
            for case in cases:
                meta = case.meta
                if meta is not None and meta.generation.mode == GenerationMode.POSITIVE:
                    positive += 1
                    if answer_cap is not None and positive > answer_cap:
                        continue
                self.send(case, "coverage")
        except Exception as exc:
            stats.notes.append(f"coverage cases failed: {type(exc).__name__}: {str(exc)[:200]}")

    def ingest_probe(self, schema: Any) -> None:
        """An upload that passes every check of the request (a PDF signature, then junk): generated
        forms never do, and this is the one that reaches the ingest job, which must fail it (a listed
        failure) without touching the library."""
        try:
            operation = schema["/ingest"]["POST"]
        except KeyError:
            return
        junk = b"%PDF-1.4\n" + bytes(range(256)) * 4
        self.send(operation.Case(body={"files": [junk]}, media_type="multipart/form-data"), "seeded")

    def seeded(self, schema: Any, headers: dict[str, str] | None) -> None:
        """Requests for ids the service holds: generated ids only ever find a 404."""
        for path, param, listing, key in (
            ("/papers/{paper_id}", "paper_id", "/papers", "papers"),
            ("/ingest/{job_id}", "job_id", "/ingest", None),
        ):
            try:
                operation = schema[path]["GET"]
                body = httpx.get(f"{self.base_url}{listing}", headers=headers, timeout=self.timeout_s).json()
            except Exception:
                continue
            rows = body[key] if key else body
            for row in rows[:3]:
                self.send(operation.Case(path_parameters={param: row["id"]}), "seeded")

    def send(self, case: Any, phase: str) -> None:
        import requests
        from schemathesis.core.failures import FailureGroup

        label = case.operation.label
        stats = self.stats(label)
        try:
            response = case.call(base_url=self.base_url, session=self.session, timeout=self.timeout_s)
        except (requests.ConnectionError, requests.Timeout, requests.exceptions.ChunkedEncodingError) as exc:
            stats.cases += 1
            stats.by_phase[phase] = stats.by_phase.get(phase, 0) + 1
            self._record(case, "transport", type(exc).__name__, None, str(exc)[:300])
            return
        except Exception:  # the client refused the request (a header it cannot encode): nothing sent
            stats.unsendable += 1
            return
        stats.cases += 1
        stats.by_phase[phase] = stats.by_phase.get(phase, 0) + 1
        code = response.status_code
        stats.statuses[str(code)] = stats.statuses.get(str(code), 0) + 1
        for name, check in _checks():
            if name == "response_schema_conformance" and label == SSE_OPERATION and code == 200:
                continue  # EXCLUDED: the stream's events are checked by _check_sse
            try:
                case.validate_response(response, checks=[check])
            except FailureGroup as group:
                for f in group.exceptions:
                    self._record(case, name, f.title, code, f.message)
        if label == SSE_OPERATION and code == 200:
            for name, title, message in _check_sse(response.text):
                self._record(case, name, title, code, message)

    def _record(self, case: Any, check: str, title: str, status: int | None, message: str) -> None:
        label = case.operation.label
        key = (check, label, title, status)
        body = _body_text(case)
        found = self.failures.get(key)
        if found is not None:
            found.cases += 1
            if len(body or "") >= len(found.body or ""):
                return
        self.stats(label).failures += found is None
        try:
            curl = case.as_curl_command(base_url=self.base_url)
        except Exception:
            curl = ""
        query = "&".join(f"{k}={v}" for k, v in (case.query or {}).items())
        self.failures[key] = FuzzFailure(
            check=check,
            operation=label,
            title=title,
            status=status,
            message=message[:600],
            method=case.method,
            path=case.formatted_path + (f"?{query}" if query else ""),
            body=body,
            curl=curl[:1000],
            cases=found.cases if found else 1,
        )

    def report(self, **kw: Any) -> FuzzReport:
        failures = sorted(self.failures.values(), key=lambda f: (f.check, f.operation, f.title))
        by_check: dict[str, int] = {}
        for f in failures:
            by_check[f.check] = by_check.get(f.check, 0) + 1
        server = sum(f.check in SERVER_CHECKS for f in failures)
        schema = sum(f.check in SCHEMA_CHECKS for f in failures)
        transport = sum(f.check == "transport" for f in failures)
        ops = [s for s in self.ops.values() if s.cases]
        ready = kw.pop("ready")
        return FuzzReport(
            base_url=self.base_url,
            operations_tested=len(ops),
            cases=sum(s.cases for s in self.ops.values()),
            operations=list(self.ops.values()),
            failures=failures,
            failures_by_check=by_check,
            server_errors=server,
            schema_violations=schema,
            transport_errors=transport,
            excluded=EXCLUDED,
            ready_after=ready,
            passed=server == 0 and schema == 0 and transport == 0 and ready,
            seconds=round(kw.pop("seconds"), 2),
            **kw,
        )


def _checks() -> Iterator[tuple[str, Callable[..., Any]]]:
    """The checks each response gets: no 5xx, and conformance to the schema."""
    from schemathesis.checks import not_a_server_error
    from schemathesis.specs.openapi.checks import (
        content_type_conformance,
        response_headers_conformance,
        response_schema_conformance,
        status_code_conformance,
    )

    yield "not_a_server_error", not_a_server_error
    yield "status_code_conformance", status_code_conformance
    yield "content_type_conformance", content_type_conformance
    yield "response_headers_conformance", response_headers_conformance
    yield "response_schema_conformance", response_schema_conformance


def sse_events(text: str) -> list[tuple[str, str]]:
    """(event, data) pairs of a Server-Sent Events body."""
    out: list[tuple[str, str]] = []
    # Lines end at CR, LF or CRLF only (not str.splitlines: a JSON string may hold U+2028 or U+0085).
    for block in text.replace("\r\n", "\n").replace("\r", "\n").split("\n\n"):
        event, data = "message", []
        for line in block.split("\n"):
            if line.startswith("event:"):
                event = line[6:].strip()
            elif line.startswith("data:"):
                data.append(line[5:].removeprefix(" "))
        if data:
            out.append((event, "\n".join(data)))
    return out


def _check_sse(text: str) -> list[tuple[str, str, str]]:
    """(check, title, message) for each problem of a 200 event stream: it starts with ``start``, ends
    with ``answer`` or ``error``, every event's data is its model's JSON; an ``error`` event with a
    5xx status is a server error sent inside a 200."""
    events = sse_events(text)
    out: list[tuple[str, str, str]] = []
    if not events:
        return [("sse_conformance", "empty event stream", text[:200])]
    if events[0][0] != "start":
        out.append(("sse_conformance", "stream does not start with `start`", events[0][0]))
    if events[-1][0] not in ("answer", "error"):
        out.append(("sse_conformance", "stream does not end with `answer` or `error`", events[-1][0]))
    for kind, data in events:
        model = SSE_MODELS.get(kind)
        if model is None:
            out.append(("sse_conformance", "undocumented event", kind))
            continue
        try:
            value = model.model_validate_json(data)
        except ValidationError as exc:
            out.append(("sse_conformance", f"`{kind}` event does not match its model", str(exc)[:300]))
            continue
        if isinstance(value, ErrorBody) and value.status >= 500:
            out.append(("sse_server_error", f"error event with status {value.status}", value.error))
    return out


def _body_text(case: Any) -> str | None:
    from schemathesis.core import NOT_SET

    body = case.body
    if body is NOT_SET or body is None:
        return None
    try:
        text = json.dumps(body, ensure_ascii=True)
    except (TypeError, ValueError):
        text = repr(body)
    if case.media_type and case.media_type != "application/json":
        text = f"({case.media_type}) {text}"
    return text[:500]


def _papers_total(base_url: str, headers: dict[str, str] | None) -> int | None:
    try:
        return int(httpx.get(f"{base_url}/papers", headers=headers, timeout=30).json()["total"])
    except (httpx.HTTPError, KeyError, ValueError, TypeError):
        return None


def _settle_ingest(base_url: str, headers: dict[str, str] | None, timeout_s: float) -> dict[str, int]:
    """Wait (bounded) for the ingest jobs the run started; their states."""
    deadline = time.monotonic() + timeout_s
    states: dict[str, int] = {}
    while True:
        try:
            jobs = httpx.get(f"{base_url}/ingest", headers=headers, timeout=30).json()
            states = {}
            for job in jobs:
                states[job["state"]] = states.get(job["state"], 0) + 1
        except (httpx.HTTPError, KeyError, ValueError, TypeError):
            return {"unreadable": 1}
        if not (states.get("queued") or states.get("running")) or time.monotonic() > deadline:
            return states
        time.sleep(0.2)


def _ready(base_url: str, headers: dict[str, str] | None) -> tuple[bool, dict[str, str]]:
    try:
        r = httpx.get(f"{base_url}/ready", headers=headers, timeout=30)
        body = r.json()
        return r.status_code == 200 and bool(body.get("ready")), dict(body.get("checks", {}))
    except (httpx.HTTPError, ValueError, AttributeError) as exc:
        return False, {"ready": f"{type(exc).__name__}: {exc}"}
