"""The llama.cpp build chosen at run time (llm/builds.py): the portable one everywhere, the AVX-512
one only where it is installed, the CPU lists its instructions and a check passed with it on this
CPU; the model process imports the chosen build; a build that dies in its check is left unused."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from arag.cpu import read_cpu_flags
from arag.errors import ConfigError, ModelError
from arag.llm.builds import (
    PORTABLE,
    REQUIRES,
    Build,
    candidates,
    checked,
    choose_build,
    cpu_signature,
    installed,
    record_check,
)
from arag.llm.check import check_builds
from arag.llm.process import ModelProcess, child_env
from arag.settings import LLMSettings

FAKE = [sys.executable, str(Path(__file__).parent / "fixtures" / "fake_model_server.py")]
ROOT = Path(__file__).resolve().parents[1]
AVX512 = frozenset({"sse4_2", "avx", "avx2", "fma", *REQUIRES["avx512"]})
AVX2 = frozenset({"sse4_2", "avx", "avx2", "fma"})


def install(root: Path, name: str = "avx512", info: str = "FAKE = 1 | AVX512 = 1") -> Path:
    """A stand-in build folder: a ``llama_cpp`` package (what :func:`installed` looks for) and the
    system info the stand-in server reports for it."""
    folder = root / name
    (folder / "llama_cpp").mkdir(parents=True)
    (folder / "llama_cpp" / "__init__.py").write_text("")
    (folder / "fake_build.txt").write_text(info)
    return folder


def test_cpu_flags_are_read_from_cpuinfo(tmp_path: Path) -> None:
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nflags\t\t: fpu avx2 avx512f\nbugs\t\t: none\n")
    assert read_cpu_flags(info) == {"fpu", "avx2", "avx512f"}
    assert read_cpu_flags(tmp_path / "missing") == frozenset()
    assert cpu_signature(frozenset({"b", "a"})) == cpu_signature(frozenset({"a", "b"}))
    assert cpu_signature(AVX512) != cpu_signature(AVX2)


def test_auto_is_portable_until_the_build_is_installed_listed_and_checked(tmp_path: Path) -> None:
    assert choose_build("auto", tmp_path, AVX512) == Build(PORTABLE, why="no other build is installed")
    folder = install(tmp_path)
    assert installed(tmp_path) == ["avx512"]
    unchecked = choose_build("auto", tmp_path, AVX512)
    assert unchecked.name == PORTABLE and "not checked on this CPU" in unchecked.why
    record_check(tmp_path, "avx512", AVX512, passed=True)
    assert checked(tmp_path, "avx512", AVX512)
    assert choose_build("auto", tmp_path, AVX512) == Build("avx512", folder)
    # The same folder on a CPU without AVX-512 (a venv moved, a laptop): portable, and why.
    other = choose_build("auto", tmp_path, AVX2)
    assert other.name == PORTABLE and "lacks avx512f" in other.why
    # A check passed on one CPU vouches for no other, even one that lists the instructions too.
    assert choose_build("auto", tmp_path, AVX512 | {"avx512_bf16"}).name == PORTABLE
    record_check(tmp_path, "avx512", AVX512, passed=False)
    assert choose_build("auto", tmp_path, AVX512).name == PORTABLE
    assert choose_build("portable", tmp_path, AVX512).name == PORTABLE


def test_an_explicit_build_that_cannot_run_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        choose_build("avx512", tmp_path, AVX512)
    assert "not installed" in str(err.value) and "make venv" in (err.value.fix or "")
    folder = install(tmp_path)
    with pytest.raises(ConfigError) as err:
        choose_build("avx512", tmp_path, AVX2)
    assert "avx512f" in str(err.value) and err.value.where == "ARAG_LLM__BUILD"
    # Asked for by name it runs unchecked: the user chose it (the check's stamp is for auto).
    assert choose_build("avx512", tmp_path, AVX512) == Build("avx512", folder)


def test_candidates_are_portable_then_what_the_cpu_lists(tmp_path: Path) -> None:
    assert candidates(tmp_path, AVX512) == [Build(PORTABLE)]
    folder = install(tmp_path)
    assert candidates(tmp_path, AVX512) == [Build(PORTABLE), Build("avx512", folder)]
    assert candidates(tmp_path, AVX2) == [Build(PORTABLE)]


def test_the_child_imports_the_chosen_build_first(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    assert child_env(Build(PORTABLE))["PYTHONPATH"] == "/elsewhere"
    assert child_env(Build("avx512", tmp_path))["PYTHONPATH"] == f"{tmp_path}:/elsewhere"
    monkeypatch.delenv("PYTHONPATH")
    assert child_env(Build("avx512", tmp_path))["PYTHONPATH"] == str(tmp_path)
    proc = ModelProcess(
        tmp_path / "m.gguf",
        alias="fake",
        threads=1,
        context_tokens=512,
        log_dir=tmp_path / "logs",
        start_timeout_s=20,
        command=FAKE,
        build=Build("avx512", install(tmp_path / "builds")),
    )
    proc.start()
    try:
        info = proc.info()
        assert info.build == "FAKE = 1 | AVX512 = 1" and info.build_name == "avx512"
    finally:
        proc.stop()


def check_all(tmp_path: Path, root: Path, flags: frozenset[str]) -> list:  # type: ignore[type-arg]
    return check_builds(
        tmp_path / "m.gguf",
        LLMSettings(start_timeout_s=20),
        candidates(root, flags),
        name="fake",
        log_dir=tmp_path / "logs",
        root=root,
        flags=flags,
        command=FAKE,
    )


def test_a_build_that_passes_its_check_is_what_auto_runs(tmp_path: Path) -> None:
    root = tmp_path / "builds"
    folder = install(root)
    checks = check_all(tmp_path, root, AVX512)
    assert [c.build_name for c in checks] == [PORTABLE, "avx512"]
    assert checks[0].result is not None and checks[0].result.build == "FAKE = 1"
    assert checks[1].result is not None and checks[1].result.build == "FAKE = 1 | AVX512 = 1"
    assert checks[1].result.build_name == "avx512" and checks[1].error is None
    assert choose_build("auto", root, AVX512) == Build("avx512", folder)


def test_a_build_that_dies_in_its_check_is_left_unused(tmp_path: Path) -> None:
    root = tmp_path / "builds"
    install(root, info="FAKE = 1 | AVX512 = 1 | SIGILL")
    record_check(root, "avx512", AVX512, passed=True)  # an earlier check, on this CPU, passed
    checks = check_all(tmp_path, root, AVX512)
    assert checks[0].result is not None and checks[1].result is None
    assert "SIGILL" in (checks[1].error or "")
    assert not checked(root, "avx512", AVX512)
    assert choose_build("auto", root, AVX512).name == PORTABLE
    # Checked alone (not --build all), its failure is the command's.
    with pytest.raises(ModelError, match="SIGILL"):
        check_builds(
            tmp_path / "m.gguf",
            LLMSettings(start_timeout_s=20),
            [choose_build("avx512", root, AVX512)],
            name="fake",
            log_dir=tmp_path / "logs",
            root=root,
            flags=AVX512,
            command=FAKE,
            keep_going=False,
        )


def test_the_makefile_builds_what_the_choice_requires() -> None:
    """The Makefile's AVX-512 recipe and the run-time check name the same instructions, and neither
    build turns on AMX or more AVX-512 than is checked for."""
    text = (ROOT / "Makefile").read_text()
    flags = re.search(r"^AVX512_FLAGS := (.+)$", text, re.M)
    assert flags is not None and tuple(flags.group(1).split()) == REQUIRES["avx512"]
    recipe = re.search(r"^LLAMA_AVX512_ARGS := ((?:.*\\\n)*.*)$", text, re.M)
    assert recipe is not None
    on = set(re.findall(r"-DGGML_(\w+)=ON", recipe.group(1)))
    assert on == {"AVX", "AVX2", "FMA", "F16C", "BMI2", "AVX512", "AVX512_VBMI", "AVX512_VNNI"}
    assert "-DGGML_NATIVE=OFF" in recipe.group(1)
    for amx in ("AMX_TILE", "AMX_INT8", "AMX_BF16"):
        assert f"-DGGML_{amx}=OFF" in recipe.group(1)
