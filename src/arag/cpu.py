"""What the CPU is, from /proc/cpuinfo: its flags, name and vendor (empty where unreadable: not
Linux). Read by the llama.cpp build choice, training's kernel pins and the int8 models' arithmetic."""

from __future__ import annotations

from pathlib import Path

CPUINFO = Path("/proc/cpuinfo")


def _cpuinfo_field(name: str, cpuinfo: Path) -> str | None:
    """The first ``name : value`` line's value in /proc/cpuinfo (None where absent or unreadable)."""
    try:
        text = cpuinfo.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith(name):
            return line.split(":", 1)[1]
    return None


def read_cpu_flags(cpuinfo: Path = CPUINFO) -> frozenset[str]:
    """Every flag the CPU lists (empty where /proc/cpuinfo cannot be read: not Linux)."""
    return frozenset((_cpuinfo_field("flags", cpuinfo) or "").split())


def cpu_name(cpuinfo: Path = CPUINFO) -> str:
    """The CPU's model name, for reports whose timings depend on it ("" where it cannot be read)."""
    return " ".join((_cpuinfo_field("model name", cpuinfo) or "").split())


def cpu_vendor(cpuinfo: Path = CPUINFO) -> str:
    """The CPU's vendor id ("GenuineIntel", "AuthenticAMD"; "" where it cannot be read)."""
    return (_cpuinfo_field("vendor_id", cpuinfo) or "").strip()
