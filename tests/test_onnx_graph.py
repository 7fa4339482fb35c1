"""The softmax NaN guards dropped from a trained model's graph (models/onnx_graph.py), on tiny
hand-built graphs: what is removed, what is kept, and that the outputs do not move."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from arag.errors import ModelError
from arag.models.onnx_files import open_session
from arag.models.onnx_graph import drop_guards_in_file, drop_softmax_nan_guards, fast_graph


def _const(name: str, value: float) -> onnx.NodeProto:
    tensor = helper.make_tensor(name + "_t", TensorProto.FLOAT, [], [value])
    return helper.make_node("Constant", [], [name], name=name, value=tensor)


def _attention(
    *, zero: float = 0.0, guard_reads: str = "p", layers: int = 2, initializer: bool = False
) -> onnx.ModelProto:
    """``layers`` softmax(scores) @ v blocks as the exporter writes them: each softmax behind
    ``Where(IsNaN(p), zero, <guard_reads>)``, the zero a Constant node (the exporter's) or an
    ``initializer`` (as ONNX Runtime's optimiser saves it)."""
    nodes: list[onnx.NodeProto] = []
    inits: list[onnx.TensorProto] = []
    x = "scores"
    for k in range(layers):
        p, s = f"p{k}", f"s{k}"
        nodes.append(helper.make_node("Softmax", [x], [p], axis=-1, name=f"softmax{k}"))
        nodes.append(helper.make_node("Sigmoid", [x], [s], name=f"other{k}"))
        nodes.append(helper.make_node("IsNaN", [p], [f"nan{k}"], name=f"isnan{k}"))
        if initializer:
            inits.append(helper.make_tensor(f"zero{k}", TensorProto.FLOAT, [], [zero]))
        else:
            nodes.append(_const(f"zero{k}", zero))
        kept = p if guard_reads == "p" else s
        nodes.append(helper.make_node("Where", [f"nan{k}", f"zero{k}", kept], [f"g{k}"], name=f"where{k}"))
        x = f"x{k + 1}"
        nodes.append(helper.make_node("MatMul", [f"g{k}", "v"], [x], name=f"matmul{k}"))
    nodes.append(helper.make_node("Identity", [x], ["out"], name="out"))
    dims = [2, 3, 4, 4]
    graph = helper.make_graph(
        nodes,
        "attention",
        [
            helper.make_tensor_value_info("scores", TensorProto.FLOAT, dims),
            helper.make_tensor_value_info("v", TensorProto.FLOAT, [4, 4]),
        ],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, dims)],
        initializer=inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def _run(model: onnx.ModelProto | bytes, feeds: dict[str, np.ndarray]) -> np.ndarray:
    data = model if isinstance(model, bytes) else model.SerializeToString()
    sess = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    return np.asarray(sess.run(None, feeds)[0])


FEEDS = {
    "scores": np.random.default_rng(0).normal(size=(2, 3, 4, 4)).astype(np.float32),
    "v": np.random.default_rng(1).normal(size=(4, 4)).astype(np.float32),
}


def test_each_guard_goes_with_its_isnan_and_zero_and_the_outputs_are_bit_identical() -> None:
    model = _attention()
    before = _run(model, FEEDS)
    assert drop_softmax_nan_guards(model) == 2
    ops = [n.op_type for n in model.graph.node]
    assert ops == ["Softmax", "Sigmoid", "MatMul", "Softmax", "Sigmoid", "MatMul", "Identity"]
    assert [n.input[0] for n in model.graph.node if n.op_type == "MatMul"] == ["p0", "p1"]
    onnx.checker.check_model(model)
    assert np.array_equal(_run(model, FEEDS), before)
    assert drop_softmax_nan_guards(model) == 0  # nothing left to drop
    # The zeros as initializers (the embedder's graph, saved by ONNX Runtime): they go too.
    folded = _attention(initializer=True)
    assert drop_softmax_nan_guards(folded) == 2
    assert [n.op_type for n in folded.graph.node] == ops and not folded.graph.initializer
    assert np.array_equal(_run(folded, FEEDS), before)


def test_a_where_that_is_not_a_softmax_guard_is_kept() -> None:
    # The fallback is not zero: the Where can change values, so it stays.
    # IsNaN of one tensor choosing another is not a guard of its own input either.
    for model in (_attention(zero=1.0), _attention(zero=1.0, initializer=True), _attention(guard_reads="s")):
        before = model.SerializeToString()
        assert drop_softmax_nan_guards(model) == 0
        assert model.SerializeToString() == before


def test_fast_graph_returns_a_model_without_isnan_as_it_is(tmp_path: Path) -> None:
    model = _attention()
    drop_softmax_nan_guards(model)
    data = model.SerializeToString()
    assert fast_graph(data) is data
    guarded = _attention().SerializeToString()
    fast = fast_graph(guarded)
    assert b"IsNaN" in guarded and b"IsNaN" not in fast
    assert np.array_equal(_run(fast, FEEDS), _run(guarded, FEEDS))
    # A trained model's file: rewritten in place at export, opened the same way either way.
    path = tmp_path / "model.onnx"
    path.write_bytes(guarded)
    session = open_session(path, 1, sha256=None, what="test model", retrain="-")
    assert np.array_equal(np.asarray(session.run(None, FEEDS)[0]), _run(guarded, FEEDS))
    assert drop_guards_in_file(path) == 2 and b"IsNaN" not in path.read_bytes()
    assert drop_guards_in_file(path) == 0


def test_a_model_file_that_cannot_be_read_or_loaded_is_a_model_error(tmp_path: Path) -> None:
    with pytest.raises(ModelError, match="could not read the reranker's model file") as missing:
        open_session(tmp_path / "absent.onnx", 1, sha256=None, what="reranker", retrain="arag train reranker")
    assert "arag train reranker" in (missing.value.fix or "")
    broken = tmp_path / "broken.onnx"
    broken.write_bytes(b"IsNaN, but not a model")  # parsed (it names the guard's op) and refused
    with pytest.raises(ModelError, match="could not load the reranker"):
        open_session(broken, 1, sha256=None, what="reranker", retrain="arag train reranker")
