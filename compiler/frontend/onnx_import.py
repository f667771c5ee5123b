"""ONNX -> graph IR. Opsets 13 and newer are read directly; older models are first upgraded with
onnx's version converter. Each ONNX op type has one converter in CONVERTERS (the table of what is
supported). Before converting anything the whole model is scanned, so a model with unsupported
ops fails once, listing every unsupported op type with its node names.

Shapes are static: symbolic input dims must be given with `shapes=`. Inputs that ONNX allows to be
tensors but that fix a shape (Reshape's shape, Slice's starts, Pad's pads...) must be constant or
computable from constants and static shapes (Shape -> Gather -> Concat chains fold at import).
"""
from __future__ import annotations

import hashlib
import logging
import math
import os
import stat
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import TYPE_CHECKING

import numpy as np
from google.protobuf.message import DecodeError

from ..graph.errors import GraphError
from ..graph.interpret import run
from ..graph.ir import MAX_TENSOR_BYTES, Graph, Node, topo_order
from .errors import ConversionError, ModelLoadError, UnsupportedOpError

if TYPE_CHECKING:   # annotations only: onnx loads when a model is read
    import onnx

log = logging.getLogger(__name__)

MIN_OPSET = 13


def _onnx():
    import onnx  # noqa: PLC0415 - onnx loads only when a model is read (the graph IR does not need it)
    return onnx


def load_model(model, check_ops: bool = True, base_dir: "str | os.PathLike | None" = None) -> "onnx.ModelProto":
    """A path, bytes or ModelProto -> a checked ModelProto at opset >= 13, its tensors all in memory.

    Order matters for the errors a user sees: parse (truncated or not ONNX); external data, read
    from files inside the model's directory only (base_dir for bytes and ModelProtos); ONNX's full
    checker (with strict shape inference), whose message is shown on one line - unless the model
    uses op types the frontend does not know, then the one error listing them all (an unknown
    domain also fails the checker); the scan for unsupported op types; the opset upgrade."""
    onnx = _onnx()
    src = "<bytes>"
    if isinstance(model, (str, os.PathLike)):
        src = str(model)
        if base_dir is None:
            base_dir = Path(model).resolve().parent
        try:
            data = Path(model).read_bytes()
        except OSError as e:
            raise ModelLoadError(f"cannot read ONNX model {src}: {e.strerror}") from None
    elif isinstance(model, (bytes, bytearray)):
        data = bytes(model)
    elif isinstance(model, onnx.ModelProto):
        data = None
        src = f"<model {model.graph.name!r}>" if model.graph.name else "<model>"
    else:
        raise ModelLoadError(f"expected a path, bytes or onnx.ModelProto, got {type(model).__name__}")
    if data is not None:
        if not data:
            raise ModelLoadError(f"{src}: empty file, not an ONNX model")
        try:
            model = onnx.load_from_string(data)
        except (DecodeError, RuntimeError, ValueError) as e:
            raise ModelLoadError(f"{src}: cannot parse as an ONNX model (truncated or not ONNX): {e}") from None
    if not model.graph.node and not model.graph.output:
        raise ModelLoadError(f"{src}: the model has no graph (truncated or not ONNX)")
    model = _load_external_data(model, base_dir, src)
    _check_einsum_equations(model.graph, src)
    model = _declare_output_shapes(model)
    try:
        onnx.checker.check_model(model, full_check=True)
    except Exception as e:  # onnx.checker.ValidationError, shape inference errors and friends
        if check_ops:
            try:    # ops the frontend lacks (an unknown domain fails the checker): list them all
                check_supported(fold_constant_nodes(model))
            except UnsupportedOpError:
                raise
            except Exception:   # malformed beyond what the scan reads: the checker's message says why
                pass
        msg = " ".join(str(e).split()) or type(e).__name__
        # an attribute or shape the checker's inference refuses is the model's error, not a cut file
        why = "" if "InferenceError" in msg else " (possibly truncated)"
        raise ModelLoadError(f"{src}: malformed ONNX model{why}: ONNX checker: {msg[:2000]}") from None
    model = _half_to_float(model, src)
    model = fold_constant_nodes(model)
    if check_ops:
        check_supported(model)
    opset = default_opset(model)
    if opset < MIN_OPSET:
        from onnx import version_converter  # noqa: PLC0415 - onnx loads only when a model is read
        try:
            model = _keep_resize10_semantics(model, version_converter.convert_version(
                _without_removed_ops(model), MIN_OPSET))
        except Exception as e:
            raise ModelLoadError(f"{src}: cannot upgrade opset {opset} to {MIN_OPSET} with onnx's version "
                                 f"converter: {e}") from None
        log.info("upgraded %s from opset %d to %d", src, opset, MIN_OPSET)
    return model


def _half_to_float(model, src: str):
    """A float16 or bfloat16 model computes in float32: its weights, constants, casts and declared
    tensor types are widened (the graph has no half type; onnxruntime's CPU kernels widen most
    half ops the same way). Inputs may still be fed as float16 (they are converted on entry);
    outputs come back as float32. Returns the model, a copy when anything changed."""
    onnx = _onnx()
    from onnx import numpy_helper  # noqa: PLC0415 - onnx loads only when a model is read
    half = (onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16)

    def uses_half(g) -> bool:
        return (any(t.data_type in half for t in g.initializer)
                or any(vi.type.tensor_type.elem_type in half for vi in (*g.input, *g.output, *g.value_info))
                or any(a.type == onnx.AttributeProto.TENSOR and a.t.data_type in half
                       or a.name == "to" and a.i in half for n in g.node for a in n.attribute))
    if not uses_half(model.graph):
        return model
    out = onnx.ModelProto()
    out.CopyFrom(model)
    g = out.graph

    def widened(t):
        return numpy_helper.from_array(numpy_helper.to_array(t).astype(np.float32), t.name)
    for k, t in enumerate(g.initializer):
        if t.data_type in half:
            g.initializer[k].CopyFrom(widened(t))
    for vi in (*g.input, *g.output, *g.value_info):
        if vi.type.tensor_type.elem_type in half:
            vi.type.tensor_type.elem_type = onnx.TensorProto.FLOAT
    for n in g.node:
        for a in n.attribute:
            if a.type == onnx.AttributeProto.TENSOR and a.t.data_type in half:
                a.t.CopyFrom(widened(a.t))
            elif a.name == "to" and a.type == onnx.AttributeProto.INT and a.i in half:
                a.i = onnx.TensorProto.FLOAT
    log.warning("%s: float16/bfloat16 model: computed in float32 (weights widened, outputs float32)", src)
    return out


def _check_einsum_equations(graph, src: str) -> None:
    """Refuse a malformed Einsum equation (in any subgraph too) before onnx's checker and shape
    inference see it: onnx 1.23 never returns on some ('i..j->ij', 'i$j->ij'), so a crafted file
    would hang the loader."""
    from .einsum import EinsumError, check_syntax  # noqa: PLC0415 - import cycle: einsum imports this module
    onnx = _onnx()
    for k, n in enumerate(graph.node):
        for a in n.attribute:
            for sub in ([a.g] if a.type == onnx.AttributeProto.GRAPH else
                        list(a.graphs) if a.type == onnx.AttributeProto.GRAPHS else []):
                _check_einsum_equations(sub, src)
        if n.op_type != "Einsum" or n.domain not in ("", "ai.onnx"):
            continue
        eq = next((a.s for a in n.attribute if a.name == "equation"), b"")
        try:
            check_syntax(eq.decode("utf-8", "replace"))
        except EinsumError as e:
            raise ModelLoadError(f"{src}: Einsum '{n.name or k}': {e}") from None


def _declare_output_shapes(model):
    """Graph outputs declared with a type but no shape run in onnxruntime, but onnx's checker
    refuses them ("Field 'shape' of 'type' is required"): they take the shape onnx's shape
    inference gives, so that the checker still checks everything else. An output whose shape
    cannot be inferred is left as it was (and the checker says so)."""
    onnx = _onnx()
    missing = [o.name for o in model.graph.output
               if o.type.HasField("tensor_type") and not o.type.tensor_type.HasField("shape")]
    if not missing:
        return model
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:   # the checker reports what is wrong
        return model
    shapes = {v.name: v.type.tensor_type.shape for v in (*inferred.graph.value_info, *inferred.graph.output)
              if v.type.HasField("tensor_type") and v.type.tensor_type.HasField("shape")}
    if not any(name in shapes for name in missing):
        return model
    out = onnx.ModelProto()
    out.CopyFrom(model)
    for o in out.graph.output:
        if o.name in missing and o.name in shapes:
            o.type.tensor_type.shape.CopyFrom(shapes[o.name])
    return out


def _without_removed_ops(model):
    """ImageScaler (experimental, gone from opset 10; Tiny YOLOv2 and other opset-8 exports use it)
    stops onnx's version converter, which has no schema for it: rewritten before the upgrade as
    Mul by scale and Add of the per-channel bias, both valid at every opset from 7."""
    onnx = _onnx()
    if not any(n.op_type == "ImageScaler" and n.domain in ("", "ai.onnx") for n in model.graph.node):
        return model
    out = onnx.ModelProto()
    out.CopyFrom(model)
    del out.graph.node[:]
    for k, n in enumerate(model.graph.node):
        if n.op_type != "ImageScaler" or n.domain not in ("", "ai.onnx"):
            out.graph.node.append(n)
            continue
        a = {at.name: onnx.helper.get_attribute_value(at) for at in n.attribute}
        bias = np.asarray(a.get("bias", []), np.float32)
        base = f"{n.name or 'ImageScaler_' + str(k)}"
        scaled = f"{base}/scaled" if bias.size else n.output[0]
        out.graph.node.extend([
            onnx.helper.make_node("Constant", [], [f"{base}/scale"], name=f"{base}/scale",
                                  value=onnx.numpy_helper.from_array(np.float32(a.get("scale", 1.0)))),
            onnx.helper.make_node("Mul", [n.input[0], f"{base}/scale"], [scaled], name=f"{base}/mul")])
        if bias.size:
            out.graph.node.extend([
                onnx.helper.make_node("Constant", [], [f"{base}/bias"], name=f"{base}/bias",
                                      value=onnx.numpy_helper.from_array(bias.reshape(-1, 1, 1))),
                onnx.helper.make_node("Add", [scaled, f"{base}/bias"], [n.output[0]], name=n.name or base)])
    return out


def _keep_resize10_semantics(old, new):
    """onnx's version converter turns Upsample (opset 7-9) and Resize-10 into Resize-13 without
    their coordinate mode: Resize-13's default (half_pixel) then moves every linear sample.
    Those nodes (found by output name) get Resize-10's own: asymmetric coordinates, nearest
    rounding down (up when every scale shrinks, as onnxruntime's opset-10 kernel does)."""
    onnx = _onnx()
    opset = default_opset(old)
    outs = {n.output[0] for n in old.graph.node
            if n.domain in ("", "ai.onnx") and (n.op_type == "Upsample" or (n.op_type == "Resize" and opset == 10))}
    if not outs:
        return new
    consts = {t.name: t for t in new.graph.initializer}
    consts.update({n.output[0]: n.attribute[0].t for n in new.graph.node if n.op_type == "Constant" and n.attribute})
    for n in new.graph.node:
        if n.op_type != "Resize" or n.output[0] not in outs:
            continue
        have = {a.name for a in n.attribute}
        if "coordinate_transformation_mode" not in have:
            n.attribute.append(onnx.helper.make_attribute("coordinate_transformation_mode", "asymmetric"))
        if "nearest_mode" not in have:
            sc = consts.get(n.input[2]) if len(n.input) > 2 else None
            sc = onnx.numpy_helper.to_array(sc) if sc is not None else np.ones(0)
            shrink = sc.size and all(v < 1 for v in sc if v != 1) and any(v != 1 for v in sc)
            n.attribute.append(onnx.helper.make_attribute("nearest_mode", "ceil" if shrink else "floor"))
    return new


def _all_tensors(graph):
    """Every TensorProto a graph holds: initializers, sparse initializers, tensor attributes
    (Constant's value), and those of subgraphs (If/Loop/Scan bodies), recursively."""
    for t in graph.initializer:
        yield t
    for st in graph.sparse_initializer:
        yield st.values
        yield st.indices
    for n in graph.node:
        for a in n.attribute:
            if a.HasField("t"):
                yield a.t
            yield from a.tensors
            if a.HasField("sparse_tensor"):
                yield a.sparse_tensor.values
                yield a.sparse_tensor.indices
            for st in a.sparse_tensors:
                yield st.values
                yield st.indices
            if a.HasField("g"):
                yield from _all_tensors(a.g)
            for g in a.graphs:
                yield from _all_tensors(g)


def _load_external_data(model, base_dir, src: str):
    """Tensors stored outside the model file -> raw_data read from their files, which must lie
    inside base_dir (the model's directory): a relative location with no '..', no absolute path
    or drive, and no symlink out of the directory. offset/length must fit the file and the bytes
    must be exactly what the tensor's dtype and dims need. Returns the model (a copy if any
    tensor was external: the caller's ModelProto is left as it was)."""
    onnx = _onnx()
    ext = onnx.TensorProto.EXTERNAL
    if not any(t.data_location == ext for t in _all_tensors(model.graph)):
        return model
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    model = copy
    if base_dir is None:
        name = next(t.name for t in _all_tensors(model.graph) if t.data_location == ext)
        raise ModelLoadError(f"{src}: tensor '{name}' keeps its data in an external file, but the model was not "
                             f"given as a path: load it from its file, or pass base_dir=")
    root = Path(base_dir).resolve()
    for t in _all_tensors(model.graph):
        if t.data_location != ext:
            continue
        what = f"{src}: tensor '{t.name}' external data"
        info = {e.key: e.value for e in t.external_data}
        loc = info.get("location", "")
        if not loc or "\x00" in loc:
            raise ModelLoadError(f"{what}: no file location given")
        if PurePosixPath(loc).is_absolute() or PureWindowsPath(loc).is_absolute() or PureWindowsPath(loc).drive \
                or loc.startswith("\\"):
            raise ModelLoadError(f"{what}: location {loc!r} is an absolute path; it must be relative to the "
                                 f"model's directory")
        if ".." in PurePosixPath(loc.replace("\\", "/")).parts:
            raise ModelLoadError(f"{what}: location {loc!r} leaves the model's directory ('..')")
        path = (root / loc).resolve()
        if not path.is_relative_to(root):
            raise ModelLoadError(f"{what}: location {loc!r} resolves to {path}, outside the model's directory "
                                 f"{root} (a symbolic link?)")
        try:
            offset = int(info.get("offset", "0"))
            length = int(info["length"]) if "length" in info else None
        except ValueError:
            raise ModelLoadError(f"{what}: offset {info.get('offset')!r} / length {info.get('length')!r} "
                                 f"are not integers") from None
        if offset < 0 or (length is not None and length < 0):
            raise ModelLoadError(f"{what}: negative offset {offset} or length {length}")
        try:    # O_NONBLOCK: a FIFO named as the location must not hang the load
            with open(os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0)), "rb") as f:
                st = os.fstat(f.fileno())
                if not stat.S_ISREG(st.st_mode):
                    raise ModelLoadError(f"{what}: location {loc!r} is not a regular file")
                size = st.st_size
                if length is None:
                    length = max(0, size - offset)
                if offset + length > size:
                    raise ModelLoadError(f"{what}: bytes [{offset}, {offset + length}) lie beyond the end of "
                                         f"{loc!r} ({size} bytes)")
                need = _tensor_nbytes(t)
                if need is not None and need != length:
                    raise ModelLoadError(f"{what}: {length} bytes in {loc!r}, but dims {list(t.dims)} of "
                                         f"{onnx.TensorProto.DataType.Name(t.data_type)} need {need}")
                f.seek(offset)
                raw = f.read(length)
        except OSError as e:
            raise ModelLoadError(f"{what}: cannot read {loc!r}: {e.strerror or e}") from None
        if len(raw) != length:
            raise ModelLoadError(f"{what}: {loc!r} changed while being read")
        if "checksum" in info:
            if hashlib.sha1(raw).hexdigest() != info["checksum"].lower():
                raise ModelLoadError(f"{what}: the bytes read from {loc!r} do not match its SHA-1 checksum")
        t.raw_data = raw
        del t.external_data[:]
        t.data_location = onnx.TensorProto.DEFAULT
    return model


def _tensor_nbytes(t) -> int | None:
    """Bytes a tensor's raw_data holds for its dims and dtype (None: strings, types not checked)."""
    onnx = _onnx()
    name = onnx.TensorProto.DataType.Name(t.data_type) if t.data_type in onnx.TensorProto.DataType.values() else ""
    bits = {"UINT4": 4, "INT4": 4, "FLOAT4E2M1": 4, "UINT2": 2, "INT2": 2}.get(name)
    if not name or name in ("STRING", "UNDEFINED") or name.startswith("FLOAT6"):
        return None
    n = 1
    for d in t.dims:
        if d < 0:
            return -1     # never equal to a length: reported as a size mismatch
        n *= d
    if bits:
        return (n * bits + 7) // 8
    return n * np.dtype(onnx.helper.tensor_dtype_to_np_dtype(t.data_type)).itemsize


def fold_constant_nodes(model) -> "onnx.ModelProto":
    """Nodes of op types without a converter whose inputs are all constant (initializers, Constant
    nodes, or nodes folded here) become Constant nodes, evaluated by onnx's reference evaluator.
    Exporters emit such shape arithmetic: PyTorch's MultiheadAttention computes Mod on two
    constants. A node that cannot be evaluated is left for check_supported to report. Returns the
    model, a copy when anything was folded."""
    onnx = _onnx()
    from onnx import numpy_helper  # noqa: PLC0415 - onnx loads only when a model is read
    from onnx.reference import ReferenceEvaluator  # noqa: PLC0415 - onnx loads only when a model is read
    g = model.graph
    opsets = {imp.domain or "": imp.version for imp in model.opset_import}
    inits = {t.name: t for t in g.initializer}
    constant_nodes = {o: n for n in g.node if n.op_type == "Constant" and n.domain in ("", "ai.onnx") for o in n.output}
    values: dict[str, np.ndarray] = {}   # constant tensors read so far, folded outputs included

    def value(name: str) -> np.ndarray:
        if name not in values:
            values[name] = (numpy_helper.to_array(inits[name]) if name in inits
                            else ReferenceEvaluator(constant_nodes[name]).run(None, {})[0])
        return values[name]
    folded: dict[int, list] = {}
    for k, n in enumerate(g.node):
        if n.op_type in CONVERTERS and n.domain in ("", "ai.onnx"):
            continue
        ins = [i for i in n.input if i]
        if not ins or not all(i in inits or i in constant_nodes or i in values for i in ins):
            continue
        try:
            outs = ReferenceEvaluator(n, opsets=opsets).run(None, {i: value(i) for i in ins})
        except Exception as e:   # not evaluable here: reported as unsupported
            log.debug("cannot fold %s '%s': %s", n.op_type, n.name, e)
            continue
        folded[k] = []
        for j, (o, v) in enumerate(zip(n.output, outs)):
            if o:
                values[o] = np.asarray(v)
                folded[k].append(onnx.helper.make_node("Constant", [], [o], name=f"{n.name or n.op_type}/folded_{j}",
                                                       value=numpy_helper.from_array(values[o], o)))
        log.info("folded %s '%s' on constant inputs", n.op_type, n.name)
    if not folded:
        return model
    out = onnx.ModelProto()
    out.CopyFrom(model)
    del out.graph.node[:]
    for k, n in enumerate(g.node):
        out.graph.node.extend(folded.get(k, [n]))
    return out


def check_supported(model) -> None:
    """Raise UnsupportedOpError listing every op type without a converter, with its node names."""
    unsupported: dict[str, list[str]] = {}
    for k, n in enumerate(model.graph.node):
        op = n.op_type if n.domain in ("", "ai.onnx") else f"{n.domain}.{n.op_type}"
        if op not in CONVERTERS:
            unsupported.setdefault(op, []).append(n.name or f"{n.op_type}_{k}")
    if unsupported:
        raise UnsupportedOpError(unsupported)


def default_opset(model) -> int:
    for imp in model.opset_import:
        if imp.domain in ("", "ai.onnx"):
            return imp.version
    return 1


class _Ctx:
    """Import state: ONNX tensor name -> Node, the created nodes in order, the opset."""

    def __init__(self, opset: int):
        self.opset = opset
        self.env: dict[str, Node] = {}
        self.nodes: list[Node] = []
        self.onnx_node = None
        self.node_name = ""
        self.declared: dict[str, int] = {}   # tensor name -> ONNX elem type, from outputs/value_info
        # a 1-D window op converted as its 2-D form (_as_2d): the lifted inputs and attributes
        self.lifted_inputs: dict[int, Node] = {}
        self.lifted_attrs: dict[str, object] = {}

    def add(self, op: str, inputs, attrs=None, suffix: str = "") -> Node:
        name = self.node_name + (f"/{suffix}" if suffix else "")
        try:
            n = Node(op, inputs, attrs, name=name, origin=self.onnx_node.op_type)
        except GraphError as e:
            raise ConversionError(f"{self.onnx_node.op_type} '{self.node_name}': {e}") from None
        self.nodes.append(n)
        return n

    def const(self, value, suffix: str) -> Node:
        n = Node.const(value, name=f"{self.node_name}/{suffix}")
        self.nodes.append(n)
        return n

    def fail(self, msg: str):
        raise ConversionError(f"{self.onnx_node.op_type} '{self.node_name}': {msg}")

    def axis(self, value, rank: int) -> int:
        """An ONNX axis (an attribute, or a constant input of one value) in [-rank, rank), counted
        from 0; outside it, a one-line error."""
        a = int(np.ravel(value)[0])
        if not -rank <= a < rank:
            self.fail(f"axis {a} out of range for rank {rank}")
        return a % rank

    def used_extra_output(self, k: int, what: str):
        self.fail(f"output {k} ({what}) is used by the model; only inference outputs are supported")

    def input(self, k: int) -> Node | None:
        if k in self.lifted_inputs:
            return self.lifted_inputs[k]
        ins = self.onnx_node.input
        if k >= len(ins) or ins[k] == "":
            return None
        return self.env[ins[k]]

    def value(self, k: int, what: str, default=None):
        """The constant value of input k (folding constant subgraphs); default if absent."""
        n = self.input(k)
        if n is None:
            return default
        if n.is_const:
            return n.value
        deps = _input_deps(n)
        if deps:
            self.fail(f"{what} (input {k}, '{self.onnx_node.input[k]}') must be constant, "
                      f"but it depends on graph input '{deps[0].name}'")
        return run(Graph.from_outputs([], [n]), [])[0]

    def attr(self, name: str, default=None):
        if name in self.lifted_attrs:
            return self.lifted_attrs[name]
        onnx = _onnx()
        for a in self.onnx_node.attribute:
            if a.name == name:
                v = onnx.helper.get_attribute_value(a)
                if isinstance(v, bytes):
                    v = v.decode()
                if isinstance(v, onnx.TensorProto):
                    v = onnx.numpy_helper.to_array(v)
                return v
        return default


def _input_deps(n: Node) -> list[Node]:
    """The graph inputs a node's value depends on (none: it folds to a constant at import)."""
    return [m for m in topo_order([n]) if m.op == "input"]


# ---- converters ---------------------------------------------------------------------------------
CONVERTERS: dict[str, callable] = {}


def converter(*op_types):
    def deco(fn):
        for t in op_types:
            CONVERTERS[t] = fn
        return fn
    return deco


def _unary_table():
    table = {"Relu": "relu", "Sigmoid": "sigmoid", "Tanh": "tanh", "Erf": "erf", "Exp": "exp", "Sqrt": "sqrt",
             "Neg": "neg", "Reciprocal": "reciprocal", "Abs": "abs", "Log": "log", "Floor": "floor", "Ceil": "ceil",
             "Round": "round", "Sign": "sign", "Sin": "sin", "Cos": "cos", "Not": "logical_not"}
    for onnx_op, op in table.items():
        converter(onnx_op)(lambda c, op=op: c.add(op, [c.input(0)]))


_unary_table()

for _onnx_op, _op in {"Add": "add", "Sub": "sub", "Mul": "mul", "Div": "div", "Pow": "pow", "Equal": "equal",
                      "Less": "less", "Greater": "greater", "LessOrEqual": "less_equal",
                      "GreaterOrEqual": "greater_equal", "And": "logical_and", "Or": "logical_or",
                      "Xor": "logical_xor"}.items():
    converter(_onnx_op)(lambda c, op=_op: _binary(c, op))


@converter("Where")
def _where(c):
    return c.add("where", [c.input(0), c.input(1), c.input(2)])


@converter("ArgMax", "ArgMin")
def _arg_max_min(c):
    x = c.input(0)
    return c.add("argmax" if c.onnx_node.op_type == "ArgMax" else "argmin", [x],
                 {"axis": c.axis(c.attr("axis", 0), x.type.rank), "keepdims": int(c.attr("keepdims", 1)),
                  "select_last_index": int(c.attr("select_last_index", 0))})


@converter("TopK")
def _topk(c):
    """Values and indices as two nodes of one op (a graph node has one result); K must be constant."""
    x = c.input(0)
    k = c.value(1, "K") if c.opset >= 10 else c.attr("k")
    if k is None or np.size(k) != 1:
        c.fail("K must be one constant integer")
    attrs = {"k": int(np.ravel(k)[0]), "axis": c.axis(c.attr("axis", -1), x.type.rank),
             "largest": int(c.attr("largest", 1))}
    return [c.add("topk", [x], {**attrs, "output": which}, suffix=which)
            for which, name in zip(("values", "indices"), c.onnx_node.output) if name]


@converter("Softsign")
def _softsign(c):
    """x / (1 + |x|)."""
    x = c.input(0)
    one = c.const(np.asarray(1, x.dtype), "one")
    return c.add("div", [x, c.add("add", [c.add("abs", [x], suffix="abs"), one], suffix="denominator")])


@converter("ThresholdedRelu")
def _thresholded_relu(c):
    """x where x > alpha, else 0."""
    x = c.input(0)
    above = c.add("greater", [x, c.const(np.asarray(c.attr("alpha", 1.0), x.dtype), "alpha")], suffix="above")
    return c.add("where", [above, x, c.const(np.zeros((), x.dtype), "zero")])


@converter("Celu")
def _celu(c):
    """max(0, x) + min(0, alpha (exp(x / alpha) - 1))."""
    x = c.input(0)
    alpha = float(c.attr("alpha", 1.0))
    k = lambda v, name: c.const(np.asarray(v, x.dtype), name)  # noqa: E731
    e = c.add("exp", [c.add("mul", [x, k(1 / alpha, "inv_alpha")], suffix="scaled")], suffix="exp")
    neg = c.add("mul", [c.add("sub", [e, k(1, "one")], suffix="expm1"), k(alpha, "alpha")], suffix="negative")
    return c.add("add", [c.add("relu", [x], suffix="positive"),
                         c.add("minimum", [neg, k(0, "zero")], suffix="negative_part")])


@converter("Shrink")
def _shrink(c):
    """x + bias below -lambd, x - bias above lambd, else 0."""
    x = c.input(0)
    lambd, bias = float(c.attr("lambd", 0.5)), float(c.attr("bias", 0.0))
    k = lambda v, name: c.const(np.asarray(v, x.dtype), name)  # noqa: E731
    upper = c.add("where", [c.add("greater", [x, k(lambd, "lambd")], suffix="above"),
                            c.add("sub", [x, k(bias, "bias")], suffix="minus_bias"), k(0, "zero")], suffix="upper")
    return c.add("where", [c.add("less", [x, k(-lambd, "neg_lambd")], suffix="below"),
                           c.add("add", [x, k(bias, "bias_plus")], suffix="plus_bias"), upper])


@converter("Size")
def _size(c):
    return c.const(np.asarray(int(np.prod(c.input(0).shape)), np.int64), "size")


@converter("Max", "Min")
def _max_min(c):
    """Variadic elementwise Max/Min with broadcasting: a chain of binary maximum/minimum."""
    op = "maximum" if c.onnx_node.op_type == "Max" else "minimum"
    ins = [c.input(k) for k in range(len(c.onnx_node.input)) if c.input(k) is not None]
    y = ins[0]
    for k, x in enumerate(ins[1:]):
        y = c.add(op, [y, x], suffix="" if k == len(ins) - 2 else str(k))
    return y


def _binary(c: _Ctx, op: str) -> Node:
    a, b = c.input(0), c.input(1)
    if a.dtype != b.dtype and op == "pow":   # ONNX Pow: the exponent's type may differ; the result is the base's
        if b.is_const:
            return c.add(op, [a, c.const(b.value.astype(a.dtype), "exponent")])
        if a.dtype.startswith("float"):
            return c.add(op, [a, c.add("cast", [b], {"to": a.dtype}, suffix="exponent")])
        y = c.add(op, [c.add("cast", [a], {"to": b.dtype}, suffix="base"), b], suffix="float")
        return c.add("cast", [y], {"to": a.dtype})
    return c.add(op, [a, b])


@converter("Identity")
def _identity(c):
    return c.input(0)


@converter("Dropout")
def _dropout(c):
    """Inference Dropout: the identity, and its mask output (when named) all true, as ONNX defines
    it when training_mode is false. ratio does not matter then; training_mode must be a constant
    false (dropping at random is training)."""
    x = c.input(0)
    training = c.value(2, "training_mode", False)
    if training is not None and np.size(training) and bool(np.ravel(training)[0]):
        c.fail("training_mode is true: random dropout (training) is not supported; export the model in "
               "inference mode (training_mode false)")
    outs = c.onnx_node.output
    result = [x] if outs and outs[0] else []
    if len(outs) > 1 and outs[1]:   # bool since opset 10; opsets 7-9 declared it float
        dt = c.declared.get(outs[1])
        dt = _onnx().helper.tensor_dtype_to_np_dtype(dt) if dt else np.dtype(bool)
        result.append(c.const(np.ones(x.shape, dt), "mask"))
    return result


@converter("Sum", "Mean")
def _sum_mean(c):
    """Variadic elementwise Sum/Mean with broadcasting: a chain of adds (Mean then divides by the
    number of inputs)."""
    ins = [c.input(k) for k in range(len(c.onnx_node.input)) if c.input(k) is not None]
    if not ins:
        c.fail("needs at least one input")
    mean = c.onnx_node.op_type == "Mean"
    y = ins[0]
    for k, x in enumerate(ins[1:]):
        last = k == len(ins) - 2 and not mean
        y = c.add("add", [y, x], suffix="" if last else f"add{k}")
    if mean and len(ins) > 1:
        y = c.add("div", [y, c.const(np.asarray(len(ins), y.dtype), "count")])
    return y


@converter("LRN")
def _lrn(c):
    x = c.input(0)
    size = c.attr("size")
    if size is None or int(size) < 1:
        c.fail(f"attribute size must be a positive integer, got {size!r}")
    if x.type.rank < 3:
        c.fail(f"expects an input of rank >= 3 (N, C, spatial...), got {x.type}")
    return c.add("lrn", [x], {"size": int(size), "alpha": float(c.attr("alpha", 1e-4)),
                              "beta": float(c.attr("beta", 0.75)), "bias": float(c.attr("bias", 1.0))})


@converter("Constant")
def _constant(c):
    for key in ("value", "value_float", "value_floats", "value_int", "value_ints"):
        v = c.attr(key)
        if v is not None:
            arr = np.asarray(v, dtype=np.float32 if "float" in key else (np.int64 if "int" in key else None))
            return c.const(arr, "value")
    c.fail("only dense value/value_float(s)/value_int(s) constants are supported")


@converter("ConstantOfShape")
def _constant_of_shape(c):
    """A tensor filled with one value, of a constant shape. Converted here rather than folded
    before loading: Caffe2-era exports (onnx's light models) hold every weight this way, and
    folding would carry hundreds of MB of Constant nodes through the checker and opset upgrade."""
    shape = [int(d) for d in np.ravel(c.value(0, "shape"))]
    if any(d < 0 for d in shape):
        c.fail(f"negative dimension in shape {shape}")
    v = c.attr("value")
    v = np.zeros(1, np.float32) if v is None else np.asarray(v)
    if v.size != 1:
        c.fail(f"value must hold one element, got shape {list(v.shape)}")
    _check_size(c, shape, v.dtype)
    return c.const(np.full(shape, v.reshape(-1)[0], v.dtype), "value")


@converter("Range")
def _range(c):
    """start, start + delta, ... below limit (above it for a negative delta), all three constant:
    exports compute window and mask indices from static shapes this way (Swin's shifted windows)."""
    start, limit, delta = (np.asarray(c.value(k, what)) for k, what in enumerate(("start", "limit", "delta")))
    for k, (what, v) in enumerate((("start", start), ("limit", limit), ("delta", delta))):
        if v.size != 1:
            c.fail(f"{what} (input {k}) must be a scalar, got shape {list(v.shape)}")
    if len({start.dtype, limit.dtype, delta.dtype}) != 1:
        c.fail(f"start, limit and delta must have one dtype, got {start.dtype}, {limit.dtype}, {delta.dtype}")
    a, b, d = (v.reshape(()).item() for v in (start, limit, delta))
    if not all(math.isfinite(v) for v in (a, b, d)) or d == 0:
        c.fail(f"start {a}, limit {b} and delta {d} must be finite with a delta other than 0")
    n = max(int(math.ceil((b - a) / d)), 0)
    _check_size(c, [n], start.dtype)
    return c.const((a + np.arange(n, dtype=np.float64) * d).astype(start.dtype)
                   if start.dtype.kind == "f" else np.arange(n, dtype=start.dtype) * delta.dtype.type(d) + a, "range")


def _check_size(c, shape, dtype):
    """Refuse a tensor above MAX_TENSOR_BYTES before a converter allocates it (Node types check
    the same bound, but only once the array exists)."""
    nbytes = math.prod(shape) * np.dtype(dtype).itemsize
    if nbytes > MAX_TENSOR_BYTES:
        c.fail(f"shape {list(shape)} of {np.dtype(dtype)} holds {nbytes} bytes, above the limit of "
               f"{MAX_TENSOR_BYTES} bytes for one tensor")


@converter("Gelu")
def _gelu(c):
    return c.add("gelu", [c.input(0)], {"approximate": c.attr("approximate", "none")})


@converter("LeakyRelu")
def _leaky(c):
    return c.add("leaky_relu", [c.input(0)], {"alpha": float(c.attr("alpha", 0.01))})


@converter("HardSigmoid", "HardSwish")
def _hard_sigmoid(c):
    """HardSigmoid = clip(alpha x + beta, 0, 1); HardSwish = x HardSigmoid(x) with alpha 1/6, beta 1/2."""
    x = c.input(0)
    swish = c.onnx_node.op_type == "HardSwish"
    alpha, beta = (1 / 6, 0.5) if swish else (float(c.attr("alpha", 0.2)), float(c.attr("beta", 0.5)))
    y = c.add("mul", [x, c.const(np.asarray(alpha, x.dtype), "alpha")], suffix="alpha")
    y = c.add("add", [y, c.const(np.asarray(beta, x.dtype), "beta")], suffix="beta")
    y = c.add("clip", [y], {"min": 0.0, "max": 1.0}, suffix="clip" if swish else "")
    return c.add("mul", [x, y]) if swish else y


@converter("PRelu")
def _prelu(c):
    """PRelu = relu(x) - slope relu(-x), slope broadcast (per channel as PyTorch exports it)."""
    x, slope = c.input(0), c.input(1)
    if (slope.type.rank == 1 and x.type.rank > 2 and slope.shape[0] == x.shape[1] != x.shape[-1]
            and slope.shape[0] != 1):
        # a 1-D slope of C values is per channel (PRelu before opset 7, as old PyTorch exports wrote
        # it); numpy broadcasting would align it with the last axis instead
        slope = c.add("reshape", [slope], {"shape": (slope.shape[0],) + (1,) * (x.type.rank - 2)},
                      suffix="per_channel")
    pos = c.add("relu", [x], suffix="pos")
    neg = c.add("relu", [c.add("neg", [x], suffix="neg_x")], suffix="neg")
    return c.add("sub", [pos, c.add("mul", [neg, slope], suffix="slope")])


@converter("Clip")
def _clip(c):
    lo, hi = c.value(1, "min"), c.value(2, "max")
    return c.add("clip", [c.input(0)], {"min": None if lo is None else _scalar(c, lo, "min"),
                                        "max": None if hi is None else _scalar(c, hi, "max")})


def _scalar(c, v, what: str) -> float:
    v = np.asarray(v)
    if v.size != 1:
        c.fail(f"{what} must be a scalar, got shape {list(v.shape)}")
    return float(v.reshape(-1)[0])


@converter("Cast")
def _cast(c):
    to = str(_onnx().helper.tensor_dtype_to_np_dtype(c.attr("to")))
    return c.add("cast", [c.input(0)], {"to": to})


@converter("CastLike")
def _cast_like(c):
    """Cast to the second input's dtype (onnxscript-inlined functions use it for every constant)."""
    x, like = c.input(0), c.input(1)
    return x if x.dtype == like.dtype else c.add("cast", [x], {"to": like.dtype})


@converter("Mod")
def _mod(c):
    return c.add("mod", [c.input(0), c.input(1)], {"fmod": int(c.attr("fmod", 0))})


@converter("IsNaN")
def _is_nan(c):
    x = c.input(0)
    return c.add("logical_not", [c.add("equal", [x, x], suffix="self_equal")])


@converter("IsInf")
def _is_inf(c):
    """x == +inf and/or x == -inf, as detect_positive / detect_negative ask."""
    x = c.input(0)
    signs = [s for s, on in ((np.inf, c.attr("detect_positive", 1)), (-np.inf, c.attr("detect_negative", 1))) if on]
    if not signs:
        return c.const(np.zeros(x.shape, bool), "none")
    hits = [c.add("equal", [x, c.const(np.asarray(s, x.dtype), f"inf{k}")], suffix=f"is{k}")
            for k, s in enumerate(signs)]
    return hits[0] if len(hits) == 1 else c.add("logical_or", hits)


@converter("Trilu")
def _trilu(c):
    """The lower (upper=0) or upper triangle of the last two axes from diagonal k, as where over a
    constant mask; k must be constant."""
    x = c.input(0)
    if x.type.rank < 2:
        c.fail(f"input must have rank >= 2, got {x.type}")
    k = int(np.ravel(c.value(1, "k", 0))[0]) if c.input(1) is not None else 0
    n, m = x.shape[-2:]
    mask = np.triu(np.ones((n, m), bool), k) if c.attr("upper", 1) else np.tril(np.ones((n, m), bool), k)
    return c.add("where", [c.const(mask, "mask"), x, c.const(np.zeros((), x.dtype), "zero")])


@converter("CumSum")
def _cumsum(c):
    """Running sum along a constant axis as a matmul with a triangular 0/1 matrix (exclusive and
    reverse pick which triangle); float inputs."""
    x = c.input(0)
    if not x.dtype.startswith("float"):
        c.fail(f"only float inputs are supported, got {x.dtype}")
    rank = x.type.rank
    ax = c.axis(c.value(1, "axis"), rank)
    n = x.shape[ax]
    i, j = np.arange(n)[:, None], np.arange(n)[None, :]     # out[j] = sum of x[i] over the kept i
    keep = (i > j if c.attr("exclusive", 0) else i >= j) if c.attr("reverse", 0) else \
        (i < j if c.attr("exclusive", 0) else i <= j)
    perm = tuple(d for d in range(rank) if d != ax) + (ax,)
    t = c.add("transpose", [x], {"perm": perm}, suffix="axis_last") if ax != rank - 1 else x
    t = c.add("matmul", [t, c.const(keep.astype(x.dtype), "triangle")], suffix="sum" if ax != rank - 1 else "")
    return c.add("transpose", [t], {"perm": tuple(int(p) for p in np.argsort(perm))}) if ax != rank - 1 else t


@converter("OneHot")
def _one_hot(c):
    """values[1] where indices == position along the new axis, values[0] elsewhere; depth and
    values constant, negative indices counted from the end."""
    idx = c.input(0)
    depth = int(np.ravel(c.value(1, "depth"))[0])
    values = np.asarray(c.value(2, "values"))
    if depth < 1 or values.size != 2:
        c.fail(f"depth must be >= 1 and values two numbers, got depth {depth}, {values.size} value(s)")
    rank = idx.type.rank + 1
    ax = c.axis(c.attr("axis", -1), rank)
    if idx.dtype.startswith("float"):
        idx = c.add("cast", [c.add("floor", [idx], suffix="floor")], {"to": "int64"}, suffix="int")
    elif idx.dtype != "int64":
        idx = c.add("cast", [idx], {"to": "int64"}, suffix="int")
    wrapped = c.add("where", [c.add("less", [idx, c.const(np.int64(0), "zero")], suffix="negative"),
                              c.add("add", [idx, c.const(np.int64(depth), "depth")], suffix="from_end"), idx],
                    suffix="wrapped")
    pos_shape = [1] * rank
    pos_shape[ax] = depth
    shape = list(idx.shape)
    shape.insert(ax, 1)
    hot = c.add("equal", [c.add("reshape", [wrapped], {"shape": tuple(shape)}, suffix="expand"),
                          c.const(np.arange(depth, dtype=np.int64).reshape(pos_shape), "positions")], suffix="hot")
    return c.add("where", [hot, c.const(values[1], "on"), c.const(values[0], "off")])


@converter("Hardmax")
def _hardmax(c):
    """1 at the first maximum along the axis, 0 elsewhere."""
    x = c.input(0)
    rank = x.type.rank
    ax = c.axis(c.attr("axis", -1), rank)
    arg = c.add("argmax", [x], {"axis": ax, "keepdims": 1, "select_last_index": 0}, suffix="argmax")
    pos_shape = [1] * rank
    pos_shape[ax] = x.shape[ax]
    hot = c.add("equal", [arg, c.const(np.arange(x.shape[ax], dtype=np.int64).reshape(pos_shape), "positions")],
                suffix="hot")
    return c.add("cast", [hot], {"to": x.dtype})


def _same_pads(c, in_hw, k_hw, strides, dilations, mode):
    pads = [0, 0, 0, 0]
    for i in range(2):
        out = -(-in_hw[i] // strides[i])
        total = max((out - 1) * strides[i] + (k_hw[i] - 1) * dilations[i] + 1 - in_hw[i], 0)
        small, big = total // 2, total - total // 2
        pads[i], pads[i + 2] = (small, big) if mode == "SAME_UPPER" else (big, small)
    return pads


def _window_attrs(c, x: Node, k_hw):
    strides = list(c.attr("strides", [1, 1]))
    dilations = list(c.attr("dilations", [1, 1]))
    auto_pad = c.attr("auto_pad", "NOTSET")
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        pads = _same_pads(c, x.shape[2:], k_hw, strides, dilations, auto_pad)
    elif auto_pad == "VALID":
        pads = [0, 0, 0, 0]
    else:
        pads = list(c.attr("pads", [0, 0, 0, 0]))
    return strides, pads, dilations


def _check_kernel_shape(c, w: Node):
    """ONNX's kernel_shape is optional but, when given, must be the weight's spatial dims: a model
    that says otherwise is malformed (onnxruntime refuses it), not a hint to compute another conv."""
    ks = c.attr("kernel_shape")
    if ks is not None and [int(k) for k in ks] != list(w.shape[2:]):
        c.fail(f"attribute kernel_shape {[int(k) for k in ks]} does not match the weight's spatial dims "
               f"{list(w.shape[2:])}")


def _as_2d(convert):
    """A window op on a 1-D signal (N, C, L) converted as its 2-D form on (N, C, 1, L): the input
    and a 3-D weight gain a unit axis, the window attributes a leading 1 (pads and output padding
    a 0), and the result drops the axis again. The 2-D kernels then serve audio and sequence
    models unchanged."""
    lead = {"strides": 1, "dilations": 1, "kernel_shape": 1, "output_padding": 0, "output_shape": 1}

    def run(c):
        x = c.input(0)
        if x is None or x.type.rank != 3:
            return convert(c)
        lifted = {}
        for name, first in lead.items():
            v = c.attr(name)
            if v is not None:
                if len(v) != 1:
                    c.fail(f"{name} {list(v)} has {len(v)} values for a 1-D input {x.type}")
                lifted[name] = [first, int(v[0])]
        p = c.attr("pads")
        if p is not None:
            if len(p) != 2:
                c.fail(f"pads {list(p)} has {len(p)} values for a 1-D input {x.type} (begin, end)")
            lifted["pads"] = [0, int(p[0]), 0, int(p[1])]
        n, ch, length = x.shape
        ins = {0: c.add("reshape", [x], {"shape": (n, ch, 1, length)}, suffix="as_2d")}
        w = c.input(1)
        if w is not None and w.type.rank == 3 and c.onnx_node.op_type in ("Conv", "ConvTranspose"):
            ins[1] = (c.const(w.value[:, :, None, :], "weight_2d") if w.is_const
                      else c.add("reshape", [w], {"shape": (w.shape[0], w.shape[1], 1, w.shape[2])}, suffix="weight_2d"))
        c.lifted_inputs, c.lifted_attrs = ins, lifted
        try:
            y = convert(c)
        finally:
            c.lifted_inputs, c.lifted_attrs = {}, {}
        return c.add("reshape", [y], {"shape": (y.shape[0], y.shape[1], y.shape[3])}, suffix="as_1d")
    return run


@converter("Conv")
@_as_2d
def _conv(c):
    x, w, b = c.input(0), c.input(1), c.input(2)
    if x.type.rank != 4 or w.type.rank != 4:
        c.fail(f"only 1-D and 2-D convolution (NCL/NCHW input, OIL/OIHW weight) is supported, got {x.type} and {w.type}")
    _check_kernel_shape(c, w)
    strides, pads, dilations = _window_attrs(c, x, w.shape[2:])
    attrs = {"strides": strides, "pads": pads, "dilations": dilations, "groups": int(c.attr("group", 1))}
    return c.add("conv2d", [x, w] + ([b] if b is not None else []), attrs)


@converter("ConvTranspose")
@_as_2d
def _conv_transpose(c):
    x, w, b = c.input(0), c.input(1), c.input(2)
    if x.type.rank != 4 or w.type.rank != 4:
        c.fail("only 1-D and 2-D transposed convolution is supported")
    _check_kernel_shape(c, w)
    strides = list(c.attr("strides", [1, 1]))
    dilations = list(c.attr("dilations", [1, 1]))
    out_pad = list(c.attr("output_padding", [0, 0]))
    groups = int(c.attr("group", 1))
    pads = list(c.attr("pads", [0, 0, 0, 0]))
    out_shape = c.attr("output_shape")
    auto_pad = c.attr("auto_pad", "NOTSET")
    if out_shape is not None or auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        target = list(out_shape)[-2:] if out_shape is not None else [x.shape[2 + i] * strides[i] for i in range(2)]
        for i in range(2):
            total = strides[i] * (x.shape[2 + i] - 1) + out_pad[i] + (w.shape[2 + i] - 1) * dilations[i] + 1 - target[i]
            if total < 0:
                c.fail(f"output_shape {target} larger than the full output")
            if auto_pad == "SAME_UPPER":
                pads[i], pads[i + 2] = total // 2, total - total // 2
            else:
                pads[i], pads[i + 2] = total - total // 2, total // 2
    for i in range(2):
        if not 0 <= out_pad[i] < max(strides[i], dilations[i]):   # the ONNX rule onnxruntime enforces
            c.fail(f"output_padding {out_pad} must be non-negative and below max(stride, dilation) "
                   f"{[max(s, d) for s, d in zip(strides, dilations)]}")
    attrs = {"strides": strides, "pads": pads, "dilations": dilations, "groups": groups, "output_padding": out_pad}
    return c.add("conv2d_transpose", [x, w] + ([b] if b is not None else []), attrs)


@converter("Gemm")
def _gemm(c):
    a, b, bias = c.input(0), c.input(1), c.input(2)
    alpha, beta = float(c.attr("alpha", 1.0)), float(c.attr("beta", 1.0))
    if c.attr("transA", 0):
        a = c.add("transpose", [a], {"perm": (1, 0)}, "transA")
    if b.is_const:
        wv = b.value if c.attr("transB", 0) else b.value.T
        if alpha != 1.0:
            wv, alpha = wv * alpha, 1.0
        w = c.const(wv, "weight")
        use_bias = bias is not None and bias.is_const and bias.type.rank <= 1 and \
            (bias.type.size == w.shape[0] or bias.type.size == 1)
        inputs = [a, w]
        if use_bias:
            inputs.append(c.const(np.broadcast_to(bias.value.reshape(-1) * beta, (w.shape[0],)).astype(w.dtype), "bias"))
        y = c.add("dense", inputs)
        if bias is not None and not use_bias:
            bias = bias if beta == 1.0 else c.add("mul", [bias, c.const(np.asarray(beta, bias.dtype), "beta")], suffix="beta")
            y = c.add("add", [y, bias], suffix="bias")
        return y
    if c.attr("transB", 0):
        b = c.add("transpose", [b], {"perm": (1, 0)}, "transB")
    y = c.add("matmul", [a, b], suffix="matmul")
    if alpha != 1.0:
        y = c.add("mul", [y, c.const(np.asarray(alpha, y.dtype), "alpha")], suffix="alpha")
    if bias is not None:
        if beta != 1.0:
            bias = c.add("mul", [bias, c.const(np.asarray(beta, bias.dtype), "beta")], suffix="beta")
        y = c.add("add", [y, bias], suffix="bias")
    return y


@converter("MatMul")
def _matmul(c):
    a, b = c.input(0), c.input(1)
    if b.is_const and b.type.rank == 2 and a.type.rank >= 2:
        w = c.const(np.ascontiguousarray(b.value.T), "weight")  # dense weight layout (O, K)
        if a.type.rank == 2:
            return c.add("dense", [a, w])
        lead = a.shape[:-1]
        flat = c.add("reshape", [a], {"shape": (int(np.prod(lead)), a.shape[-1])}, "flatten")
        y = c.add("dense", [flat, w], suffix="dense")
        return c.add("reshape", [y], {"shape": (*lead, w.shape[0])})
    return c.add("matmul", [a, b])


@converter("BatchNormalization")
def _bn(c):
    if c.attr("training_mode", 0):
        c.fail("training_mode=1 is not supported (inference only)")
    for k in (1, 2):
        if len(c.onnx_node.output) > k and c.onnx_node.output[k]:
            c.used_extra_output(k, "running statistics (training only)")
    eps = float(c.attr("epsilon", 1e-5))
    var = c.input(4)
    if var is not None and var.is_const and np.any(np.asarray(var.value, np.float64) + eps <= 0):
        # sqrt(var + epsilon) would be NaN or a division by zero: every output of the channel NaN
        c.fail(f"variance + epsilon ({eps}) must be positive, but it is not for "
               f"{int(np.sum(np.asarray(var.value, np.float64) + eps <= 0))} channel(s)")
    return c.add("batch_norm", [c.input(k) for k in range(5)], {"epsilon": eps})


def _pool_attrs(c, x):
    k = list(c.attr("kernel_shape"))
    if len(k) != 2 or x.type.rank != 4:
        c.fail(f"only 1-D and 2-D pooling is supported (kernel_shape {k}, input {x.type})")
    if any(d != 1 for d in c.attr("dilations", [1, 1])):
        c.fail("dilated pooling is not supported")
    strides = list(c.attr("strides", [1, 1]))
    auto_pad = c.attr("auto_pad", "NOTSET")
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        pads = _same_pads(c, x.shape[2:], k, strides, [1, 1], auto_pad)
    else:
        pads = [0, 0, 0, 0] if auto_pad == "VALID" else list(c.attr("pads", [0, 0, 0, 0]))
    return {"kernel": k, "strides": strides, "pads": pads, "ceil_mode": int(c.attr("ceil_mode", 0))}


@converter("MaxPool")
@_as_2d
def _maxpool(c):
    if len(c.onnx_node.output) > 1 and c.onnx_node.output[1]:
        c.used_extra_output(1, "the Indices output")
    return c.add("max_pool2d", [c.input(0)], _pool_attrs(c, c.input(0)))


@converter("AveragePool")
@_as_2d
def _avgpool(c):
    attrs = _pool_attrs(c, c.input(0))
    attrs["count_include_pad"] = int(c.attr("count_include_pad", 0))
    return c.add("avg_pool2d", [c.input(0)], attrs)


@converter("GlobalAveragePool", "GlobalMaxPool")
def _gap(c):
    x = c.input(0)
    avg = c.onnx_node.op_type == "GlobalAveragePool"
    if x.type.rank != 4:   # a 1-D (or 3-D) signal: the same mean or max over every spatial axis
        if x.type.rank < 3:
            c.fail(f"expects an (N, C, spatial...) input of rank 3 or more, got {x.type}")
        return c.add("reduce_mean" if avg else "reduce_max", [x],
                     {"axes": tuple(range(2, x.type.rank)), "keepdims": 1})
    return c.add("global_avg_pool" if avg else "global_max_pool", [x])


@converter("Flatten")
def _flatten(c):
    x = c.input(0)
    r, ax = x.type.rank, int(c.attr("axis", 1))
    if not -r <= ax <= r:
        c.fail(f"axis {ax} out of range [-{r}, {r}] for rank {r}")
    ax = ax + r if ax < 0 else ax    # -1 keeps the last axis apart: (prod of the others, last)
    return c.add("reshape", [x], {"shape": (int(np.prod(x.shape[:ax])), int(np.prod(x.shape[ax:])))})


@converter("Reshape")
def _reshape(c):
    x = c.input(0)
    spec = [int(v) for v in c.value(1, "shape")]
    allowzero = int(c.attr("allowzero", 0))
    shape = [x.shape[i] if d == 0 and not allowzero else d for i, d in enumerate(spec)]
    if shape.count(-1) > 1:
        c.fail(f"shape {spec} has more than one -1")
    if -1 in shape:
        known = int(np.prod([d for d in shape if d != -1]))
        if known == 0 or x.type.size % known:
            c.fail(f"cannot reshape {x.type} to {spec}")
        shape[shape.index(-1)] = x.type.size // known
    return c.add("reshape", [x], {"shape": tuple(shape)})


@converter("Squeeze")
def _squeeze(c):
    x = c.input(0)
    axes = c.value(1, "axes") if c.opset >= 13 else c.attr("axes")
    r = x.type.rank
    axes = [i for i, d in enumerate(x.shape) if d == 1] if axes is None else [int(a) % r for a in np.ravel(axes)]
    if any(x.shape[a] != 1 for a in axes):
        c.fail(f"cannot squeeze axes {axes} of {x.type}")
    return c.add("reshape", [x], {"shape": tuple(d for i, d in enumerate(x.shape) if i not in axes)})


@converter("Unsqueeze")
def _unsqueeze(c):
    x = c.input(0)
    axes = [int(a) for a in np.ravel(c.value(1, "axes"))]
    r = x.type.rank + len(axes)
    axes = sorted(a % r for a in axes)
    shape = list(x.shape)
    for a in axes:
        shape.insert(a, 1)
    return c.add("reshape", [x], {"shape": tuple(shape)})


@converter("Transpose")
def _transpose(c):
    x = c.input(0)
    perm = c.attr("perm")
    perm = tuple(range(x.type.rank))[::-1] if perm is None else tuple(int(p) for p in perm)
    return c.add("transpose", [x], {"perm": perm})


@converter("Concat")
def _concat(c):
    ins = [c.input(k) for k in range(len(c.onnx_node.input))]
    return c.add("concat", ins, {"axis": int(c.attr("axis")) % ins[0].type.rank})


def _norm_slice(start, end, step, dim):
    if start < 0:
        start += dim
    if end < 0:
        end += dim
    if step > 0:
        start, end = min(max(start, 0), dim), min(max(end, 0), dim)
    else:
        start, end = min(max(start, 0), dim - 1), min(max(end, -1), dim - 1)
    return start, end


@converter("Slice")
def _slice(c):
    x = c.input(0)
    starts = [int(v) for v in c.value(1, "starts")]
    ends = [int(v) for v in c.value(2, "ends")]
    axes = [int(v) % x.type.rank for v in c.value(3, "axes", range(len(starts)))]
    steps = [int(v) for v in c.value(4, "steps", [1] * len(starts))]
    norm = [_norm_slice(s, e, st, x.shape[a]) for s, e, a, st in zip(starts, ends, axes, steps)]
    return c.add("slice", [x], {"starts": tuple(s for s, _ in norm), "ends": tuple(e for _, e in norm),
                                "axes": tuple(axes), "steps": tuple(steps)})


@converter("Split")
def _split(c):
    x = c.input(0)
    ax = int(c.attr("axis", 0)) % x.type.rank
    n_out = len(c.onnx_node.output)
    split = c.value(1, "split")
    if split is None:
        split = c.attr("split")
    dim = x.shape[ax]
    if split is None:
        n = int(c.attr("num_outputs", n_out))
        size = -(-dim // n)
        split = [min(size, dim - k * size) for k in range(n)]
    split = [int(s) for s in split]
    if sum(split) != dim:
        c.fail(f"split sizes {split} do not add up to dimension {dim}")
    outs, start = [], 0
    for k, s in enumerate(split):
        outs.append(c.add("slice", [x], {"starts": (start,), "ends": (start + s,), "axes": (ax,), "steps": (1,)},
                          str(k)))
        start += s
    return outs


@converter("Pad")
def _pad(c):
    x = c.input(0)
    r = x.type.rank
    pads = [int(v) for v in c.value(1, "pads")]
    value = c.value(2, "constant_value", 0.0)
    axes = c.value(3, "axes")
    if axes is not None:
        full = [0] * (2 * r)
        axes = [int(a) % r for a in axes]
        for k, a in enumerate(axes):
            full[a], full[a + r] = pads[k], pads[k + len(axes)]
        pads = full
    if min(pads) < 0:
        c.fail(f"negative pads {pads} (cropping) are not supported")
    mode = c.attr("mode", "constant")
    if mode not in ("constant", "reflect", "edge"):
        c.fail(f"pad mode {mode!r} is not supported (constant, reflect, edge)")
    return c.add("pad", [x], {"pads": tuple(pads), "mode": mode, "value": float(np.asarray(value).reshape(-1)[0]) if np.size(value) else 0.0})


@converter("Softmax")
def _softmax(c):
    return c.add("softmax", [c.input(0)], {"axis": int(c.attr("axis", -1)) % c.input(0).type.rank})


@converter("LayerNormalization")
def _layer_norm(c):
    for k in (1, 2):
        if len(c.onnx_node.output) > k and c.onnx_node.output[k]:
            c.used_extra_output(k, "Mean/InvStdDev")
    ins = [c.input(0), c.input(1)] + ([c.input(2)] if c.input(2) is not None else [])
    return c.add("layer_norm", ins, {"axis": int(c.attr("axis", -1)) % c.input(0).type.rank,
                                     "epsilon": float(c.attr("epsilon", 1e-5))})


def _reduce_axes(c) -> tuple | None | bool:
    """A Reduce* node's axes (None: all), or False for a no-op (empty axes, noop_with_empty_axes)."""
    x = c.input(0)
    # axes became an input: ReduceSum at opset 13, the others at 18
    axes = c.value(1, "axes") if c.opset >= (13 if c.onnx_node.op_type == "ReduceSum" else 18) else c.attr("axes")
    if axes is None or np.size(axes) == 0:
        return False if c.attr("noop_with_empty_axes", 0) else None
    return tuple(c.axis(a, x.type.rank) for a in np.ravel(axes))


@converter("ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd")
def _reduce(c):
    x = c.input(0)
    op = "reduce_" + c.onnx_node.op_type[len("Reduce"):].lower()
    axes = _reduce_axes(c)
    if axes is False:
        return x
    return c.add(op, [x], {"axes": axes, "keepdims": int(c.attr("keepdims", 1))})


@converter("ReduceL1", "ReduceL2", "ReduceSumSquare", "ReduceLogSum", "ReduceLogSumExp")
def _reduce_composite(c):
    """Sums of |x|, x^2 or exp(x - max) (the max added back after the log), then sqrt or log."""
    x = c.input(0)
    kind = c.onnx_node.op_type
    axes, keepdims = _reduce_axes(c), int(c.attr("keepdims", 1))
    if axes is False:
        axes, keepdims = (), 1          # a reduction over no axis: the elementwise steps alone
    shift = None
    if kind == "ReduceL1":
        v = c.add("abs", [x], suffix="abs")
    elif kind in ("ReduceL2", "ReduceSumSquare"):
        v = c.add("mul", [x, x], suffix="square")
    elif kind == "ReduceLogSumExp":
        shift = c.add("reduce_max", [x], {"axes": axes, "keepdims": 1}, suffix="max") if axes != () else x
        v = c.add("exp", [c.add("sub", [x, shift], suffix="shifted")], suffix="exp")
    else:
        v = x
    post = {"ReduceL2": "sqrt", "ReduceLogSum": "log", "ReduceLogSumExp": "log"}.get(kind)
    keep = keepdims if shift is None else 1
    y = v if axes == () else c.add("reduce_sum", [v], {"axes": axes, "keepdims": keep},
                                   suffix="sum" if post or shift is not None else "")
    if post:
        y = c.add(post, [y], suffix=post if shift is not None else "")
    if shift is not None:
        y = c.add("add", [y, shift], suffix="" if keepdims else "keepdims")
        if not keepdims:
            rank = x.type.rank
            kept = tuple(d for k, d in enumerate(x.shape) if k not in (range(rank) if axes is None else axes))
            y = c.add("reshape", [y], {"shape": kept})
    return y


@converter("LpNormalization")
def _lp_normalization(c):
    """x / ||x||_p along one axis (p 1 or 2); 0 where the norm is 0."""
    x = c.input(0)
    p = int(c.attr("p", 2))
    if p not in (1, 2):
        c.fail(f"p={p} must be 1 or 2")
    axis = c.axis(c.attr("axis", -1), x.type.rank)
    v = c.add("abs", [x], suffix="abs") if p == 1 else c.add("mul", [x, x], suffix="square")
    norm = c.add("reduce_sum", [v], {"axes": (axis,), "keepdims": 1}, suffix="sum")
    if p == 2:
        norm = c.add("sqrt", [norm], suffix="norm")
    zero = c.add("equal", [norm, c.const(np.zeros((), x.dtype), "zero")], suffix="is_zero")
    norm = c.add("where", [zero, c.const(np.ones((), x.dtype), "one"), norm], suffix="safe_norm")
    return c.add("div", [x, norm])    # an all-zero slice stays 0 (ONNX's reference), not 0/0


@converter("MeanVarianceNormalization")
def _mean_variance_normalization(c):
    """(x - mean) / (std + 1e-9) over axes (default N, H, W), as ONNX's function body defines it."""
    x = c.input(0)
    rank = x.type.rank
    axes = tuple(int(a) % rank for a in c.attr("axes", [0, 2, 3]))
    mean = c.add("reduce_mean", [x], {"axes": axes, "keepdims": 1}, suffix="mean")
    d = c.add("sub", [x, mean], suffix="centered")
    var = c.add("reduce_mean", [c.add("mul", [d, d], suffix="square")], {"axes": axes, "keepdims": 1}, suffix="var")
    std = c.add("add", [c.add("sqrt", [var], suffix="std"), c.const(np.asarray(1e-9, x.dtype), "epsilon")],
                suffix="std_eps")
    return c.add("div", [d, std])


@converter("GroupNormalization")
def _group_normalization(c):
    """Per (sample, group) over the group's channels and the spatial axes: layer_norm of x seen as
    (N, G, C/G * spatial) with unit scale, then the per-channel scale and bias (opset 21; onnx's
    checker refuses the per-group form of opsets 18-20 as deprecated)."""
    x, scale, bias = c.input(0), c.input(1), c.input(2)
    if x.type.rank < 2:
        c.fail(f"input must have a channel axis, got shape {list(x.shape)}")
    g = int(c.attr("num_groups", 0))
    n, ch = x.shape[0], x.shape[1]
    if g < 1 or ch % g:
        c.fail(f"num_groups={g} must be >= 1 and divide the {ch} channels")
    for k, t in ((1, scale), (2, bias)):
        if tuple(t.shape) != (ch,):
            c.fail(f"input {k} has shape {list(t.shape)}; expected [{ch}], one per channel")
    inner = ch // g * int(np.prod(x.shape[2:], dtype=np.int64))
    y = c.add("reshape", [x], {"shape": (n, g, inner)}, suffix="groups")
    y = c.add("layer_norm", [y, c.const(np.ones(inner, x.dtype), "unit_scale")],
              {"axis": 2, "epsilon": float(c.attr("epsilon", 1e-5))}, suffix="normalize")
    y = c.add("reshape", [y], {"shape": tuple(x.shape)}, suffix="ungroup")
    shape = (ch,) + (1,) * (x.type.rank - 2)
    sc = c.add("reshape", [scale], {"shape": shape}, suffix="scale_shape")
    bi = c.add("reshape", [bias], {"shape": shape}, suffix="bias_shape")
    return c.add("add", [c.add("mul", [y, sc], suffix="scale"), bi])


@converter("LogSoftmax")
def _log_softmax(c):
    """(x - max) - log(sum(exp(x - max))) along the axis."""
    x = c.input(0)
    ax = int(c.attr("axis", -1)) % x.type.rank
    d = c.add("sub", [x, c.add("reduce_max", [x], {"axes": (ax,), "keepdims": 1}, suffix="max")], suffix="shifted")
    s = c.add("reduce_sum", [c.add("exp", [d], suffix="exp")], {"axes": (ax,), "keepdims": 1}, suffix="sum")
    return c.add("sub", [d, c.add("log", [s], suffix="log")])


@converter("InstanceNormalization")
def _instance_norm(c):
    """Per (sample, channel) over the spatial axes: layer_norm from axis 2 (unit scale), then the
    per-channel scale and bias (PyTorch exports GroupNorm as reshape - this - reshape)."""
    x, scale, bias = c.input(0), c.input(1), c.input(2)
    inner = x.shape[2:]
    ones = c.const(np.ones(inner, x.dtype), "unit_scale")
    y = c.add("layer_norm", [x, ones], {"axis": 2, "epsilon": float(c.attr("epsilon", 1e-5))}, suffix="normalize")
    per_channel = (x.shape[1],) + (1,) * len(inner)
    sc = c.add("reshape", [scale], {"shape": per_channel}, suffix="scale_shape")
    bi = c.add("reshape", [bias], {"shape": per_channel}, suffix="bias_shape")
    return c.add("add", [c.add("mul", [y, sc], suffix="scale"), bi])


@converter("QuantizeLinear")
def _quantize_linear(c):
    if c.attr("block_size", 0):
        c.fail("blocked quantization is not supported")
    ins = [c.input(k) for k in range(3) if c.input(k) is not None]
    dt = "uint8"
    odt = c.attr("output_dtype", 0)
    if odt:
        dt = str(_onnx().helper.tensor_dtype_to_np_dtype(odt))
    return c.add("quantize_linear", ins, {"axis": int(c.attr("axis", 1)), "dtype": dt})


@converter("DequantizeLinear")
def _dequantize_linear(c):
    if c.attr("block_size", 0):
        c.fail("blocked quantization is not supported")
    ins = [c.input(k) for k in range(3) if c.input(k) is not None]
    return c.add("dequantize_linear", ins, {"axis": int(c.attr("axis", 1))})


@converter("Shape")
def _shape(c):
    shape = np.asarray(c.input(0).shape, np.int64)
    start, end = c.attr("start", 0), c.attr("end")
    return c.const(shape[start:end], "shape")


@converter("Gather")
def _gather(c):
    """Constant indices: take (injective, fuses, int8 passes through); indices computed at run
    time (token ids into an embedding table): gather."""
    x = c.input(0)
    ax = int(c.attr("axis", 0)) % x.type.rank
    idx = c.input(1)
    if _input_deps(idx):
        return c.add("gather", [x, idx], {"axis": ax})
    return c.add("take", [x], {"indices": np.asarray(c.value(1, "indices"), np.int64), "axis": ax})


@converter("GatherElements", "GatherND", "ScatterND", "ScatterElements")
def _gather_scatter(c):
    """Index ops whose indices come at run time (argmax/topk results, in-place slice assignment as
    PyTorch exports it): their NumPy reference is the CPU step."""
    op = {"GatherElements": "gather_elements", "GatherND": "gather_nd", "ScatterND": "scatter_nd",
          "ScatterElements": "scatter_elements"}[c.onnx_node.op_type]
    ins = [c.input(k) for k in range(len(c.onnx_node.input))]
    x = ins[0]
    if op in ("gather_elements", "scatter_elements"):
        attrs = {"axis": c.axis(c.attr("axis", 0), x.type.rank)}
    elif op == "gather_nd":
        attrs = {"batch_dims": int(c.attr("batch_dims", 0))}
    else:
        attrs = {}
    if op.startswith("scatter"):
        attrs["reduction"] = c.attr("reduction", "none")
    return c.add(op, ins, attrs)


@converter("Upsample")
def _upsample(c):
    """Upsample (deprecated at opset 10) is Resize with asymmetric coordinates, nearest rounding
    down: converted as that Resize. Scales come from the input (opset 9), the attribute (opset 7)
    or height_scale/width_scale (opset 1, where linear was called bilinear)."""
    onnx = _onnx()
    mode = c.attr("mode", "nearest")
    mode = "linear" if mode == "bilinear" else mode
    if mode not in ("nearest", "linear"):
        c.fail(f"mode {mode!r} is not supported (nearest, linear)")
    scales = c.value(1, "scales") if c.input(1) is not None else c.attr("scales")
    if scales is None and c.attr("height_scale") is not None:
        scales = [1.0, 1.0, float(c.attr("height_scale")), float(c.attr("width_scale", 1.0))]
    if scales is None:
        c.fail("no scales given (input 1, or the scales attribute)")
    scales = np.asarray(scales, np.float32).reshape(-1)
    if len(scales) != c.input(0).type.rank:
        c.fail(f"{len(scales)} scales for an input of rank {c.input(0).type.rank}")
    name = f"{c.node_name}/scales"
    c.env[name] = c.const(scales, "scales")
    node = onnx.helper.make_node("Resize", [c.onnx_node.input[0], "", name], list(c.onnx_node.output),
                                 name=c.node_name, mode=mode, coordinate_transformation_mode="asymmetric",
                                 nearest_mode="floor")
    upsample, c.onnx_node = c.onnx_node, node
    try:
        return _resize(c)
    finally:
        c.onnx_node = upsample


@converter("ImageScaler")
def _image_scaler(c):
    """scale x + bias[channel] (opsets 1-9; load_model rewrites it the same way before the upgrade)."""
    x = c.input(0)
    bias = np.asarray(c.attr("bias", []), x.dtype).reshape(-1)
    if bias.size not in (0, x.shape[1]):
        c.fail(f"bias has {bias.size} values for {x.shape[1]} channels")
    y = c.add("mul", [x, c.const(np.asarray(float(c.attr("scale", 1.0)), x.dtype), "scale")],
              suffix="scale" if bias.size else "")
    if bias.size:
        y = c.add("add", [y, c.const(bias.reshape((-1,) + (1,) * (x.type.rank - 2)), "bias")])
    return y


def _exp_minus_one_of_negative_part(c, x):
    """exp(min(x, 0)) - 1: the negative branch of ELU-type activations, finite for every x."""
    zero = c.const(np.asarray(0.0, x.dtype), "zero")
    e = c.add("exp", [c.add("minimum", [x, zero], suffix="neg_part")], suffix="exp")
    return c.add("sub", [e, c.const(np.asarray(1.0, x.dtype), "one")], suffix="expm1")


@converter("Elu", "Selu")
def _elu(c):
    """Elu = relu(x) + alpha (exp(min(x, 0)) - 1); Selu = gamma Elu with its alpha."""
    x = c.input(0)
    selu = c.onnx_node.op_type == "Selu"
    alpha = float(c.attr("alpha", 1.67326319217681884765625 if selu else 1.0))
    neg = c.add("mul", [_exp_minus_one_of_negative_part(c, x), c.const(np.asarray(alpha, x.dtype), "alpha")],
                suffix="alpha")
    y = c.add("add", [c.add("relu", [x], suffix="pos"), neg], suffix="sum" if selu else "")
    if selu:
        y = c.add("mul", [y, c.const(np.asarray(float(c.attr("gamma", 1.05070102214813232421875)), x.dtype), "gamma")])
    return y


def _softplus(c, x, last: bool):
    """log(1 + exp(x)) as relu(x) + log(1 + exp(-|x|)), which does not overflow."""
    t = c.add("exp", [c.add("neg", [c.add("abs", [x], suffix="abs")], suffix="neg_abs")], suffix="exp")
    t = c.add("log", [c.add("add", [t, c.const(np.asarray(1.0, x.dtype), "one")], suffix="one_plus")], suffix="log")
    return c.add("add", [c.add("relu", [x], suffix="pos"), t], suffix="" if last else "softplus")


@converter("Softplus")
def _softplus_op(c):
    return _softplus(c, c.input(0), True)


@converter("Mish")
def _mish(c):
    """Mish = x tanh(softplus(x))."""
    x = c.input(0)
    return c.add("mul", [x, c.add("tanh", [_softplus(c, x, False)], suffix="tanh")])


@converter("Expand")
def _expand(c):
    """Expand: numpy broadcasting of x against the constant shape, as x + zeros(shape) (exact)."""
    x = c.input(0)
    shape = [int(d) for d in np.ravel(c.value(1, "shape"))]
    try:
        out = np.broadcast_shapes(x.shape, tuple(shape))
    except ValueError:
        c.fail(f"shape {shape} does not broadcast with the input {list(x.shape)}")
    if tuple(out) == tuple(x.shape):
        return x
    _check_size(c, out, x.dtype)
    return c.add("add", [x, c.const(np.zeros(shape, x.dtype), "zeros")])


@converter("Tile")
def _tile(c):
    """Tile: per axis, a concat of `repeats` copies."""
    x = c.input(0)
    reps = [int(r) for r in np.ravel(c.value(1, "repeats"))]
    if len(reps) != x.type.rank or min(reps, default=1) < 0:
        c.fail(f"repeats {reps} must be {x.type.rank} non-negative counts")
    if 0 in reps:
        c.fail(f"repeats {reps} would make an empty tensor")
    y = x
    todo = [a for a, r in enumerate(reps) if r > 1]
    for a in todo:
        y = c.add("concat", [y] * reps[a], {"axis": a}, suffix="" if a == todo[-1] else f"axis{a}")
    return y


@converter("DepthToSpace", "SpaceToDepth")
def _depth_space(c):
    """Pixel shuffle both ways as reshape - transpose - reshape (DCR and CRD modes)."""
    x = c.input(0)
    if x.type.rank != 4:
        c.fail(f"expects an NCHW input, got {x.type}")
    b = int(c.attr("blocksize", 0))
    n, ch, h, w = x.shape
    if b < 1:
        c.fail(f"blocksize must be positive, got {b}")
    if c.onnx_node.op_type == "DepthToSpace":
        if ch % (b * b):
            c.fail(f"{ch} channels are not a multiple of blocksize^2 = {b * b}")
        if c.attr("mode", "DCR") == "DCR":
            inner, perm = (n, b, b, ch // (b * b), h, w), (0, 3, 4, 1, 5, 2)
        else:
            inner, perm = (n, ch // (b * b), b, b, h, w), (0, 1, 4, 2, 5, 3)
        out = (n, ch // (b * b), h * b, w * b)
    else:
        if h % b or w % b:
            c.fail(f"spatial size {h}x{w} is not a multiple of blocksize {b}")
        inner, out = (n, ch, h // b, b, w // b, b), (n, ch * b * b, h // b, w // b)
        mode = c.attr("mode", "DCR")     # the attribute came with opset 24; before, DCR only
        if mode not in ("DCR", "CRD"):
            c.fail(f"mode {mode!r} must be 'DCR' or 'CRD'")
        perm = (0, 3, 5, 1, 2, 4) if mode == "DCR" else (0, 1, 3, 5, 2, 4)
    y = c.add("reshape", [x], {"shape": inner}, suffix="split")
    y = c.add("transpose", [y], {"perm": perm}, suffix="shuffle")
    return c.add("reshape", [y], {"shape": out})


@converter("Resize")
def _resize(c):
    """Resize, one resized axis after another: nearest as a gather of input rows (exact, int8 too),
    linear and cubic as a product with the axis's constant interpolation matrix. The index maps and
    matrices are onnx's reference Resize applied to an index ramp or an identity along that axis
    (Resize is linear in its input), so every coordinate transformation and rounding mode is the
    spec's own."""
    onnx = _onnx()
    from onnx.reference import ReferenceEvaluator  # noqa: PLC0415 - onnx loads only when a model is read
    x = c.input(0)
    rank = x.type.rank
    mode = c.attr("mode", "nearest")
    if mode not in ("nearest", "linear", "cubic"):
        c.fail(f"mode {mode!r} is not supported (nearest, linear, cubic)")
    ctm = c.attr("coordinate_transformation_mode", "half_pixel")
    if ctm == "tf_crop_and_resize":
        c.fail("coordinate_transformation_mode 'tf_crop_and_resize' is not supported")
    if c.attr("keep_aspect_ratio_policy", "stretch") != "stretch":
        c.fail(f"keep_aspect_ratio_policy {c.attr('keep_aspect_ratio_policy')!r} is not supported (stretch)")
    axes = c.attr("axes")
    axes = list(range(rank)) if axes is None else [int(a) % rank for a in axes]
    scales, sizes = c.value(2, "scales"), c.value(3, "sizes")
    if scales is not None and np.size(scales) == 0:
        scales = None
    if (scales is None) == (sizes is None or np.size(sizes) == 0):
        c.fail("give exactly one of scales and sizes")
    per_axis = np.ravel(scales if scales is not None else sizes)
    if len(per_axis) != len(axes):
        c.fail(f"{'scales' if scales is not None else 'sizes'} has {len(per_axis)} values for {len(axes)} axes")
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in c.onnx_node.attribute if a.name != "axes"}
    out_shape = list(x.shape)
    for ax, v in zip(axes, per_axis):
        out_shape[ax] = int(np.floor(x.shape[ax] * float(v))) if scales is not None else int(v)
        if out_shape[ax] < 1:
            c.fail(f"axis {ax}: {x.shape[ax]} -> {out_shape[ax]} elements")
    _check_size(c, out_shape, x.dtype)   # before any map is evaluated (a 1e6 scale took 35 s to refuse)
    y = x
    for ax, v in zip(axes, per_axis):
        n_in, n_out = x.shape[ax], out_shape[ax]
        if n_out == n_in and (scales is None or float(v) == 1.0):
            continue
        _check_size(c, (n_in, n_out), np.float64)   # the axis's map
        # the axis's map on a 2-D stand-in (n_in, n_in): rows an identity, the axis resized as axis 1
        node = onnx.helper.make_node("Resize", ["x", "", "scales" if scales is not None else "", "sizes" if sizes is not None
                                                else ""], ["y"], **attrs)
        feeds = {"x": np.eye(n_in, dtype=np.float32)}
        if scales is not None:
            feeds["scales"] = np.array([1.0, float(v)], np.float32)
        else:
            feeds["sizes"] = np.array([n_in, n_out], np.int64)
        try:
            m = ReferenceEvaluator(node).run(None, feeds)[0].astype(np.float64)   # (n_in, n_out): column j's weights
        except Exception as e:
            c.fail(f"axis {ax}: cannot evaluate the resize map: {type(e).__name__}: {e}")
        onehot = mode == "nearest" or (np.isin(m, (0.0, 1.0)).all() and (m.sum(0) == 1).all())
        if onehot:
            y = c.add("take", [y], {"indices": m.argmax(0).astype(np.int64), "axis": ax}, suffix=f"axis{ax}")
            continue
        # y = y x_ax m: move the axis last, multiply by the (n_in, n_out) matrix, move it back
        perm = tuple(i for i in range(rank) if i != ax) + (ax,)
        back = tuple(int(i) for i in np.argsort(perm))
        t = c.add("transpose", [y], {"perm": perm}, suffix=f"axis{ax}_in") if ax != rank - 1 else y
        t = c.add("matmul", [t, c.const(m.astype(x.dtype), f"axis{ax}_weights")], suffix=f"axis{ax}")
        y = c.add("transpose", [t], {"perm": back}, suffix=f"axis{ax}_out") if ax != rank - 1 else t
    return y


# ---- entry ------------------------------------------------------------------------------------
def _input_shape(vi, shapes: dict) -> tuple[tuple[int, ...], str]:
    onnx = _onnx()
    kind = vi.type.WhichOneof("value")
    if kind != "tensor_type":
        raise ConversionError(f"input '{vi.name}' is of {kind or 'no'} type; only tensor inputs are supported")
    tt = vi.type.tensor_type
    if tt.elem_type not in onnx.helper.get_all_tensor_dtypes():
        raise ConversionError(f"input '{vi.name}' has element type {tt.elem_type}, not an ONNX tensor type")
    dtype = str(onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type))
    if vi.name in shapes:
        return tuple(int(d) for d in shapes[vi.name]), dtype
    dims = []
    for d in tt.shape.dim:
        if d.HasField("dim_value") and d.dim_value > 0:
            dims.append(d.dim_value)
        else:
            sym = d.dim_param or "?"
            raise ConversionError(f"input '{vi.name}' has a symbolic dimension {sym!r}; give static shapes "
                                  f"with shapes={{'{vi.name}': (...)}}")
    return tuple(dims), dtype


def from_onnx(model, shapes: dict | None = None, name: str | None = None, runtime_inputs=(),
              base_dir=None) -> Graph:
    """Import an ONNX model (path, bytes or ModelProto) as a typed graph IR.

    An initializer that a graph input also names is, by the ONNX IR (ir_version >= 4), a default
    the caller may override. The compiler bakes such inputs in as the constants they hold (what
    onnxruntime computes when they are not fed; exporters list every weight so, and weights must
    be constant to quantize and place them); name them in runtime_inputs to keep them as run-time
    inputs instead. base_dir: where external data lives for a model given as bytes or a proto."""
    model = load_model(model, base_dir=base_dir)
    onnx = _onnx()
    g = model.graph

    ctx = _Ctx(default_opset(model))
    ctx.declared = {vi.name: vi.type.tensor_type.elem_type for vi in list(g.value_info) + list(g.output)
                    if vi.type.HasField("tensor_type") and vi.type.tensor_type.elem_type}
    shapes = dict(shapes or {})
    inits = {t.name for t in g.initializer}
    input_names = [vi.name for vi in g.input]
    runtime = set(runtime_inputs or ())
    bad = sorted(runtime - set(input_names))
    if bad:
        raise ConversionError(f"runtime_inputs {', '.join(map(repr, bad))}: not graph inputs of the model "
                              f"(inputs are {', '.join(input_names)})")
    defaults = [n for n in input_names if n in inits and n not in runtime]
    if defaults and model.ir_version >= 4:
        log.info("%d graph input(s) with an initializer compiled as constants (their defaults): %s%s",
                 len(defaults), ", ".join(defaults[:5]), " ..." if len(defaults) > 5 else "")
    inits -= runtime
    inputs = []
    for vi in g.input:
        if vi.name in inits:
            continue
        shape, dtype = _input_shape(vi, shapes)
        try:
            node = Node.input(vi.name, shape, dtype)
        except GraphError as e:
            raise ConversionError(f"input '{vi.name}': {e}") from None
        inputs.append(node)
        ctx.nodes.append(node)
        ctx.env[vi.name] = node
    for t in g.initializer:
        if t.name in runtime:   # fed at run time: the initializer's default is not used
            continue
        try:
            arr = onnx.numpy_helper.to_array(t)
        except Exception as e:
            raise ModelLoadError(f"initializer '{t.name}' cannot be read: {e}") from None
        node = Node.const(arr, name=t.name)
        ctx.nodes.append(node)
        ctx.env[t.name] = node
    for k, n in enumerate(g.node):
        ctx.onnx_node, ctx.node_name = n, n.name or f"{n.op_type}_{k}"
        for i in n.input:
            if i and i not in ctx.env:
                raise ConversionError(f"{n.op_type} '{ctx.node_name}': input '{i}' is not defined by an earlier "
                                      f"node, an initializer or a graph input")
        try:
            result = CONVERTERS[n.op_type](ctx)
        except (GraphError, ConversionError):
            raise
        except Exception as e:
            raise ConversionError(f"{n.op_type} '{ctx.node_name}': cannot import: {type(e).__name__}: {e}") from e
        outs = result if isinstance(result, list) else [result]
        real_outputs = [o for o in n.output if o]
        if len(outs) < len(real_outputs) and not isinstance(result, list):
            real_outputs = real_outputs[:1]
        for oname, node in zip(real_outputs, outs):
            ctx.env[oname] = node
    outputs, names = [], []
    from .qoperator import integer_output  # noqa: PLC0415 - import cycle: qoperator imports this module
    for vi in g.output:
        if vi.name not in ctx.env:
            raise ConversionError(f"graph output '{vi.name}' is not produced by any node")
        outputs.append(integer_output(ctx, vi))
        names.append(vi.name)
    return Graph(ctx.nodes, inputs, outputs, names, name or g.name or "model",
                 meta={"onnx_opset": ctx.opset})
