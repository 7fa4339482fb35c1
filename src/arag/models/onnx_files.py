"""A trained model's folder as every trained model keeps it (the reranker, the answer reader, the
fine-tuned embedder): ``model.onnx`` beside ``card.json``, the card naming the file's sha256. The
cards' common fields, reading the card, checking the file against it and opening an ONNX Runtime
session are here once, with errors that say how to retrain."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from pydantic import BaseModel, Field, ValidationError

from arag.errors import ModelError
from arag.models.onnx_graph import fast_graph
from arag.models.onnx_int8 import exact_int8_graph

if TYPE_CHECKING:
    import onnxruntime as ort

MODEL_FILE = "model.onnx"
CARD_FILE = "card.json"
C = TypeVar("C", bound=BaseModel)


class TrainedCard(BaseModel):
    """What every trained model's card says: which model, from what, its file's digest, and how it
    was trained and measured (each model's card adds its own fields)."""

    model_id: str
    base_model: str
    quantized: bool
    onnx_sha256: str
    created: str
    seed: int
    data: dict[str, Any] = Field(default_factory=dict)
    training: dict[str, Any] = Field(default_factory=dict)
    validation: dict[str, Any] = Field(default_factory=dict)


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def read_model_card(folder: Path, card_type: type[C], *, missing: ModelError, what: str, retrain: str) -> C:
    """``folder``'s card; ``missing`` when the card or the model is absent, a ModelError naming the
    ``retrain`` command when the card is unreadable."""
    path = folder / CARD_FILE
    if not path.is_file() or not (folder / MODEL_FILE).is_file():
        raise missing
    try:
        return card_type.model_validate(json.loads(path.read_text()))
    except (json.JSONDecodeError, ValidationError) as exc:
        raise ModelError(
            f"the {what}'s model card is unreadable: {exc}",
            where=str(path),
            fix=f"retrain it with `{retrain}`",
        ) from exc


def replace_model_card(folder: Path, card: BaseModel) -> None:
    """Write ``card`` as ``folder``'s card in one rename: a crash leaves the old card or the new one."""
    path = folder / CARD_FILE
    tmp = path.with_suffix(".json.part")
    tmp.write_text(card.model_dump_json(indent=2))
    tmp.replace(path)


def open_session(model: Path, threads: int, *, sha256: str | None, what: str, retrain: str) -> Any:
    """An ONNX Runtime session over ``model``, after checking it against ``sha256`` (None: a model
    being trained, not installed yet)."""

    # Read once: the bytes checked are the bytes loaded.
    try:
        data = model.read_bytes()
    except OSError as exc:
        raise ModelError(
            f"could not read the {what}'s model file: {exc}",
            where=str(model),
            fix=f"check the path and its permissions, or retrain with `{retrain}`",
        ) from exc
    if sha256 is not None and hashlib.sha256(data).hexdigest() != sha256:
        raise ModelError(
            f"the {what}'s model.onnx does not match the sha256 in its model card",
            where=str(model),
            fix=f"the file was changed or cut short: retrain with `{retrain}`",
        )
    try:
        return session_over(fast_graph(data), threads)
    except Exception as exc:
        raise ModelError(
            f"ONNX Runtime could not load the {what}: {exc}",
            where=str(model),
            fix=f"retrain with `{retrain}`",
        ) from exc


def session_over(graph: bytes, threads: int) -> ort.InferenceSession:
    """An ONNX Runtime session over a serialised model, its int8 products made exact on this CPU
    (models/onnx_int8.py): every model arag opens goes through here."""
    import onnxruntime as ort

    return ort.InferenceSession(
        exact_int8_graph(graph), sess_options=session_options(threads), providers=["CPUExecutionProvider"]
    )


def session_options(threads: int) -> ort.SessionOptions:
    """ORT options for a small CPU model: ``threads`` intra-op threads, sequential, all optimisations."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    # Idle worker threads spin by default: on 2 cores they steal the next step's CPU (the embedder,
    # the index, the reranker take turns within one query).
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return so
