"""The softmax NaN guards of PyTorch's ONNX export, removed from the models arag trains.

PyTorch's scaled-dot-product attention, exported to ONNX, guards every softmax with
``Where(IsNaN(p), 0, p)``: a row whose keys are all masked gives NaN, and the guard turns it into
zeros. In our models no row is ever all masked (every pair keeps [CLS] and [SEP] unmasked), so the
guard never changes a value, yet ONNX Runtime runs it element by element over the whole
batch x heads x length x length tensor: a third of the 6-layer reranker's time on 2 cores. Without
it every score is bit for bit the same (``Where(False, 0, p)`` is ``p``). Training drops the guards
right after export, and the derived int8 embedder after its fold; a model trained before that has
them dropped in memory when it is opened (its file, and so the sha256 its card names, untouched).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import onnx


def _is_zero(value: onnx.TensorProto | None) -> bool:
    from onnx import numpy_helper

    if value is None:
        return False
    array = numpy_helper.to_array(value)
    return array.size == 1 and float(array.reshape(-1)[0]) == 0.0


def _constant_value(node: onnx.NodeProto | None) -> onnx.TensorProto | None:
    """The tensor a Constant node holds (its ``value`` attribute), else None."""
    if node is None or node.op_type != "Constant" or len(node.attribute) != 1:
        return None
    attr = node.attribute[0]
    return attr.t if attr.name == "value" else None


def drop_softmax_nan_guards(model: onnx.ModelProto) -> int:
    """Remove each ``Where(IsNaN(s), 0, s)`` whose ``s`` is a Softmax output, reading ``s`` in its
    place; the zero (a Constant node, or an initializer as ONNX Runtime's optimiser writes it) and
    the IsNaN go too when nothing else reads them. Returns how many guards were removed."""
    graph = model.graph
    producer = {out: node for node in graph.node for out in node.output}
    initializers = {init.name: init for init in graph.initializer}
    graph_outputs = {o.name for o in graph.output}
    renamed: dict[str, str] = {}
    dropped: list[onnx.NodeProto] = []
    for node in graph.node:
        if node.op_type != "Where" or len(node.input) != 3 or node.output[0] in graph_outputs:
            continue
        cond, zero, kept = node.input
        check = producer.get(cond)
        source = producer.get(kept)
        value = initializers.get(zero) or _constant_value(producer.get(zero))
        if (
            check is not None
            and check.op_type == "IsNaN"
            and check.input[0] == kept
            and source is not None
            and source.op_type == "Softmax"
            and _is_zero(value)
        ):
            renamed[node.output[0]] = kept
            dropped.append(node)
    if not dropped:
        return 0
    for node in graph.node:
        for k, name in enumerate(node.input):
            if name in renamed:
                node.input[k] = renamed[name]
    gone = {id(node) for node in dropped}
    read = {name for node in graph.node if id(node) not in gone for name in node.input}
    read |= graph_outputs | {i.name for i in graph.input}  # an old IR lists initializers as inputs
    unread_nodes: dict[int, onnx.NodeProto] = {}
    unread_inits: set[str] = set()
    for node in dropped:
        for name in node.input[:2]:  # the IsNaN and the zero, when nothing else reads them
            if name in read:
                continue
            if name in producer:
                unread_nodes[id(producer[name])] = producer[name]
            elif name in initializers:
                unread_inits.add(name)
    for node in [*dropped, *unread_nodes.values()]:
        graph.node.remove(node)
    for init in [i for i in graph.initializer if i.name in unread_inits]:
        graph.initializer.remove(init)
    return len(dropped)


def drop_guards_in_file(path: Path) -> int:
    """Rewrite the ONNX file at ``path`` without its softmax NaN guards (a trained model, right after
    export, so the file installed is the fast one); returns how many were removed."""
    import onnx

    model = onnx.load(str(path))
    dropped = drop_softmax_nan_guards(model)
    if dropped:
        onnx.save(model, str(path))
    return dropped


def fast_graph(data: bytes) -> bytes:
    """``data`` (a serialised model) without its softmax NaN guards. A model exported since they are
    dropped at export holds no IsNaN and is returned as it is, without loading the onnx package
    (half a second); an older one is rewritten in memory, so it runs as fast without retraining."""
    if b"IsNaN" not in data:
        return data
    import onnx

    model = onnx.load_model_from_string(data)
    return model.SerializeToString() if drop_softmax_nan_guards(model) else data
