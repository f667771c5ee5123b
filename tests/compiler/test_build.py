"""Target registry and build() argument handling."""
import llvmlite.binding as llvm
import pytest

from compiler import TARGETS, build, parse_target, te
from compiler.errors import TargetError


def test_host_target_uses_host_cpu():
    t = parse_target("llvm")
    assert t.is_host and t.cpu == llvm.get_host_cpu_name() and t.opt_level == 3


@pytest.mark.parametrize("text,triple,cpu", [
    ("llvm -mtriple=armv7a-linux-gnueabihf -mcpu=cortex-a9", "armv7a-linux-gnueabihf", "cortex-a9"),
    ("aarch64-linux-gnu cortex-a53", "aarch64-linux-gnu", "cortex-a53"),
    ("pynq", "armv7a-linux-gnueabihf", "cortex-a9"),
    ("ultra96", "aarch64-linux-gnu", "cortex-a53"),
])
def test_parse_board_targets(text, triple, cpu):
    t = parse_target(text)
    assert (t.triple, t.cpu) == (triple, cpu) and not t.is_host


def test_target_options():
    t = parse_target("llvm -O1 -fast-math")
    assert t.opt_level == 1 and t.fast_math


def test_unknown_target_lists_registry():
    with pytest.raises(TargetError, match="unknown target 'cuda'; registered: llvm, pynq"):
        parse_target("cuda")
    with pytest.raises(TargetError, match="unknown option '-foo'"):
        parse_target("llvm -foo")
    assert "llvm" in TARGETS


def test_build_needs_args_with_schedule():
    A = te.placeholder((4,), name="A")
    B = te.compute((4,), lambda i: A[i] + 1.0, name="B")
    with pytest.raises(TargetError, match="give the argument tensors"):
        build(te.create_schedule(B))
