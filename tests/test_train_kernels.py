"""Training pins torch's CPU kernels, so the same command trains the same weights on any Intel x86-64
CPU with AVX2 (and on one CPU whatever branches its environment asks for)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from arag.cpu import cpu_vendor
from arag.train import kernels
from arag.train.kernels import (
    MKL_BRANCH_VENDOR,
    PORTABLE_ENV,
    cpu_has_avx2,
    kernels_in_use,
    pin_portable_kernels,
)

pytest.importorskip("torch")

# A few AdamW steps of a small net whose matmuls, softmax and layer norm go through ATen, MKL and
# oneDNN: the weights' hash, and the kernels torch ran.
STEPS = """
import hashlib, json, sys
from arag.train.reranker import require_torch
pin = sys.argv[1] == "pin"
if pin:
    require_torch()
import torch
torch.manual_seed(0)
torch.set_num_threads(2)
net = torch.nn.Sequential(
    torch.nn.Linear(384, 1536), torch.nn.GELU(), torch.nn.LayerNorm(1536), torch.nn.Linear(1536, 384)
)
opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
x = torch.randn(96, 384)
for _ in range(5):
    out = net(x)
    loss = torch.nn.functional.cross_entropy(out.view(-1, 8), torch.zeros(out.numel() // 8, dtype=torch.long))
    opt.zero_grad()
    loss.backward()
    opt.step()
h = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in net.parameters())).hexdigest()
from arag.train.kernels import kernels_in_use
used = kernels_in_use() if pin else torch.backends.cpu.get_cpu_capability()
print(json.dumps({"hash": h, "kernels": used}))
"""


def _run(pin: bool, env: dict[str, str]) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if k not in PORTABLE_ENV}
    out = subprocess.run(
        [sys.executable, "-c", STEPS, "pin" if pin else "plain"],
        env={**base, **env},
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_cpu_has_avx2_reads_the_flags(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kernels.platform, "machine", lambda: "x86_64")
    info = tmp_path / "cpuinfo"
    info.write_text("flags\t\t: fpu sse2 avx avx2 fma f16c\n")
    assert cpu_has_avx2(info)
    info.write_text("flags\t\t: fpu sse2 avx\n")
    assert not cpu_has_avx2(info)
    assert not cpu_has_avx2(tmp_path / "missing")
    monkeypatch.setattr(kernels.platform, "machine", lambda: "arm64")
    info.write_text("flags\t\t: fpu sse2 avx avx2 fma f16c\n")
    assert not cpu_has_avx2(info)


def test_pin_overrides_a_users_choice_and_skips_a_cpu_without_avx2(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in PORTABLE_ENV:
        monkeypatch.setenv(key, "avx512")
    monkeypatch.setattr(kernels, "cpu_has_avx2", lambda: False)
    pin_portable_kernels()
    assert all(os.environ[k] == "avx512" for k in PORTABLE_ENV)
    monkeypatch.setattr(kernels, "cpu_has_avx2", lambda: True)
    pin_portable_kernels()
    assert {k: os.environ[k] for k in PORTABLE_ENV} == PORTABLE_ENV


def test_the_card_names_a_cpu_whose_mkl_branch_is_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX2")
    for key, value in PORTABLE_ENV.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(kernels, "cpu_vendor", lambda: "GenuineIntel")
    assert kernels_in_use() == "avx2"
    monkeypatch.setattr(kernels, "cpu_vendor", lambda: "AuthenticAMD")
    assert kernels_in_use() == "native-amd-avx2"
    monkeypatch.setattr(kernels, "cpu_vendor", lambda: "")
    assert kernels_in_use() == "native-unknown-avx2"
    # Unpinned, the capability alone is named, whatever the vendor.
    monkeypatch.setenv("MKL_CBWR", "AUTO")
    assert kernels_in_use() == "native-avx2"


def test_cpu_vendor_reads_the_vendor_id(tmp_path: Path) -> None:
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\nflags\t\t: fpu avx2\n")
    assert cpu_vendor(info) == "AuthenticAMD"
    assert cpu_vendor(tmp_path / "missing") == ""


@pytest.mark.skipif(not cpu_has_avx2(), reason="the pins are for x86-64 CPUs with AVX2")
def test_pinned_training_gives_the_same_weights_whatever_kernels_the_machine_would_pick() -> None:
    # Another CPU is emulated by the variables that make torch pick other kernels here.
    other_cpu = {"ATEN_CPU_CAPABILITY": "default", "MKL_CBWR": "COMPATIBLE", "ONEDNN_MAX_CPU_ISA": "SSE41"}
    pinned = _run(True, {})
    # An Intel CPU trains the portable file; another vendor's MKL runs its own branch, and the card
    # says so (the pins still make its file the same under any of this CPU's branch settings).
    if cpu_vendor() == MKL_BRANCH_VENDOR:
        assert pinned["kernels"] == "avx2"
    else:
        assert pinned["kernels"].startswith("native-") and pinned["kernels"].endswith("-avx2")
    assert _run(True, other_cpu) == pinned
    # The control: unpinned, the emulated CPU trains other weights (so the test above can fail).
    assert _run(False, other_cpu)["hash"] != _run(False, {"ATEN_CPU_CAPABILITY": "avx2"})["hash"]
