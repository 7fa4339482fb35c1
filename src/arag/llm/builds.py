"""Which llama.cpp build the model process runs, chosen at run time.

The venv's own llama-cpp-python is the portable build (AVX2, no AVX-512 or AMX: see the Makefile);
it runs on every x86-64 CPU since about 2015. On a CPU with AVX-512, set-up also installs a second
build beside it (``<venv>/llama-builds/avx512``): the same llama.cpp with AVX-512 kernels, whose
prefill (what an answer mostly waits for) is 1.5x (0.5B) to 1.8x (1.5B) the portable one's (README,
*The local LLM*).

A CPU can list instructions its OS does not allow, and a build that uses one dies with SIGILL only
on a long prompt. So ``auto`` runs the faster build only where three things hold: it is installed,
the CPU lists every instruction it needs, and ``arag llm check --build all`` (set-up runs it) passed
with it on a CPU with exactly these flags, which leaves a stamp in the build's folder. Anything else
runs the portable build. The child process gets the build's folder first on its ``PYTHONPATH``;
this process never loads it.
"""

from __future__ import annotations

import hashlib
import sys
from dataclasses import dataclass
from pathlib import Path

from arag.cpu import read_cpu_flags
from arag.errors import ConfigError
from arag.settings import LlamaBuild

PORTABLE = "portable"
# The instructions each extra build was compiled for (Linux /proc/cpuinfo names). The Makefile's
# recipe for it must ask for no more than these.
REQUIRES: dict[str, tuple[str, ...]] = {
    "avx512": ("avx512f", "avx512cd", "avx512vl", "avx512dq", "avx512bw", "avx512vbmi", "avx512_vnni"),
}
_STAMP = ".checked-"


@dataclass(frozen=True)
class Build:
    """A llama.cpp build: ``path`` is the folder that holds its ``llama_cpp`` package (None: the
    venv's own, the portable build)."""

    name: str
    path: Path | None = None
    why: str = ""


def builds_root() -> Path:
    """Where set-up installs the extra builds: inside the venv, beside the portable one."""
    return Path(sys.prefix) / "llama-builds"


def cpu_signature(flags: frozenset[str]) -> str:
    """A short name for a set of CPU flags: a check passed on one signature vouches for no other."""
    return hashlib.sha256(" ".join(sorted(flags)).encode()).hexdigest()[:16]


def installed(root: Path) -> list[str]:
    """The extra builds installed under ``root``."""
    return [n for n in REQUIRES if (root / n / "llama_cpp" / "__init__.py").is_file()]


def missing_instructions(name: str, flags: frozenset[str]) -> list[str]:
    """The instructions build ``name`` needs that the CPU does not list."""
    return [f for f in REQUIRES.get(name, ()) if f not in flags]


def checked(root: Path, name: str, flags: frozenset[str]) -> bool:
    """Whether ``arag llm check`` passed with build ``name`` on a CPU with these flags."""
    return (root / name / f"{_STAMP}{cpu_signature(flags)}").is_file()


def record_check(root: Path, name: str, flags: frozenset[str], passed: bool) -> None:
    """Leave (or remove) the stamp of a check of build ``name`` on this CPU."""
    stamp = root / name / f"{_STAMP}{cpu_signature(flags)}"
    if passed:
        stamp.write_text(" ".join(sorted(flags)) + "\n", encoding="utf-8")
    else:
        stamp.unlink(missing_ok=True)


def get_build(name: str, root: Path) -> Build:
    """Build ``name`` as installed (portable: the venv's own)."""
    return Build(PORTABLE) if name == PORTABLE else Build(name, root / name)


def choose_build(choice: LlamaBuild, root: Path | None = None, flags: frozenset[str] | None = None) -> Build:
    """The build the settings' ``choice`` names on this CPU (see the module's docstring). An
    explicit extra build that is not installed, or needs instructions the CPU lacks, is a
    ConfigError; ``auto`` says in ``why`` what kept it on the portable build."""
    root = builds_root() if root is None else root
    flags = read_cpu_flags() if flags is None else flags
    if choice == PORTABLE:
        return Build(PORTABLE, why="ARAG_LLM__BUILD=portable")
    if choice != "auto":
        if choice not in installed(root):
            raise ConfigError(
                f"the {choice} llama.cpp build is not installed",
                where=str(root / choice),
                fix="run `make venv` on a CPU with AVX-512 (set-up builds it there), or set "
                "ARAG_LLM__BUILD=auto",
            )
        lacking = missing_instructions(choice, flags)
        if lacking:
            raise ConfigError(
                f"the {choice} llama.cpp build needs instructions this CPU does not list: "
                + " ".join(lacking),
                where="ARAG_LLM__BUILD",
                fix="set ARAG_LLM__BUILD=auto (or portable)",
            )
        return get_build(choice, root)
    why = []
    for name in installed(root):
        lacking = missing_instructions(name, flags)
        if lacking:
            why.append(f"{name}: the CPU lacks {' '.join(lacking)}")
        elif not checked(root, name, flags):
            why.append(f"{name}: not checked on this CPU (run `arag llm check --build all`)")
        else:
            return get_build(name, root)
    return Build(PORTABLE, why="; ".join(why) or "no other build is installed")


def candidates(root: Path | None = None, flags: frozenset[str] | None = None) -> list[Build]:
    """The builds ``arag llm check --build all`` runs: the portable one, then each installed extra
    build whose instructions the CPU lists."""
    root = builds_root() if root is None else root
    flags = read_cpu_flags() if flags is None else flags
    extra = [get_build(n, root) for n in installed(root) if not missing_instructions(n, flags)]
    return [Build(PORTABLE), *extra]
