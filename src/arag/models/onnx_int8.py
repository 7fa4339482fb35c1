"""The same int8 products on every CPU.

Our int8 models (the derived embedder, the trained reranker and readers) multiply uint8 activations
by int8 weights in ONNX Runtime's ``MatMulInteger``. On a CPU with VNNI (or AMX) its kernels sum
these products exactly in 32 bits. On an x86-64 CPU without VNNI (AMD before Zen 4; Intel Xeons
before Cascade Lake, laptops and desktops before Ice Lake) they use ``VPMADDUBSW``, which adds two
products into 16 bits and clamps what does not fit: 255 x 127 twice is 64,770, kept as 32,767.
Such a CPU computed other vectors and scores (an AMD EPYC with AVX2 only: the embedder's vectors at
cosine median 0.9935, min 0.987 to the exact ones on 400 chunk texts, ``arag bench int8``; README,
*Figures*).

Shifting the weights and their zero point by +128 to uint8 keeps every product, since
``(a - za)(w + 128 - (zw + 128)) = (a - za)(w - zw)``, and ONNX Runtime's uint8 x uint8 kernels widen
to 16 bits before they multiply, so nothing is clamped. Where the CPU lacks VNNI the graph is
rewritten so in memory when it is opened: the file, and the sha256 its card names, stay as they are.
"""

from __future__ import annotations

import platform
from typing import TYPE_CHECKING

from arag.cpu import read_cpu_flags

if TYPE_CHECKING:
    import onnx

# Any of these gives ONNX Runtime exact uint8 x int8 kernels (VPDPBUSD, or AMX tiles).
EXACT_U8S8_FLAGS = frozenset({"avx512_vnni", "avx_vnni", "amx_int8"})
X86 = frozenset({"x86_64", "amd64", "i386", "i686", "x86"})
_WEIGHT, _WEIGHT_ZERO_POINT = 1, 3  # MatMulInteger's inputs: A, B, a_zero_point, b_zero_point


def u8s8_saturates(flags: frozenset[str] | None = None, machine: str | None = None) -> bool:
    """True on an x86 CPU whose flags list no VNNI or AMX: ONNX Runtime's uint8 x int8 products
    there clamp pairs at 16 bits (an unreadable /proc/cpuinfo counts as such: the rewrite is exact
    anywhere, only slower)."""
    if (machine or platform.machine()).lower() not in X86:
        return False
    listed = read_cpu_flags() if flags is None else flags
    return not listed & EXACT_U8S8_FLAGS


def weights_as_uint8(model: onnx.ModelProto) -> int:
    """Rewrite each ``MatMulInteger`` whose int8 weight and zero point are initializers it alone
    reads, as uint8 shifted by +128 (the same products); returns how many matmuls."""
    import numpy as np
    from onnx import TensorProto, numpy_helper

    graph = model.graph
    # An old IR lists initializers among the inputs, typed: a caller could feed them, so they stay.
    listed = {x.name for x in graph.input}
    inits = {i.name: i for i in graph.initializer if i.name not in listed}
    readers: dict[str, list[tuple[str, int]]] = {}
    for node in graph.node:
        for k, name in enumerate(node.input):
            readers.setdefault(name, []).append((node.op_type, k))
    done = 0
    for node in graph.node:
        if node.op_type != "MatMulInteger" or len(node.input) < 2:
            continue
        weight = node.input[_WEIGHT]
        zero = node.input[_WEIGHT_ZERO_POINT] if len(node.input) > _WEIGHT_ZERO_POINT else ""
        init = inits.get(weight)
        if init is None or init.data_type != TensorProto.INT8:
            continue
        names = [weight] + ([zero] if zero else [])
        # Read by this matmul alone: a shared weight or zero point could meet one left unshifted.
        only_here = all(
            readers.get(n) == [("MatMulInteger", k)]
            for n, k in zip(names, (_WEIGHT, _WEIGHT_ZERO_POINT), strict=False)
        )
        if (zero and (zero not in inits or inits[zero].data_type != TensorProto.INT8)) or not only_here:
            continue
        for name in names:
            values = numpy_helper.to_array(inits[name]).astype(np.int16) + 128
            inits[name].CopyFrom(numpy_helper.from_array(values.astype(np.uint8), name))
        if not zero:  # a missing zero point is 0, which is 128 once shifted
            zero = f"{weight}_zero_point_uint8"
            graph.initializer.append(numpy_helper.from_array(np.array(128, dtype=np.uint8), zero))
            while len(node.input) < _WEIGHT_ZERO_POINT:
                node.input.append("")
            node.input.append(zero)
        done += 1
    return done


def exact_int8_graph(data: bytes, *, saturates: bool | None = None) -> bytes:
    """``data`` (a serialised model) as this CPU computes its int8 products exactly: unchanged
    where they already are (VNNI, AMX, not x86) or where it has no integer matmul."""
    # The CPU first: on most machines that ends it, without scanning a 56 MB model.
    if not (u8s8_saturates() if saturates is None else saturates) or b"MatMulInteger" not in data:
        return data
    import onnx

    model = onnx.load_model_from_string(data)
    return model.SerializeToString() if weights_as_uint8(model) else data
