"""The same weights on every x86-64 CPU: training pins PyTorch's CPU kernels to their AVX2 branches.

Training is deterministic on one machine (fixed seed, data order and threads), but the float sums
inside a step depend on which kernels the libraries pick for the CPU: ATen's vectorised ops (AVX2
or AVX-512), MKL's GEMMs and oneDNN's. Over ~700 steps a last-bit difference becomes another model:
on 2026-12-05 a Xeon with AMX trained another reranker file than the AVX-512 machine of the day
before (0.578 nDCG@10 against 0.583). Each library reads an environment variable that fixes its
branch, once, at its first use, so :func:`pin_portable_kernels` must run before torch computes
anything in the process (importing it is fine). AVX2 is what every x86-64 CPU since 2013-2015 has,
the floor the portable llama.cpp build assumes too.

MKL's AVX2 branch exists on Intel CPUs only: elsewhere MKL runs its AUTO branch (Intel's CNR
documentation), so an AMD CPU trains weights of its own with the same pins (a small net's 5 steps:
486cf399 on a Xeon, 3c5dc745 on an EPYC, 2026-12-07). Only MKL's SSE2 ``COMPATIBLE`` branch is
common to both, at 2.3x the time of a matrix product on that EPYC, so training keeps the fast branch
and the card says which kind of file it wrote.
"""

from __future__ import annotations

import logging
import os
import platform
from pathlib import Path

from arag.cpu import CPUINFO, cpu_vendor, read_cpu_flags

log = logging.getLogger(__name__)

# ATen's dispatch, MKL's Conditional Numerical Reproducibility branch, oneDNN's highest ISA.
PORTABLE_ENV = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"}
PORTABLE = "avx2"
# The vendor whose CPUs share MKL's AVX2 branch (others run MKL's AUTO branch).
MKL_BRANCH_VENDOR = "GenuineIntel"


def cpu_has_avx2(cpuinfo: Path = CPUINFO) -> bool:
    """Whether this x86-64 CPU lists AVX2 and FMA (False where it cannot be told)."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return False
    return {"avx2", "fma"} <= read_cpu_flags(cpuinfo)


def pin_portable_kernels() -> None:
    """Set the variables that pin torch's kernels to AVX2, where the CPU has it.

    Overrides values a user set: the point is that every machine of a kind trains the same file. A process
    where torch has already computed keeps its kernels; :func:`kernels_in_use` then says so."""
    if cpu_has_avx2():
        os.environ.update(PORTABLE_ENV)


def kernels_in_use() -> str:
    """``avx2`` when training runs on the pinned kernels of an Intel CPU (the weights every Intel
    x86-64 CPU with AVX2 trains), else ``native-<capability>``, with the vendor where only MKL's
    branch is the CPU's own (``native-amd-avx2``): the weights are this kind of CPU's."""
    import torch

    capability = str(torch.backends.cpu.get_cpu_capability()).lower()
    pinned = all(os.environ.get(k) == v for k, v in PORTABLE_ENV.items())
    if pinned and capability == PORTABLE:
        vendor = cpu_vendor()
        if vendor == MKL_BRANCH_VENDOR:
            return PORTABLE
        name = {"AuthenticAMD": "amd"}.get(vendor, vendor.lower() or "unknown")
        log.warning(
            "training on this CPU (%s): MKL's AVX2 branch is Intel's only, so the model file will "
            "differ from the one Intel CPUs train (same recipe, same quality within noise)",
            vendor or "vendor unknown",
        )
        return f"native-{name}-{capability}"
    log.warning(
        "training on this CPU's own kernels (%s), not the portable AVX2 ones: the model file will "
        "differ from other machines' (run the training in a fresh process, e.g. `arag train ...`, "
        "on an x86-64 CPU with AVX2 for the portable one)",
        capability,
    )
    return f"native-{capability}"
