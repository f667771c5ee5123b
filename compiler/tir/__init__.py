"""The loop IR: expressions, statements, buffers, PrimFunc, analysis and passes."""
from . import dtype
from .expr import (PrimExpr, IntImm, FloatImm, StringImm, Var, Add, Sub, Mul, Div, FloorDiv, FloorMod,
                   Min, Max, EQ, NE, LT, LE, GT, GE, And, Or, Not, Select, Cast, Call, Reduce,
                   ProducerLoad, BufferLoad, Ramp, Broadcast, Range, const, convert, cast, select,
                   call_extern, call_intrin)
from .stmt import (Buffer, Stmt, For, ForKind, Allocate, BufferStore, Evaluate, SeqStmt, IfThenElse,
                   AttrStmt, LetStmt, PrimFunc, seq)
from .functor import (Mutator, Visitor, post_order_visit, substitute, structural_equal,
                      assert_structural_equal, collect)
from .arith import Analyzer, simplify
from .printer import expr_str, stmt_str, func_str
