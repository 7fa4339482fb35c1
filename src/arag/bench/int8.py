"""The int8 models' arithmetic on this CPU: the derived embedder run by ONNX Runtime's own uint8 x
int8 kernels against the uint8 rewrite (models/onnx_int8.py), on the same chunk texts in one run.
Where the CPU clamps (no VNNI or AMX) arag runs the rewrite; this says what that costs and how far
the vectors the CPU's own kernels give are from the exact ones."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import numpy as np
from pydantic import BaseModel

from arag.cpu import cpu_name
from arag.errors import ConfigError
from arag.settings import Settings


class Int8Bench(BaseModel):
    cpu: str
    # This CPU's uint8 x int8 kernels clamp pairs of products at 16 bits (so arag runs the rewrite).
    clamps: bool
    texts: int
    repeats: int
    own_kernels_texts_per_s: float
    rewrite_texts_per_s: float
    # How many times as long the rewrite takes (own kernels' rate / the rewrite's).
    rewrite_cost: float
    identical: bool
    cosine_median: float
    cosine_min: float


def run_int8_bench(settings: Settings, texts: int = 400, repeats: int = 3) -> Int8Bench:
    """Both ways on ``texts`` chunk texts, alternating, ``repeats`` timed runs each (median rate)."""
    import onnxruntime as ort

    from arag.bench.build import sample_chunk_texts
    from arag.models.factory import get_embedder
    from arag.models.onnx_files import session_options
    from arag.models.onnx_int8 import exact_int8_graph, u8s8_saturates
    from arag.models.onnx_minilm import OnnxMiniLMEmbedder

    emb = get_embedder(settings.embedding, None, models_dir=settings.embedder_dir)
    if not isinstance(emb, OnnxMiniLMEmbedder) or settings.embedding.int8 != "dynamic":
        raise ConfigError(
            "the int8 bench measures the default embedder, the dynamic int8 MiniLM",
            where="ARAG_EMBEDDING__PROVIDER / ARAG_EMBEDDING__INT8",
            fix="unset them (onnx-minilm, dynamic) for this bench",
        )
    sample = sample_chunk_texts(settings, emb, texts)
    data = emb.model_path.read_bytes()
    options = session_options(settings.embedding.threads)
    sessions = {
        name: ort.InferenceSession(graph, sess_options=options, providers=["CPUExecutionProvider"])
        for name, graph in (("own", data), ("rewrite", exact_int8_graph(data, saturates=True)))
    }
    vectors: dict[str, np.ndarray] = {}
    rates: dict[str, list[float]] = {"own": [], "rewrite": []}

    def timed(name: str) -> Callable[[], None]:
        def run() -> None:
            emb.session = sessions[name]
            t0 = time.perf_counter()
            vectors[name] = emb.embed_batch(sample)
            rates[name].append(len(sample) / (time.perf_counter() - t0))

        return run

    # An untimed warm-up each, then ABBA order so drift in the machine's load falls on both.
    for name in sessions:
        emb.session = sessions[name]
        emb.embed_batch(sample[:8])
    for k in range(repeats):
        order = ("own", "rewrite") if k % 2 == 0 else ("rewrite", "own")
        for name in order:
            timed(name)()
    own, rewrite = statistics.median(rates["own"]), statistics.median(rates["rewrite"])
    cosine = (vectors["own"] * vectors["rewrite"]).sum(axis=1)
    return Int8Bench(
        cpu=cpu_name() or "unknown",
        clamps=u8s8_saturates(),
        texts=len(sample),
        repeats=repeats,
        own_kernels_texts_per_s=own,
        rewrite_texts_per_s=rewrite,
        rewrite_cost=own / rewrite,
        identical=bool(np.array_equal(vectors["own"], vectors["rewrite"])),
        cosine_median=float(np.median(cosine)),
        cosine_min=float(cosine.min()),
    )
