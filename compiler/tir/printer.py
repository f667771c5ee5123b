"""Readable text of expressions, statements and PrimFuncs (Python-like, one loop per line).

    def f(A: float32[64, 64], C: float32[64]):
      for i in parallel(64):
        C[i] = 0f
        for k in range(64):
          C[i] = C[i] + A[i*64 + k]

Variables and buffers that share a name get a numeric suffix so the text is unambiguous.
"""
from __future__ import annotations

from . import expr as E
from . import stmt as S

_PREC = {
    "Or": 1, "And": 2, "Not": 3, "EQ": 4, "NE": 4, "LT": 4, "LE": 4, "GT": 4, "GE": 4,
    "BitOr": 5, "BitXor": 6, "BitAnd": 7, "Shl": 8, "Shr": 8, "Add": 9, "Sub": 9,
    "Mul": 10, "Div": 10, "FloorDiv": 10, "FloorMod": 10,
}


class Printer:
    def __init__(self):
        self.names: dict = {}
        self.used: dict = {}

    def name(self, obj, base: str) -> str:
        if obj in self.names:
            return self.names[obj]
        n = self.used.get(base, 0)
        self.used[base] = n + 1
        nm = base if n == 0 else f"{base}_{n}"
        self.names[obj] = nm
        return nm

    # ------------------------------------------------------------ expressions
    def expr(self, e, prec: int = 0) -> str:
        t = type(e).__name__
        if isinstance(e, E.IntImm):
            if e.dtype == "int32":
                return str(e.value)
            if e.dtype == "bool":
                return "True" if e.value else "False"
            return f"{e.dtype}({e.value})"
        if isinstance(e, E.FloatImm):
            return f"{e.value!r}f" if e.dtype == "float32" else f"{e.dtype}({e.value!r})"
        if isinstance(e, E.StringImm):
            return repr(e.value)
        if isinstance(e, E.Var):
            return self.name(e, e.name)
        if isinstance(e, (E.Min, E.Max)):
            return f"{e.symbol}({self.expr(e.a)}, {self.expr(e.b)})"
        if isinstance(e, E.BinaryOp):
            p = _PREC[t]
            s = f"{self.expr(e.a, p)} {e.symbol} {self.expr(e.b, p + 1)}"
            return f"({s})" if p < prec else s
        if isinstance(e, E.Not):
            s = f"not {self.expr(e.a, 3)}"
            return f"({s})" if 3 < prec else s
        if isinstance(e, E.Select):
            return f"select({self.expr(e.cond)}, {self.expr(e.true_value)}, {self.expr(e.false_value)})"
        if isinstance(e, E.Cast):
            return f"{e.dtype}({self.expr(e.value)})"
        if isinstance(e, E.Call):
            if e.op == "call_extern":
                return f"@{e.args[0].value}({', '.join(self.expr(a) for a in e.args[1:])})"
            return f"{e.op}({', '.join(self.expr(a) for a in e.args)})"
        if isinstance(e, E.Reduce):
            ax = ", ".join(self.expr(a.var) for a in e.axis)
            cond = "" if E.is_const(e.condition, 1) else f", where={self.expr(e.condition)}"
            return f"{e.combiner}({self.expr(e.source)}, axis=[{ax}]{cond})"
        if isinstance(e, E.ProducerLoad):
            return f"{self.name(e.producer, e.producer.name)}[{', '.join(self.expr(i) for i in e.indices)}]"
        if isinstance(e, E.BufferLoad):
            return f"{self.buf(e.buffer)}[{', '.join(self.expr(i) for i in e.indices)}]"
        if isinstance(e, E.Ramp):
            return f"ramp({self.expr(e.base)}, {self.expr(e.stride)}, {e.lanes})"
        if isinstance(e, E.Broadcast):
            return f"broadcast({self.expr(e.value)}, {e.lanes})"
        return f"<{t}>"

    def buf(self, b) -> str:
        return self.name(b, b.name)

    # ------------------------------------------------------------ statements
    def stmt(self, s, ind: int, out: list) -> None:
        pad = "  " * ind
        if isinstance(s, S.SeqStmt):
            for x in s.seq:
                self.stmt(x, ind, out)
        elif isinstance(s, S.For):
            v = self.expr(s.loop_var)
            rng = self.expr(s.extent) if E.is_const(s.min, 0) else f"{self.expr(s.min)}, {self.expr(s.min + s.extent)}"
            kind = "range" if s.kind == S.ForKind.SERIAL else s.kind.value
            tag = f", {s.thread_tag!r}" if s.thread_tag else ""
            ann = f"  # {s.annotations}" if s.annotations else ""
            out.append(f"{pad}for {v} in {kind}({rng}{tag}):{ann}")
            self.stmt(s.body, ind + 1, out)
        elif isinstance(s, S.Allocate):
            b = s.buffer
            shape = ", ".join(self.expr(x) for x in b.shape)
            out.append(f"{pad}{self.buf(b)} = allocate({b.dtype}[{shape}], scope={b.scope!r})")
            self.stmt(s.body, ind, out)
        elif isinstance(s, S.BufferStore):
            idx = ", ".join(self.expr(i) for i in s.indices)
            out.append(f"{pad}{self.buf(s.buffer)}[{idx}] = {self.expr(s.value)}")
        elif isinstance(s, S.Evaluate):
            out.append(f"{pad}{self.expr(s.value)}")
        elif isinstance(s, S.IfThenElse):
            out.append(f"{pad}if {self.expr(s.condition)}:")
            self.stmt(s.then_case, ind + 1, out)
            if s.else_case is not None:
                out.append(f"{pad}else:")
                self.stmt(s.else_case, ind + 1, out)
        elif isinstance(s, S.AttrStmt):
            node = s.node
            nd = self.expr(node) if isinstance(node, E.PrimExpr) else (
                self.buf(node) if isinstance(node, S.Buffer) else getattr(node, "name", repr(node)))
            out.append(f"{pad}with attr({nd}, {s.key!r}, {self.expr(s.value)}):")
            self.stmt(s.body, ind + 1, out)
        elif isinstance(s, S.LetStmt):
            out.append(f"{pad}{self.expr(s.var)} = {self.expr(s.value)}")
            self.stmt(s.body, ind, out)
        else:
            out.append(f"{pad}<{type(s).__name__}>")

    def func(self, f: S.PrimFunc) -> str:
        params = ", ".join(
            f"{self.buf(b)}: {b.dtype}[{', '.join(self.expr(x) for x in b.shape)}]" for b in f.params)
        out = [f"def {f.name}({params}):"]
        self.stmt(f.body, 1, out)
        return "\n".join(out)


def expr_str(e) -> str:
    return Printer().expr(e)


def stmt_str(s) -> str:
    out: list = []
    Printer().stmt(s, 0, out)
    return "\n".join(out)


def func_str(f) -> str:
    return Printer().func(f)
