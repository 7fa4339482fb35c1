"""The test harness itself: with ARAG_REQUIRE_SHARED (set by .ci/run) a missing ../shared fails the
run instead of skipping most of it. Runs pytest in a subprocess with ../shared hidden by a plugin."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
HIDE = "import arag.settings\narag.settings.find_shared_dir = lambda: None\n"


def _pytest(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "hide_shared.py").write_text(HIDE)
    full = dict(os.environ, **env)
    path = [str(tmp_path), str(REPO / "src"), str(REPO / "tests"), full.get("PYTHONPATH", "")]
    full["PYTHONPATH"] = os.pathsep.join(path)
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args]
    return subprocess.run(cmd, cwd=REPO, env=full, capture_output=True, text=True, timeout=300)


def test_ci_sets_the_switch() -> None:
    lines = (REPO / ".ci" / "run").read_text().splitlines()
    assert "export ARAG_REQUIRE_SHARED=1" in lines
    assert lines.index("export ARAG_REQUIRE_SHARED=1") < lines.index("make test")


@pytest.mark.parametrize("required", [False, True])
def test_missing_shared_skips_or_fails_the_run(tmp_path: Path, required: bool) -> None:
    target = "tests/test_cli.py::test_status_of_an_empty_library_says_what_to_do"
    env = {"ARAG_REQUIRE_SHARED": "1" if required else "0"}
    res = _pytest(tmp_path, "-p", "hide_shared", target, **env)
    if not required:
        assert res.returncode == 0, res.stdout + res.stderr
        return
    assert res.returncode != 0
    out = res.stdout + res.stderr
    assert "ARAG_REQUIRE_SHARED is set" in out and "missing" in out


def test_a_skip_for_a_missing_shared_file_fails_when_required(tmp_path: Path, shared_dir: Path) -> None:
    probe = tmp_path / "probe" / "test_probe.py"
    probe.parent.mkdir()
    probe.write_text(
        "import pytest\n\n\n"
        "def test_needs_a_file(shared_dir):\n"
        "    pytest.skip(f\"{shared_dir / 'benchmarks' / 'no-such-file.json'} is missing\")\n"
    )
    # The repository's conftest as a plugin, on a test outside the repository.
    args = ("-p", "conftest", "--rootdir", str(probe.parent), str(probe))
    skipped = _pytest(tmp_path, *args, ARAG_REQUIRE_SHARED="0")
    failed = _pytest(tmp_path, *args, ARAG_REQUIRE_SHARED="1")
    assert skipped.returncode == 0 and "1 skipped" in skipped.stdout, skipped.stdout
    assert failed.returncode == 1 and "1 failed" in failed.stdout, failed.stdout
    assert "no-such-file.json is missing" in failed.stdout
