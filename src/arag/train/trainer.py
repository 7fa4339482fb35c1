"""What ``arag train reranker`` and ``arag train support`` share: the library the data is mined from,
progress, and the run after mining (train, export fp32 and int8, check the export, score both on the
calibration questions (held-out train papers by default), choose one, write the card, install). Each
pipeline supplies its training records, its :class:`Evaluator` and its model card. The model folder is
replaced in one rename, so a crash leaves the previous model (or none), never half of one."""

from __future__ import annotations

import contextlib
import hashlib
import logging
import shutil
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import numpy as np
from pydantic import BaseModel

from arag.corpus.qasper_questions import EvalQuestion
from arag.errors import ModelError
from arag.index.store import Store
from arag.library.build import Progress
from arag.models.embedder import BaseEmbedder
from arag.models.onnx_files import CARD_FILE, MODEL_FILE, file_sha256
from arag.models.reranker import ModelCard, OnnxReranker
from arag.settings import Settings
from arag.train.data import MinedQuestion
from arag.train.reranker import (
    BASE_MODEL,
    TrainConfig,
    TrainStats,
    export_onnx,
    export_variants,
    torch_scores,
    train_net,
)

if TYPE_CHECKING:
    from arag.retrieval.hybrid import HybridRetriever

log = logging.getLogger(__name__)

ProgressFactory = Callable[[str, str], AbstractContextManager[Progress]]
# The export must reproduce the PyTorch scores; fp32 ONNX differs from PyTorch by rounding only.
EXPORT_TOLERANCE = 1e-3
T = TypeVar("T")
R = TypeVar("R")


@contextlib.contextmanager
def quiet(label: str, unit: str) -> Iterator[Progress]:
    """A progress factory that shows nothing (the default outside the CLI)."""
    yield Progress()


def each(
    progress: ProgressFactory, label: str, unit: str, items: Sequence[T], fn: Callable[[T], R]
) -> list[R]:
    """``fn`` of every item, in order, behind one progress bar."""
    with progress(label, unit) as bar:
        bar.start(len(items))
        out = []
        for x in items:
            out.append(fn(x))
            bar.advance(1)
        return out


# --- the library the data is mined from ----------------------------------------------------------


def library_key(settings: Settings) -> str:
    """The built library's identity (its papers' build keys, embedding model and retrieval
    settings): mined data is cached under it."""
    from arag.library.state import LibraryState

    with LibraryState(settings.state_db) as state:
        keys = state.build_keys()
        model = state.get_meta("embedding_model")
    blob = "\n".join(f"{k}={v}" for k, v in sorted(keys.items())) + f"\n{model}\n{settings.retrieval!r}"
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def in_library(
    qs: list[EvalQuestion], papers: set[str], what: str, where: str = "arag train reranker"
) -> list[EvalQuestion]:
    """The questions whose paper is in the library; a ModelError when none is (a warning when
    more than a tenth are missing)."""
    if not qs:
        raise ModelError(
            f"there are no {what} questions to use",
            where=where,
            fix="pass a larger limit (e.g. --val-limit), or leave the limits out to use every question",
        )
    kept = [q for q in qs if q.paper_id in papers]
    if not kept:
        raise ModelError(
            f"none of the {len(qs)} {what} questions' papers is in the library",
            where=where,
            fix="build the full QASPER library first: arag library build",
        )
    if len(kept) < 0.9 * len(qs):
        log.warning("only %d of %d %s questions have their paper in the library", len(kept), len(qs), what)
    return kept


@contextlib.contextmanager
def mining_retrievers(
    settings: Settings, library: tuple[Store, BaseEmbedder] | None = None
) -> Iterator[tuple[Store, HybridRetriever, HybridRetriever]]:
    """(store, plain hybrid retriever, paper-resolving one) of the library, opened here and closed
    on exit; or, with ``library``, over a store and embedder the caller holds open (the service
    trains in the background), left open."""
    from arag.library.manage import load_resolver, open_retrieval
    from arag.retrieval.hybrid import HybridRetriever

    if library is not None:
        store, embedder = library
        plain = HybridRetriever(store, embedder, settings.retrieval)
        yield store, plain, HybridRetriever(store, embedder, settings.retrieval, load_resolver(settings))
        return
    with open_retrieval(settings) as retrieval:
        yield retrieval.store, retrieval.plain, retrieval.hybrid


# --- export and install -------------------------------------------------------------------------


def check_export(
    net: Any, model: OnnxReranker, query: str, texts: Sequence[str], max_length: int, *, where: Path
) -> None:
    """A ModelError unless the exported ``model`` scores ``texts`` (and a short passage) as ``net`` does."""
    # A long and a short passage in one batch: the check covers truncation and padding.
    texts = [*texts, "A short passage."]
    ref = torch_scores(net, query, texts, max_length)
    got = model.score(query, texts)
    if float(np.max(np.abs(ref - got))) > EXPORT_TOLERANCE:
        raise ModelError(
            f"the ONNX export differs from the PyTorch model by {np.max(np.abs(ref - got)):.4g}",
            where=str(where),
            fix="report this as a bug; the PyTorch model is not installed",
        )


def install_model(work: Path, out_dir: Path, card: BaseModel) -> None:
    """Write ``card`` into ``work`` (which holds model.onnx) and put ``work`` in ``out_dir``'s place:
    renames only, so a crash leaves the previous model (or none), never half of one."""
    (work / CARD_FILE).write_text(card.model_dump_json(indent=2))
    old = out_dir.with_name(out_dir.name + ".old")
    if old.exists():
        shutil.rmtree(old)
    if out_dir.exists():
        out_dir.rename(old)
    work.rename(out_dir)
    if old.exists():
        shutil.rmtree(old)


# --- the run after mining -------------------------------------------------------------------------


class Evaluator(Protocol):
    """How a pipeline measures an exported model on its validation set."""

    # The unit of the validation progress bar ("questions", "pairs").
    unit: str
    # The metric whose int8 drop (fp32's minus int8's) decides the quantisation ("ndcg@10", "auc").
    metric: str
    # The models' max length at query time (None: the card's).
    max_length: int | None
    # The time ``score`` may take per unit at query time (ms; None: no budget). With
    # ``--quantize auto`` an fp32 model over it is not kept, whatever int8's drop.
    budget_ms: float | None

    @property
    def size(self) -> int:
        """How many units the validation set has."""
        ...

    def sample(self) -> tuple[str, list[str]]:
        """A query and a few passages the export check scores."""
        ...

    def score(self, model: OnnxReranker, bar: Progress) -> tuple[Any, float]:
        """The model's scores of the validation set and its speed (ms per list or pair)."""
        ...

    def metrics(self, scores: Any) -> dict[str, Any]:
        """The figures of ``scores`` (they include ``metric``)."""
        ...


@dataclass
class Run:
    """One exported variant on validation."""

    scores: Any
    ms: float
    metrics: dict[str, Any]


@dataclass
class Trained:
    """What the run hands the pipeline's card: training figures, both variants, the choice."""

    cfg: TrainConfig
    stats: TrainStats
    runs: dict[str, Run]
    # The loaded variants (their sessions hold the weights; the files are gone).
    models: dict[str, OnnxReranker]
    chosen: str
    drop: float
    digest: str

    @property
    def quantized(self) -> bool:
        return self.chosen == "int8"

    def card_fields(self) -> dict[str, Any]:
        """The fields both model cards fill alike."""
        return {
            "base_model": BASE_MODEL,
            "layers": self.cfg.layers,
            "max_length": self.cfg.max_length,
            "quantized": self.quantized,
            "onnx_sha256": self.digest,
            "created": datetime.now(UTC).isoformat(timespec="seconds"),
            "seed": self.cfg.seed,
            "training": {**self.cfg.model_dump(), **self.stats.model_dump()},
        }


def train_and_install(
    mined: list[MinedQuestion],
    cfg: TrainConfig,
    out_dir: Path,
    evaluator: Evaluator,
    make_card: Callable[[Trained], ModelCard],
    *,
    prefix: str,
    progress: ProgressFactory = quiet,
) -> ModelCard:
    """Train on ``mined``, export fp32 and int8, check the export, score both with ``evaluator``,
    keep int8 when ``cfg.quantize`` says so (``auto``: when its drop in the evaluator's metric is at
    most ``cfg.max_int8_ndcg_drop``, or when fp32 is over the evaluator's time budget), and install
    it in ``out_dir`` with ``make_card``'s card.
    ``prefix``: of the work folder beside ``out_dir``, removed unless installed."""
    with progress("training", "steps") as bar:
        net, stats = train_net(mined, cfg, on_start=bar.start, on_step=bar.advance)

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(dir=out_dir.parent, prefix=prefix))
    try:
        fp32, int8, draft = export_variants(
            lambda path: export_onnx(net, path, cfg.max_length),
            ModelCard,
            layers=cfg.layers,
            max_length=cfg.max_length,
            seed=cfg.seed,
            work=work,
        )
        runs: dict[str, Run] = {}
        models: dict[str, OnnxReranker] = {}
        for name, path in (("fp32", fp32), ("int8", int8)):
            model = models[name] = OnnxReranker(
                work, threads=cfg.threads, card=draft, model_file=path, max_length=evaluator.max_length
            )
            if name == "fp32":
                query, texts = evaluator.sample()
                check_export(net, model, query, texts, model.max_length, where=fp32)
            with progress(f"validating {name}", evaluator.unit) as bar:
                bar.start(evaluator.size)
                scores, ms = evaluator.score(model, bar)
            runs[name] = Run(scores, ms, evaluator.metrics(scores))
        drop = runs["fp32"].metrics[evaluator.metric] - runs["int8"].metrics[evaluator.metric]
        over_budget = evaluator.budget_ms is not None and runs["fp32"].ms > evaluator.budget_ms
        holds = drop <= cfg.max_int8_ndcg_drop
        use_int8 = cfg.quantize == "int8" or (cfg.quantize == "auto" and (holds or over_budget))
        chosen = "int8" if use_int8 else "fp32"
        shutil.copyfile(int8 if use_int8 else fp32, work / MODEL_FILE)
        for f in (fp32, int8):
            f.unlink()
        digest = file_sha256(work / MODEL_FILE)
        card = make_card(Trained(cfg, stats, runs, models, chosen, drop, digest))
        install_model(work, out_dir, card)
    finally:
        if work.exists():
            shutil.rmtree(work, ignore_errors=True)
    return card
