"""fsim, tsim and rtl on the same programs (tiny config): identical DRAM bytes, and tsim's counters equal
to the RTL's (cycles, per-stage busy/stall, micro-ops, DRAM bytes) on random programs and on conv2d /
dense layers compiled by compiler.accel.conv2d. Cycle counts are deterministic, so this is a test."""
import dataclasses
import sys
from contextlib import closing
from pathlib import Path

import numpy as np
import pytest

import compiler
from accel.hw.params import ErrorCode
from accel.hw.verilog import generate
from accel.isa import (
    PRESETS,
    Alu,
    AluOp,
    Finish,
    Gemm,
    Load,
    MemType,
    Store,
    Uop,
    encode_insn,
    encode_program,
    encode_uops,
)
from compiler.accel.conv2d import (
    FILL_BANDS,
    Conv2dSpec,
    ConvTiling,
    Requant,
    conv2d_candidates,
    conv2d_reference,
    run_conv2d,
    run_dense,
)
from compiler.accel.eltwise import add_reference
from compiler.frontend import zoo
from host_runtime import Device, get_driver
from host_runtime.executor import Executor
from sim.errors import ProgramFault, SimError
from sim.verilator.build import _BIT, _CONCAT, BuildError, collapse_repeats, sim_wrapper, tools_available

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from randprog import random_program  # noqa: E402

TINY = PRESETS["tiny"]
pytestmark = [pytest.mark.rtl,
              pytest.mark.skipif(tools_available() is not None, reason=f"rtl driver: {tools_available()}")]
DRAMS = {"default": None, "fast": {"read_latency": 1, "write_latency": 1},
         "narrow": {"read_latency": 12, "write_latency": 5, "bytes_per_cycle": 3}}


def _counters(stats: dict) -> dict:
    keep = ("cycles", "stages", "gemm_uops", "alu_uops", "macs", "dram_bytes")
    return {k: stats[k] for k in keep}


@pytest.fixture(scope="module")
def drivers():
    """One driver per executor and DRAM model for the module (an rtl driver reuses its loaded model)."""
    made = {}

    def get(name, dram=None):
        key = (name, str(dram))
        if key not in made:
            made[key] = get_driver(name, TINY, **({} if name == "fsim" else {"dram": dram}))
        return made[key]
    yield get
    for d in made.values():
        d.close()


@pytest.mark.parametrize("dram", DRAMS)
@pytest.mark.parametrize("seed", range(12))
def test_random_programs_fsim_tsim_rtl(drivers, dram, seed):
    prog, regions = random_program(TINY, seed)
    images = {}
    stats = {}
    for name in ("fsim", "tsim", "rtl"):
        images[name] = prog.dram_image()
        res = drivers(name, DRAMS[dram]).run(images[name], prog.insn_addr, len(prog.insns))
        stats[name] = res.stats
    for name in ("tsim", "rtl"):
        bad = np.flatnonzero(images[name] != images["fsim"])
        assert bad.size == 0, f"{name}: DRAM differs from fsim at {bad.size} bytes, first {bad[:1]}"
    assert _counters(stats["tsim"]) == _counters(stats["rtl"])


# Two-entry command queues with buses from 64 to 512 bits: at 128 bits and more one instruction
# arrives per cycle, which a two-entry instruction buffer dropped (fetch ignored its w_rdy).
NARROW_QUEUES = {bus: dataclasses.replace(TINY, cmd_queue_depth=2, dep_queue_depth=2, bus_width=bus)
                 for bus in (64, 128, 256, 512)}


@pytest.mark.parametrize("bus", [pytest.param(b, marks=() if b == 128 else pytest.mark.slow) for b in NARROW_QUEUES])
def test_random_programs_with_two_entry_queues_fsim_tsim_rtl(bus):
    cfg = NARROW_QUEUES[bus]
    with closing(get_driver("fsim", cfg)) as fs, closing(get_driver("tsim", cfg)) as ts, \
            closing(get_driver("rtl", cfg)) as rtl:
        for seed in range(8):
            prog, _ = random_program(cfg, 700 + seed)
            images, stats = {}, {}
            for name, drv in (("fsim", fs), ("tsim", ts), ("rtl", rtl)):
                images[name] = prog.dram_image()
                stats[name] = drv.run(images[name], prog.insn_addr, len(prog.insns)).stats
            for name in ("tsim", "rtl"):
                bad = np.flatnonzero(images[name] != images["fsim"])
                assert bad.size == 0, f"seed {700 + seed}, {name}: DRAM differs from fsim at {bad.size} bytes"
            assert _counters(stats["tsim"]) == _counters(stats["rtl"]), f"seed {700 + seed}"


@pytest.mark.parametrize("cfg", [TINY, NARROW_QUEUES[128]], ids=["tiny", "queues2_bus128"])
def test_instructions_after_finish_never_run(cfg):
    """Fetch stops at FINISH: a STORE, a LOAD and a GEMM placed after it in memory (inside
    INSN_COUNT) leave no trace, done comes when everything before FINISH is done, and the three
    executors agree on DRAM and counters (they ran, overwriting DRAM, after done had risen)."""
    out = 0x8000
    prog = [Load(mem_type=MemType.INP, dram_base=0x100, y_size=1, x_size=2, x_stride=2, push_next=True),
            Gemm(pop_prev=True, uop_bgn=0, uop_end=0, push_next=True),
            Store(pop_prev=True, push_prev=True, sram_base=0, dram_base=out // 4, y_size=1, x_size=1, x_stride=1),
            Finish(pop_next=True),
            Store(sram_base=0, dram_base=out // 4 + 16, y_size=4, x_size=8, x_stride=8),
            Load(mem_type=MemType.WGT, dram_base=0x100, y_size=8, x_size=8, x_stride=8),
            Gemm(reset=True, uop_bgn=0, uop_end=1, iter_out=40)] + \
        [Store(sram_base=0, dram_base=out // 4 + 64 + 8 * k, y_size=1, x_size=8, x_stride=8) for k in range(12)]
    code = encode_program(prog, cfg).reshape(-1)
    images, stats = {}, {}
    for name in ("fsim", "tsim", "rtl"):
        image = np.full(1 << 16, 0x5A, np.uint8)
        image[0x1000:0x1000 + code.size] = code
        with closing(get_driver(name, cfg)) as drv:
            stats[name] = drv.run(image, 0x1000, len(prog)).stats
        images[name] = image
        assert (image[out + 4 * 16:out + 4 * 200] == 0x5A).all(), f"{name}: an instruction after FINISH wrote DRAM"
    assert np.array_equal(images["fsim"], images["tsim"]) and np.array_equal(images["fsim"], images["rtl"])
    assert _counters(stats["tsim"]) == _counters(stats["rtl"])
    assert stats["rtl"]["gemm_uops"] == 0


def _with_word(code: np.ndarray, index: int, word: int) -> np.ndarray:
    code = code.copy().reshape(-1, 16)
    code[index] = np.frombuffer(word.to_bytes(16, "little"), np.uint8)
    return code.reshape(-1)


def _fault_programs(cfg):
    """(name, program bytes, instruction count, expected (code, index)) of programs that fault."""
    uops = encode_uops([Uop(acc=250, src=0, wgt=0)], cfg)
    ok = [Load(mem_type=MemType.INP, dram_base=0x100, y_size=1, x_size=2, x_stride=2, push_next=True),
          Gemm(pop_prev=True, reset=True, uop_bgn=0, uop_end=0)]
    fin = Finish()
    E = ErrorCode
    progs = {
        "unknown opcode": (ok + [Gemm(), fin, fin], 2, 7, (E.ILLEGAL_INSN, 2)),
        "bits above the format": (ok + [fin, fin], 2, encode_insn(Finish(), cfg) | 1 << 100, (E.ILLEGAL_INSN, 2)),
        "undefined alu_op": (ok + [Alu(alu_op=AluOp.ADD), fin], 2, None, (E.ILLEGAL_INSN, 2)),
        "load of OUT": (ok + [Load(mem_type=MemType.OUT), fin], None, None, (E.BAD_FIELD, 2)),
        "store padding": (ok + [Store(y_size=1, x_size=1, x_pad1=1), fin], None, None, (E.BAD_FIELD, 2)),
        "pop_prev on a load": (ok + [Load(mem_type=MemType.WGT, pop_prev=True), fin], None, None, (E.BAD_FIELD, 2)),
        "load beyond INP": (ok + [Load(mem_type=MemType.INP, sram_base=250, y_size=1, x_size=10, x_stride=10), fin],
                            None, None, (E.SRAM_RANGE, 2)),
        "store beyond OUT": (ok + [Store(sram_base=200, y_size=2, x_size=30, x_stride=30), fin], None, None,
                             (E.SRAM_RANGE, 2)),
        "micro-ops beyond the buffer": (ok + [Gemm(uop_bgn=3, uop_end=300), fin], None, None, (E.SRAM_RANGE, 2)),
        "no FINISH": (ok + [Gemm()], None, None, (E.NO_FINISH, 3)),
        # compute's index fault at 3 precedes fetch's static fault at 4 (which must not win)
        "dst index": (ok + [Load(mem_type=MemType.UOP, dram_base=0x40, y_size=1, x_size=1, x_stride=1),
                            Gemm(uop_bgn=0, uop_end=1, iter_out=8, dst_factor_out=1, reset=True),
                            Load(mem_type=MemType.OUT), fin], None, None, (E.INDEX_RANGE, 3)),
    }
    for name, (insns, at, word, want) in progs.items():
        code = encode_program(insns, cfg).reshape(-1)
        if name == "undefined alu_op":   # alu_op sits after the loop fields: find it by encoding ADD and MIN
            w = encode_insn(insns[at], cfg)
            shift = (w ^ encode_insn(Alu(alu_op=AluOp.MUL), cfg)).bit_length() - 3
            word = w | 0xF << shift
        if word is not None:
            code = _with_word(code, at, word)
        yield name, code, len(insns), want, uops


@pytest.mark.parametrize("cfg", [TINY], ids=["tiny"])
def test_faulting_programs_report_the_same_code_and_instruction(cfg):
    """fsim, tsim and the RTL (STATUS.error, ERROR, ERROR_INSN) fault on the same instruction with
    the same code; each error names the instruction; the RTL runs a good program after them."""
    drivers = {name: get_driver(name, cfg) for name in ("fsim", "tsim", "rtl")}
    try:
        for name, code, n, want, uops in _fault_programs(cfg):
            for drv_name, drv in drivers.items():
                image = np.zeros(1 << 16, np.uint8)
                image[0x1000:0x1000 + code.size] = code
                image[0x40 * cfg.uop_elem_bytes:0x40 * cfg.uop_elem_bytes + uops.size] = uops
                with pytest.raises(ProgramFault) as e:
                    drv.run(image, 0x1000, n)
                assert (e.value.code, e.value.index) == want, f"{name} on {drv_name}: {e.value}"
                assert f"instruction {want[1]}" in str(e.value) or want[0] == ErrorCode.NO_FINISH, str(e.value)
        prog, _ = random_program(cfg, 5)
        images = {}
        for drv_name in ("fsim", "rtl"):
            images[drv_name] = prog.dram_image()
            drivers[drv_name].run(images[drv_name], prog.insn_addr, len(prog.insns))
        assert np.array_equal(images["fsim"], images["rtl"])
    finally:
        for d in drivers.values():
            d.close()


LAYERS = {"conv3x3": Conv2dSpec(1, 8, 8, 8, 8, 3, 3, (1, 1, 1, 1)),
          "conv3x3_s2": Conv2dSpec(1, 16, 10, 10, 16, 3, 3, (1, 1, 1, 1), (2, 2)),
          "conv1x1": Conv2dSpec(1, 16, 8, 8, 32, 1, 1),
          # pads past a LOAD's padding fields: zero runs written by LOADs of padding only
          "conv3x3_dilated": Conv2dSpec(1, 8, 6, 6, 8, 3, 3, (2, 17, 3, 16), (1, 1), "dilated", (2, 3))}


@pytest.mark.parametrize("vt", [1, 2])
@pytest.mark.parametrize("layer", LAYERS)
def test_conv_layers_fsim_tsim_rtl(layer, vt):
    spec = LAYERS[layer]
    rng = np.random.default_rng(1)
    x = rng.integers(-128, 128, (spec.n, spec.c, spec.h, spec.w), dtype=np.int8)
    w = rng.integers(-128, 128, (spec.o, spec.c, spec.kh, spec.kw), dtype=np.int8)
    b = rng.integers(-(1 << 14), 1 << 14, spec.o).astype(np.int32)
    ref = conv2d_reference(x, w, b, spec, Requant(8))
    dram, stats = {}, {}
    for name in ("fsim", "tsim", "rtl"):
        with Device(TINY, driver=name, dram_bytes=4 << 20) as dev:
            y, res, _ = run_conv2d(dev, x, w, b, spec, Requant(8), vt)
            dram[name], stats[name] = dev.memory.array.copy(), res.stats
        assert np.array_equal(y, ref), name
    assert np.array_equal(dram["tsim"], dram["fsim"]) and np.array_equal(dram["rtl"], dram["fsim"])
    assert _counters(stats["tsim"]) == _counters(stats["rtl"])


@pytest.mark.parametrize("vt", [1, 2])
def test_dilated_conv_gathered_tiles_fsim_tsim_rtl(vt):
    """A dilated conv whose input tiles hold a band per tap (ConvTiling.gather): the same DRAM and
    counters, cycles included, on the timing model and the RTL."""
    spec = LAYERS["conv3x3_dilated"]
    tiling = next(t for _, t in conv2d_candidates(spec, TINY, vt) if t.gather)
    rng = np.random.default_rng(4)
    x = rng.integers(-128, 128, (spec.n, spec.c, spec.h, spec.w), dtype=np.int8)
    w = rng.integers(-128, 128, (spec.o, spec.c, spec.kh, spec.kw), dtype=np.int8)
    ref = conv2d_reference(x, w, None, spec, Requant(8))
    dram, stats = {}, {}
    for name in ("fsim", "tsim", "rtl"):
        with Device(TINY, driver=name, dram_bytes=4 << 20) as dev:
            y, res, _ = run_conv2d(dev, x, w, None, spec, Requant(8), vt, tiling)
            dram[name], stats[name] = dev.memory.array.copy(), res.stats
        assert np.array_equal(y, ref), name
    assert np.array_equal(dram["tsim"], dram["fsim"]) and np.array_equal(dram["rtl"], dram["fsim"])
    assert _counters(stats["tsim"]) == _counters(stats["rtl"])


@pytest.mark.parametrize("vt", [1, 2])
def test_conv1x1_fused_residual_fsim_tsim_rtl(vt):
    """A 1x1 conv with a fused residual add, as MobileNetV2's project layers: the last GEMM
    requantizes into the accumulator (EPILOGUE to_acc) and the identity GEMM flushes and seeds."""
    spec = Conv2dSpec(1, 24, 6, 6, 16, 1, 1)
    rng = np.random.default_rng(3)
    x = rng.integers(-128, 128, (1, 24, 6, 6), dtype=np.int8)
    w = rng.integers(-128, 128, (16, 24, 1, 1), dtype=np.int8)
    b = rng.integers(-(1 << 14), 1 << 14, 16).astype(np.int32)
    r = rng.integers(-127, 128, (1, 16, 6, 6), dtype=np.int8)
    rq1, rq2 = Requant(9, -127, 127), Requant(1, -127, 127, True)
    ref = add_reference(conv2d_reference(x, w, b, spec, rq1), r, 0, 1, rq2)
    dram, stats = {}, {}
    for name in ("fsim", "tsim", "rtl"):
        with Device(TINY, driver=name, dram_bytes=4 << 20) as dev:
            y, res, stream = run_conv2d(dev, x, w, b, spec, rq1, vt, residual=(r, 0, 1, rq2))
            dram[name], stats[name] = dev.memory.array.copy(), res.stats
        assert np.array_equal(y, ref), name
    assert any(getattr(i, "to_acc", False) for i in stream.last_insns)
    assert np.array_equal(dram["tsim"], dram["fsim"]) and np.array_equal(dram["rtl"], dram["fsim"])
    assert _counters(stats["tsim"]) == _counters(stats["rtl"])


@pytest.mark.parametrize("dram", ["default", "slow"])
@pytest.mark.parametrize("residual", [False, True])
def test_conv1x1_row_bands_fsim_tsim_rtl(residual, dram):
    """The layer's first chunk loads and computes in row bands and its last tile computes and stores
    in them (extra load->compute and compute->store tokens): three input chunks, four tiles, with and
    without a fused residual; identical bytes and counters on the three executors. The slow DRAM
    makes a band's loads outlast the compute stage's preamble, so a token pushed early shows."""
    slow = {"read_latency": 40, "write_latency": 20, "bytes_per_cycle": 1}
    c, o = 3 * TINY.block_in, 2 * TINY.block_out
    spec = Conv2dSpec(1, c, 6, 8, o, 1, 1)
    t = ConvTiling(1, 3, 8, 1, 2)   # output blocks 2 x row tiles 2; input chunks of one block
    rng = np.random.default_rng(4)
    x = rng.integers(-128, 128, (1, c, 6, 8), dtype=np.int8)
    w = rng.integers(-128, 128, (o, c, 1, 1), dtype=np.int8)
    b = rng.integers(-(1 << 14), 1 << 14, o).astype(np.int32)
    r = rng.integers(-127, 128, (1, o, 6, 8), dtype=np.int8)
    rq1, rq2 = Requant(9, -127, 127), Requant(1, -127, 127, True)
    ref = conv2d_reference(x, w, b, spec, rq1)
    if residual:
        ref = add_reference(ref, r, 0, 1, rq2)
    dram, stats = {}, {}
    for name in ("fsim", "tsim", "rtl"):
        opts = {"dram": slow} if name != "fsim" and dram == "slow" else {}
        with Device(TINY, driver=name, dram_bytes=4 << 20, **opts) as dev:
            y, res, stream = run_conv2d(dev, x, w, b, spec, rq1, 2, t, residual=(r, 0, 1, rq2) if residual else None)
            dram[name], stats[name] = dev.memory.array.copy(), res.stats
        assert np.array_equal(y, ref), name
    stores = [i for i in stream.last_insns if type(i).__name__ == "Store"]
    bands = min(FILL_BANDS, TINY.dep_queue_depth - 2, t.h_t)
    assert bands > 1 and len(stores) == 3 + bands   # one per tile, the last tile's one per row band
    assert np.array_equal(dram["tsim"], dram["fsim"]) and np.array_equal(dram["rtl"], dram["fsim"])
    assert _counters(stats["tsim"]) == _counters(stats["rtl"])


def test_dense_layer_tsim_rtl():
    rng = np.random.default_rng(2)
    x = rng.integers(-128, 128, (6, 40), dtype=np.int8)
    w = rng.integers(-128, 128, (24, 40), dtype=np.int8)
    out = {}
    for name in ("tsim", "rtl"):
        with Device(TINY, driver=name, dram_bytes=4 << 20) as dev:
            y, res, _ = run_dense(dev, x, w, None, Requant(6))
            out[name] = (y, _counters(res.stats))
    assert np.array_equal(out["tsim"][0], out["rtl"][0])
    assert out["tsim"][1] == out["rtl"][1]


def test_compiled_network_runs_alike_on_fsim_tsim_and_rtl():
    """A whole compiled module (residual CNN, tiny config) through host_runtime's executor on each
    driver: the same outputs; per accelerator step the same instruction and micro-op counts from all
    three, and tsim's cycles and bus bytes equal to the RTL's."""
    m = zoo.residual_block()
    feeds = zoo.sample_inputs(m, 3, seed=4)
    mod = compiler.build_model(m, target="accel", config="tiny", calibration=feeds[:2])
    outs, prof = {}, {}
    for drv in ("fsim", "tsim", "rtl"):
        with Executor(mod, driver=drv) as ex:
            outs[drv] = ex.run(feeds[2])
            prof[drv] = [r for r in ex.profile if r["target"] == "accel"]
    for drv in ("tsim", "rtl"):
        for k in outs["fsim"]:
            np.testing.assert_array_equal(outs[drv][k], outs["fsim"][k], err_msg=f"{drv}: output {k}")
    assert len(prof["fsim"]) >= 2
    fields = ("name", "insns", "gemm_uops", "alu_uops")
    bus = ("cycles", "bytes_read", "bytes_written")   # fsim counts data bytes; tsim and rtl bus beats
    for f, t, r in zip(prof["fsim"], prof["tsim"], prof["rtl"]):
        assert {k: f[k] for k in fields} == {k: t[k] for k in fields} == {k: r[k] for k in fields}
        assert {k: t[k] for k in bus} == {k: r[k] for k in bus}
        assert f["cycles"] is None and t["cycles"] > 0 and t["bytes_read"] >= f["bytes_read"] > 0


@pytest.mark.parametrize("fmt", ["vcd", "fst"])
def test_rtl_waveform_dump(tmp_path, fmt):
    """waves= builds the traced model variant and dumps the whole run: the file holds the accelerator's
    hierarchy (under the harness's accel_sim wrapper) and the run still leaves fsim's DRAM bytes.
    The traced model evaluates each cycle twice (clk low, clk high), the plain one once: both give the
    same counters, cycle for cycle."""
    prog, _ = random_program(TINY, 1)
    path = tmp_path / f"run.{fmt}"
    drv = get_driver("rtl", TINY, waves=str(path))
    dram = prog.dram_image()
    res = drv.run(dram, prog.insn_addr, len(prog.insns))
    drv.close()                               # closes (flushes) the waveform file
    ref = prog.dram_image()
    get_driver("fsim", TINY).run(ref, prog.insn_addr, len(prog.insns))
    assert res.cycles > 0 and np.array_equal(dram, ref)
    plain = get_driver("rtl", TINY)
    assert plain.run(prog.dram_image(), prog.insn_addr, len(prog.insns)).stats == res.stats
    plain.close()
    data = path.read_bytes()
    assert len(data) > 10_000
    if fmt == "vcd":
        text = data.decode()
        assert "$scope module dut $end" in text and "$scope module compute $end" in text and " clk $end" in text
    else:
        assert data[0] == 0   # FST header block
    with pytest.raises(SimError, match=r"run.txt: the suffix must be .vcd or .fst"):
        get_driver("rtl", TINY, waves=str(tmp_path / "run.txt"))


def test_repeated_bits_of_a_concatenation_become_a_replication(tmp_path):
    """The rtl driver's model reads yosys's sign extensions ({ x[7], x[7], x[7], x[7:0] }) as
    replications; runs shorter than three, part-selects and anything that is not one bit of a name
    or a sized constant stay as they are. No run of three equal bits is left in the tiny config's
    Verilog once collapsed."""
    c = collapse_repeats
    assert c("assign y = { a[7], a[7], a[7], a[7:0] };") == "assign y = { {3{a[7]}}, a[7:0] };"
    assert c("assign y = { \\$5 [3], \\$5 [3], \\$5 [3], b, b };") == "assign y = { {3{\\$5 [3]}}, b, b };"
    assert c("{ 1'h0, 1'h0, 1'h0, 1'h0, x }") == "{ {4{1'h0}}, x }"
    for same in ("{ a[7:4], a[7:4], a[7:4] }", "{ a[7], a[7], b }", "{ a + b, a + b, a + b }", "x = y;"):
        assert c(same) == same
    text = collapse_repeats(generate("tiny", tmp_path)["verilog"].read_text())
    assert "{24{" in text    # the ALU's sign-extended byte operands
    runs = [m.group(0) for m in _CONCAT.finditer(text)
            if any(a == b == d and _BIT.fullmatch(a)
                   for a, b, d in zip(*(m.group(1).split(", ")[k:] for k in range(3))))]
    assert not runs, runs[:3]


def test_sim_wrapper_registers_reset_and_refuses_a_top_without_it():
    """The Verilator model's wrapper: accel_top's ports unchanged, rst through a register; a port list
    without rst (not a generated accel_top) is refused by name."""
    ports = [{"name": "clk", "direction": "input", "width": 1}, {"name": "rst", "direction": "input", "width": 1},
             {"name": "m_axi_araddr", "direction": "output", "width": 32}]
    v = sim_wrapper(ports)
    assert v.startswith("module accel_sim(clk, rst, m_axi_araddr);")
    assert "  output [31:0] m_axi_araddr;" in v and "always @(posedge clk) rst_q <= rst;" in v
    assert "accel_top dut(.clk(clk), .rst(rst_q), .m_axi_araddr(m_axi_araddr));" in v
    with pytest.raises(BuildError, match="has no rst port"):
        sim_wrapper(ports[:1])
