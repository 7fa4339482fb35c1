"""Progress where stderr is not a terminal (a log file, CI): plain lines, not a bar drawn once at the end."""

from __future__ import annotations

from arag.cli.common import PlainProgress, format_seconds


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_line_per_tenth_of_the_work_with_rate_and_eta() -> None:
    lines: list[str] = []
    clock = Clock()
    p = PlainProgress("training", "steps", lines.append, interval_s=1e9, min_gap_s=5, clock=clock)
    p.start(100)
    for _ in range(100):
        clock.now += 0.5
        p.advance(1)
    p.finish()
    assert lines[0] == "training: 0/100 steps"
    assert len(lines) == 11  # the start, then 10%, 20%, ..., 100% (5 s apart); finish adds nothing
    assert lines[1] == "training: 10/100 steps (10%), 2 steps/s, 0:00:05 elapsed, ETA 0:00:45"
    assert lines[-1] == "training: 100/100 steps (100%), 2 steps/s, 0:00:50 elapsed"


def test_slow_work_reports_between_tenths_and_an_unfinished_stage_at_the_end() -> None:
    lines: list[str] = []
    clock = Clock()
    p = PlainProgress("eval", "questions", lines.append, interval_s=60, clock=clock)
    p.start(1000)
    for _ in range(3):  # 3 questions in 90 s: under a tenth, but past the interval once
        clock.now += 30
        p.advance(1)
    assert lines[1:] == ["eval: 2/1000 questions (0%), 0.0333 questions/s, 0:01:00 elapsed, ETA 8:19:00"]
    p.finish()  # stopped early (Ctrl-C, an error): where it stopped is the last line
    assert lines[-1].startswith("eval: 3/1000 questions (0%)")


def test_a_fast_stage_is_two_lines() -> None:
    lines: list[str] = []
    clock = Clock()
    p = PlainProgress("hybrid", "questions", lines.append, clock=clock)
    p.start(60)
    for _ in range(60):
        clock.now += 0.03
        p.advance(1)
    p.finish()
    assert lines == [
        "hybrid: 0/60 questions",
        "hybrid: 60/60 questions (100%), 33.3 questions/s, 0:00:02 elapsed",
    ]


def test_unknown_total_reports_by_time_only() -> None:
    lines: list[str] = []
    clock = Clock()
    p = PlainProgress("scan", "files", lines.append, interval_s=10, clock=clock)
    for _ in range(5):
        clock.now += 4
        p.advance(2)
    assert lines == ["scan: 6 files, 0.5 files/s, 0:00:12 elapsed"]
    p.finish()
    assert lines[-1] == "scan: 10 files, 0.5 files/s, 0:00:20 elapsed"


def test_format_seconds() -> None:
    assert format_seconds(0) == "0:00:00"
    assert format_seconds(3725.4) == "1:02:05"
