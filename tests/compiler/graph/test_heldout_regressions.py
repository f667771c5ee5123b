"""Regressions found by the held-out network campaign (bench/heldout_nets.py): random nets on odd
configs that broke the compiler in ways the suite's examples did not reach."""
import numpy as np

import compiler
from accel.isa import AccelConfig
from compiler.frontend import zoo
from host_runtime.executor import Executor

#: block_in != block_out: a tensor read by a conv (packed BLOCK_IN) and by an ALU op (BLOCK_OUT)
ODD = AccelConfig(batch=1, block_in=8, block_out=16, acc_buff_bytes=64 * 1024, out_buff_bytes=16 * 1024,
                  inp_buff_bytes=8 * 1024, wgt_buff_bytes=32 * 1024)


def test_a_tensor_packed_in_two_blockings_gets_two_names():
    """dw0 feeds conv1 (packed 1x8) and the residual add (packed 1x16): two pack nodes, which must
    not share a name (kept values, memory plans and profiles are keyed by node name)."""
    b = zoo.ModelBuilder("two_blockings", seed=4)
    x = b.input("x", (1, 8, 6, 13))
    d = b.conv(x, 8, 8, k=3, pad=2, group=8, name="dw0")
    c = b.conv(d, 8, 8, k=1, name="conv1")
    a = b.op("Relu", [b.op("Add", [c, d], name="add")], name="add_relu")
    y = b.op("Flatten", [b.op("GlobalAveragePool", [a], name="gap")], name="flat")
    m = b.build([b.op("Gemm", [y, b.weight((5, 8)), b.init(np.zeros(5, np.float32))], name="fc", transB=1)])
    feeds = zoo.sample_inputs(m, 2, seed=3)
    mod = compiler.build_model(m, target="accel", config=ODD, calibration=feeds)
    packs = [n for n in mod.graph.nodes if n.op == "pack" and n.inputs[0].name == "dw0"]
    assert {tuple(n.attrs["block"]) for n in packs} == {(1, 8), (1, 16)}
    names = [n.name for n in mod.graph.nodes]
    assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)
    with Executor(mod, driver="fsim") as ex:
        ex.run(feeds[1], keep=True)
    for n in packs:
        assert ex.values[n.name].shape == n.shape, n.name
