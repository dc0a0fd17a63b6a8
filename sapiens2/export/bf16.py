"""The official bfloat16 RoPE recipe (MODEL.md §1.4) rewritten for runtimes without bfloat16 arithmetic.

Why the plain export fails: the RoPE tables and the q/k rotation are bf16 ops (``Mul``, ``Add``, ``Div``, ``Sin`` ...
on bfloat16 tensors) even inside a float32 model, and onnxruntime's CPU provider has no bf16 kernels for them
("NOT_IMPLEMENTED: Could not find an implementation for Mul(14)"). PyTorch's CPU kernels compute a bf16 op in
float32 and round the result to bf16 (round-to-nearest-even), with Python scalars kept in float32 (MODEL.md §1.4
"Emulation check"). ``emulate_bfloat16`` makes that explicit in the exported graph: every bf16 tensor becomes a
float32 tensor holding a bf16 value, and every op that produced one is followed by ``Cast(bf16)`` -> ``Cast(fp32)``.
Only casts touch bfloat16, which every ONNX runtime implements. In PyTorch the rewritten program gives the same
bits as the eager model (``tests/test_export.py`` checks it on the parity fixture's backbone).

Runtimes with no bfloat16 type at all (LiteRT, Core ML: not even a cast, nor a bf16 constant) get
``rounding="split"``: the round to bf16 is Veltkamp's splitting in float32, ``c = x * (2**16 + 1)``,
``x_bf16 = c - (c - x)``: in round-to-nearest-even float32 arithmetic it keeps the top 8 significand bits of ``x``,
rounded to nearest even, which is exactly the bf16 cast (checked on every float32 of [1, 2), either sign, at several
exponents; |x| below ~5e33, far above any RoPE or q/k value). The bf16 ``periods`` buffer is stored as float32 (its
values are bf16 values, so exactly).
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
ROUNDINGS = ("cast", "split")
# Veltkamp's splitting constant for float32 (24 significand bits) to bfloat16 (8): 2**(24 - 8) + 1.
SPLIT_FACTOR = float(2**16 + 1)


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


def _replace_uses(node: fx.Node, replacement: fx.Node, keep: tuple[fx.Node, ...]) -> None:
    node.replace_all_uses_with(replacement, delete_user_cb=lambda user: user not in keep)


def _round_after(graph: fx.Graph, node: fx.Node, value, rounding: str) -> None:
    """Make every user of ``node`` (a float32 value) read it rounded to bf16 and widened back to float32."""
    widened_value = _as_float32(value)
    if rounding == "cast":
        rounded = _insert_cast(graph, node, torch.bfloat16, value)
        widened = _insert_cast(graph, rounded, torch.float32, widened_value)
        _replace_uses(node, widened, keep=(rounded,))
        return
    with graph.inserting_after(node):
        scaled = graph.call_function(aten.mul.Tensor, (node, SPLIT_FACTOR))
    with graph.inserting_after(scaled):
        low = graph.call_function(aten.sub.Tensor, (scaled, node))
    with graph.inserting_after(low):
        high = graph.call_function(aten.sub.Tensor, (scaled, low))
    for made in (scaled, low, high):
        made.meta["val"] = widened_value
    _replace_uses(node, high, keep=(scaled, low))


def _store_as_float32(program: torch.export.ExportedProgram, node: fx.Node) -> None:
    """Store the bf16 parameter, buffer or constant a placeholder reads as float32 (exact), retyping the node."""
    signature = program.graph_signature
    for table, store in (
        (signature.inputs_to_parameters, program.state_dict),
        (signature.inputs_to_buffers, program.state_dict),
        (signature.inputs_to_lifted_tensor_constants, program.constants),
    ):
        if node.name in table:
            name = table[node.name]
            tensor = store[name].float()
            store[name] = torch.nn.Parameter(tensor, requires_grad=False) if name in signature.parameters else tensor
            node.meta["val"] = _as_float32(_value(node))
            return
    raise NotImplementedError(f"bfloat16 emulation: a bfloat16 input {node.name} that is not a weight")


def emulate_bfloat16(program: torch.export.ExportedProgram, rounding: str = "cast") -> torch.export.ExportedProgram:
    """Rewrite every bfloat16 computation of ``program`` as float32 ops each followed by a round to bf16, in place.

    - a bf16 parameter or buffer (the RoPE ``periods``) is read through an exact cast to float32 (``split``: stored
      as float32);
    - a cast *to* bf16 (q/k entering the rotation) stays, followed by a cast back to float32: the rounding
      (``split``: a float32 copy, then the rounding);
    - any other op with a bf16 result computes in float32 (bf16 ``dtype=`` arguments become float32), followed by
      the rounding unless it only moves values (``_EXACT_OPS``);
    - a cast *from* bf16 now reads float32 and returns the same values.

    Args:
        program: the exported program; rewritten in place.
        rounding: ``"cast"`` (a cast to bf16 and back: the graph holds bfloat16 only between paired casts) or
            ``"split"`` (Veltkamp's splitting in float32: no bfloat16 anywhere, for runtimes without the type).

    Returns the same ``program``.
    """
    if rounding not in ROUNDINGS:
        raise ValueError(f"rounding must be one of {', '.join(ROUNDINGS)}, got {rounding!r}")
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
            if rounding == "split":
                _store_as_float32(program, node)
                continue
            cast = _insert_cast(graph, node, torch.float32, _as_float32(value))
            _replace_uses(node, cast, keep=(cast,))
            continue
        if node.op != "call_function":
            raise NotImplementedError(f"bfloat16 emulation: unexpected {node.op} node {node.name}")
        source = node.args[0] if node.args and isinstance(node.args[0], fx.Node) else None
        if node.target in _CASTS and source is not None and not _is_bf16(_value(source)):
            if rounding == "cast":  # a cast into bf16 is the rounding itself: keep it, read the result back as float32
                cast = _insert_cast(graph, node, torch.float32, _as_float32(value))
                _replace_uses(node, cast, keep=(cast,))
                continue
            node.args = _swap_dtype(node.args, torch.bfloat16, torch.float32)  # a float32 copy, then rounded
            node.kwargs = _swap_dtype(node.kwargs, torch.bfloat16, torch.float32)
            node.meta["val"] = _as_float32(value)
            _round_after(graph, node, value, rounding)
            continue
        node.args = _swap_dtype(node.args, torch.bfloat16, torch.float32)
        node.kwargs = _swap_dtype(node.kwargs, torch.bfloat16, torch.float32)
        node.meta["val"] = _as_float32(value)
        if node.target in _EXACT_OPS or node.target in _CASTS or not isinstance(value, torch.Tensor):
            continue
        _round_after(graph, node, value, rounding)
    graph.lint()
    program.graph_module.recompile()
    return program
