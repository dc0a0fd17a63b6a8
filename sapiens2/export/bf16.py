"""The official bfloat16 RoPE recipe (MODEL.md §1.4) rewritten for runtimes without bfloat16 arithmetic.

Why the plain export fails: the RoPE tables and the q/k rotation are bf16 ops (``Mul``, ``Add``, ``Div``, ``Sin`` ...
on bfloat16 tensors) even inside a float32 model, and onnxruntime's CPU provider has no bf16 kernels for them
("NOT_IMPLEMENTED: Could not find an implementation for Mul(14)"). PyTorch's CPU kernels compute a bf16 op in
float32 and round the result to bf16 (round-to-nearest-even), with Python scalars kept in float32 (MODEL.md §1.4
"Emulation check"). ``emulate_bfloat16`` makes that explicit in the exported graph: every bf16 tensor becomes a
float32 tensor holding a bf16 value, and every op that produced one is followed by ``Cast(bf16)`` -> ``Cast(fp32)``.
Only casts touch bfloat16, which every ONNX runtime implements. In PyTorch the rewritten program gives the same
bits as the eager model (``tests/test_export.py`` checks it on the parity fixture's backbone).
"""

from __future__ import annotations

import operator

import torch
from torch import fx

aten = torch.ops.aten

__all__ = ["emulate_bfloat16", "has_bfloat16"]

# Ops that only move or select values (or negate them): their output is exactly representable in bf16 whenever
# their inputs are, so no rounding follows them. Any op not listed here is rounded, which is always correct.
_EXACT_OPS = {
    aten.view.default,
    aten.reshape.default,
    aten.expand.default,
    aten.unsqueeze.default,
    aten.squeeze.dim,
    aten.flatten.using_ints,
    aten.permute.default,
    aten.transpose.int,
    aten.slice.Tensor,
    aten.select.int,
    aten.cat.default,
    aten.stack.default,
    aten.repeat.default,
    aten.tile.default,
    aten.clone.default,
    aten.contiguous.default,
    aten.neg.default,
    aten.split.Tensor,
    aten.split_with_sizes.default,
    aten.chunk.default,
    aten.meshgrid.indexing,
    operator.getitem,
}
_CASTS = (aten._to_copy.default, aten.to.dtype, aten.to.dtype_layout)


def _value(node: fx.Node):
    return node.meta.get("val")


def _is_bf16(value) -> bool:
    return isinstance(value, torch.Tensor) and value.dtype == torch.bfloat16


def _as_float32(value):
    """The fake tensor(s) of a node, with bf16 replaced by float32 (the node's new output type)."""
    if _is_bf16(value):
        with value.fake_mode:
            return value.to(torch.float32)
    if isinstance(value, (list, tuple)):
        return type(value)(_as_float32(item) for item in value)
    return value


def _swap_dtype(value, old: torch.dtype, new: torch.dtype):
    if isinstance(value, dict):
        return {key: _swap_dtype(item, old, new) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_swap_dtype(item, old, new) for item in value)
    return new if value is old else value


def has_bfloat16(program: torch.export.ExportedProgram) -> bool:
    """Whether any tensor in the program's graph is bfloat16."""
    for node in program.graph.nodes:
        value = _value(node)
        values = value if isinstance(value, (list, tuple)) else [value]
        if any(_is_bf16(item) for item in values):
            return True
    return False


def _insert_cast(graph: fx.Graph, after: fx.Node, dtype: torch.dtype, value) -> fx.Node:
    with graph.inserting_after(after):
        cast = graph.call_function(aten._to_copy.default, (after,), {"dtype": dtype})
    cast.meta["val"] = value
    return cast


def _replace_uses(node: fx.Node, replacement: fx.Node, keep: fx.Node) -> None:
    node.replace_all_uses_with(replacement, delete_user_cb=lambda user: user is not keep)


def emulate_bfloat16(program: torch.export.ExportedProgram) -> torch.export.ExportedProgram:
    """Rewrite every bfloat16 computation of ``program`` as float32 ops each followed by a round to bf16, in place.

    - a bf16 parameter or buffer (the RoPE ``periods``) is read through an exact cast to float32;
    - a cast *to* bf16 (q/k entering the rotation) stays, followed by a cast back to float32: the rounding;
    - any other op with a bf16 result computes in float32 (bf16 ``dtype=`` arguments become float32), followed by
      the rounding unless it only moves values (``_EXACT_OPS``);
    - a cast *from* bf16 now reads float32 and returns the same values.

    Returns the same ``program``, whose graph holds bfloat16 only between paired casts.
    """
    graph = program.graph
    for node in list(graph.nodes):
        if node.op == "call_function" and node.target is aten._assert_tensor_metadata.default:
            # Export's dtype assertions follow the tensor they check, which may have just become float32.
            checked = _value(node.args[0])
            if isinstance(checked, torch.Tensor) and checked.dtype == torch.float32:
                node.args = _swap_dtype(node.args, torch.bfloat16, torch.float32)
                node.kwargs = _swap_dtype(node.kwargs, torch.bfloat16, torch.float32)
            continue
        value = _value(node)
        values = value if isinstance(value, (list, tuple)) else [value]
        if not any(_is_bf16(item) for item in values):
            continue
        if node.op == "placeholder":
            cast = _insert_cast(graph, node, torch.float32, _as_float32(value))
            _replace_uses(node, cast, keep=cast)
            continue
        if node.op != "call_function":
            raise NotImplementedError(f"bfloat16 emulation: unexpected {node.op} node {node.name}")
        source = node.args[0] if node.args and isinstance(node.args[0], fx.Node) else None
        if node.target in _CASTS and source is not None and not _is_bf16(_value(source)):
            # A cast into bf16 is the rounding itself: keep it and read the result back as float32.
            cast = _insert_cast(graph, node, torch.float32, _as_float32(value))
            _replace_uses(node, cast, keep=cast)
            continue
        node.args = _swap_dtype(node.args, torch.bfloat16, torch.float32)
        node.kwargs = _swap_dtype(node.kwargs, torch.bfloat16, torch.float32)
        node.meta["val"] = _as_float32(value)
        if node.target in _EXACT_OPS or node.target in _CASTS or not isinstance(value, torch.Tensor):
            continue
        rounded = _insert_cast(graph, node, torch.bfloat16, value)
        widened = _insert_cast(graph, rounded, torch.float32, _as_float32(value))
        _replace_uses(node, widened, keep=rounded)
    graph.lint()
    program.graph_module.recompile()
    return program
