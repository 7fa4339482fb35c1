"""Exact int8 products on every CPU (models/onnx_int8.py): which CPUs clamp ONNX Runtime's uint8 x
int8 products, and that the uint8 rewrite computes the exact integers, on tiny graphs and on the
derived embedder."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from arag.models.onnx_int8 import exact_int8_graph, u8s8_saturates, weights_as_uint8


def _model(
    nodes: list[onnx.NodeProto], inits: list[onnx.TensorProto], outputs: dict[str, list[int]]
) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes,
        "int8",
        [helper.make_tensor_value_info("a", TensorProto.UINT8, [4, 8])],
        [helper.make_tensor_value_info(o, TensorProto.INT32, dims) for o, dims in outputs.items()],
        initializer=inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def _run(model: onnx.ModelProto | bytes, a: np.ndarray) -> list[np.ndarray]:
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    data = model if isinstance(model, bytes) else model.SerializeToString()
    return ort.InferenceSession(data, so, providers=["CPUExecutionProvider"]).run(None, {"a": a})


# Activations at 255 against weights at 127: each pair of products is 64,770, which VPMADDUBSW keeps
# as 32,767 (an AVX2 CPU without VNNI); the last column is negative and has a zero point of 3.
A = np.full((4, 8), 255, dtype=np.uint8)
A[1] = np.arange(8, dtype=np.uint8) * 30
W = np.array([[127, -128, 5, -7]] * 8, dtype=np.int8)
W_ZERO = np.array([0, 0, 0, 3], dtype=np.int8)
A_ZERO = np.uint8(7)
EXACT = (A.astype(np.int64) - int(A_ZERO)) @ (W.astype(np.int64) - W_ZERO.astype(np.int64))


def _matmul(with_zero: bool) -> onnx.ModelProto:
    inputs = ["a", "w", "a_zero", "w_zero"] if with_zero else ["a", "w"]
    inits = [numpy_helper.from_array(W, "w")]
    if with_zero:
        inits += [
            numpy_helper.from_array(W_ZERO, "w_zero"),
            numpy_helper.from_array(np.array(A_ZERO), "a_zero"),
        ]
    return _model([helper.make_node("MatMulInteger", inputs, ["y"])], inits, {"y": [4, 4]})


def test_a_cpu_without_vnni_or_amx_is_the_one_that_clamps() -> None:
    assert u8s8_saturates(frozenset({"avx2", "fma"}), "x86_64")
    assert u8s8_saturates(frozenset({"avx512f", "avx512bw"}), "x86_64")  # Skylake-X: AVX-512, no VNNI
    assert u8s8_saturates(frozenset(), "AMD64")  # flags unreadable: rewrite (exact anywhere)
    assert not u8s8_saturates(frozenset({"avx2", "avx512_vnni"}), "x86_64")
    assert not u8s8_saturates(frozenset({"avx2", "avx_vnni"}), "x86_64")
    assert not u8s8_saturates(frozenset({"amx_int8"}), "x86_64")
    assert not u8s8_saturates(frozenset(), "aarch64")


@pytest.mark.parametrize("with_zero", [True, False])
def test_uint8_weights_give_the_exact_products(with_zero: bool) -> None:
    model = _matmul(with_zero)
    assert weights_as_uint8(model) == 1
    weights = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    assert weights["w"].dtype == np.uint8 and int(weights["w"][0, 0]) == 255  # 127 + 128
    (got,) = _run(model, A)
    exact = EXACT if with_zero else A.astype(np.int64) @ W.astype(np.int64)
    assert np.array_equal(got, exact)
    # The control: where this CPU clamps, the int8 graph does not give these numbers.
    (before,) = _run(_matmul(with_zero), A)
    assert np.array_equal(before, exact) != u8s8_saturates()


def test_a_weight_something_else_reads_is_left_as_it_is() -> None:
    nodes = [
        helper.make_node("MatMulInteger", ["a", "w"], ["y"]),
        helper.make_node("Cast", ["w"], ["w32"], to=TensorProto.INT32),
    ]
    model = _model(nodes, [numpy_helper.from_array(W, "w")], {"y": [4, 4], "w32": [8, 4]})
    assert weights_as_uint8(model) == 0
    assert model.graph.initializer[0].data_type == TensorProto.INT8


def test_a_weight_two_matmuls_share_is_left_as_it_is() -> None:
    nodes = [
        helper.make_node("MatMulInteger", ["a", "w", "a_zero", "w_zero"], ["y"]),
        helper.make_node("MatMulInteger", ["a", "w"], ["y2"]),
    ]
    inits = [
        numpy_helper.from_array(W, "w"),
        numpy_helper.from_array(W_ZERO, "w_zero"),
        numpy_helper.from_array(np.array(A_ZERO), "a_zero"),
    ]
    model = _model(nodes, inits, {"y": [4, 4], "y2": [4, 4]})
    assert weights_as_uint8(model) == 0
    _, got2 = _run(model, A)
    assert np.array_equal(got2, _run(_matmul(False), A)[0])


def test_a_weight_listed_among_the_inputs_is_left_as_it_is() -> None:
    model = _matmul(True)
    model.graph.input.append(helper.make_tensor_value_info("w", TensorProto.INT8, [8, 4]))
    assert weights_as_uint8(model) == 0


def test_a_graph_is_rewritten_only_where_the_cpu_clamps() -> None:
    data = _matmul(True).SerializeToString()
    assert exact_int8_graph(data, saturates=False) is data
    rewritten = exact_int8_graph(data, saturates=True)
    assert rewritten != data and np.array_equal(_run(rewritten, A)[0], EXACT)
    no_int8 = _model([helper.make_node("Cast", ["a"], ["y"], to=TensorProto.INT32)], [], {"y": [4, 8]})
    plain = no_int8.SerializeToString()
    assert exact_int8_graph(plain, saturates=True) is plain


def _int32_reference(model: onnx.ModelProto) -> onnx.ModelProto:
    """Each MatMulInteger as int32 arithmetic (Cast, Sub, MatMul): the products no CPU clamps."""
    nodes: list[onnx.NodeProto] = []
    for node in model.graph.node:
        if node.op_type != "MatMulInteger":
            nodes.append(node)
            continue
        sides = []
        for k, (value, zero) in enumerate(((0, 2), (1, 3))):
            name = f"{node.output[0]}_{k}"
            nodes.append(helper.make_node("Cast", [node.input[value]], [name], to=TensorProto.INT32))
            if len(node.input) > zero and node.input[zero]:
                nodes.append(
                    helper.make_node("Cast", [node.input[zero]], [name + "_z"], to=TensorProto.INT32)
                )
                nodes.append(helper.make_node("Sub", [name, name + "_z"], [name + "_c"]))
                name += "_c"
            sides.append(name)
        nodes.append(helper.make_node("MatMul", sides, [node.output[0]]))
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    return model


@pytest.mark.real_models
def test_the_derived_embedder_rewritten_computes_what_a_vnni_cpu_does() -> None:
    from arag.models.onnx_minilm import OnnxMiniLMEmbedder
    from arag.settings import EmbeddingSettings

    emb = OnnxMiniLMEmbedder(EmbeddingSettings())
    data = emb.model_path.read_bytes()
    texts = ["Which datasets do they evaluate on?", "We fine-tune BERT on SQuAD and report exact match."]
    enc = emb.tokenizer.encode_batch(texts)
    feeds = {
        "input_ids": np.array([e.ids for e in enc], dtype=np.int64),
        "attention_mask": np.array([e.attention_mask for e in enc], dtype=np.int64),
        "token_type_ids": np.zeros((len(texts), len(enc[0].ids)), dtype=np.int64),
    }
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # no fused float kernels

    def hidden(graph: bytes) -> np.ndarray:
        session = ort.InferenceSession(graph, so, providers=["CPUExecutionProvider"])
        return session.run(
            None, {k: v for k, v in feeds.items() if k in {i.name for i in session.get_inputs()}}
        )[0]

    reference = hidden(_int32_reference(onnx.load_model_from_string(data)).SerializeToString())
    assert np.array_equal(hidden(exact_int8_graph(data, saturates=True)), reference)
    assert np.array_equal(hidden(data), reference) != u8s8_saturates()


@pytest.mark.real_models
def test_the_int8_bench_times_both_ways_and_says_how_far_the_vectors_move(
    tmp_path: Path, qasper_path: Path
) -> None:
    from arag.bench.int8 import run_int8_bench
    from arag.settings import get_settings

    r = run_int8_bench(get_settings(data_dir=tmp_path), texts=12, repeats=1)
    assert r.texts == 12 and r.repeats == 1 and r.clamps == u8s8_saturates()
    assert r.own_kernels_texts_per_s > 0 and r.rewrite_texts_per_s > 0
    if r.clamps:  # the CPU's own kernels clamp: other vectors, near the exact ones
        assert not r.identical and 0.9 < r.cosine_min < 1.0
    else:  # the same integers either way
        assert r.cosine_min > 0.999
