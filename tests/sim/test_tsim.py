"""Timing model without the RTL: the queue model against a literal SyncFIFOBuffered, cycle counts
derived by hand from the RTL's documented timing, DRAM model checks, counters and exports."""
import dataclasses
import json
import random
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from randprog import random_program

from accel.cli import main
from accel.hw.params import ErrorCode
from accel.isa import PRESETS, Alu, AluOp, Finish, Gemm, Load, MemType, Store
from host_runtime import get_driver
from sim.dram import DramModel
from sim.errors import DeadlockError, ProgramFault, SimError
from sim.trace import Counters, Timeline, write_counters, write_perfetto, write_timeline_png
from sim.tsim import Tsim
from sim.tsim.bus import plan_bursts
from sim.tsim.queues import TimedFifo
from sim.tsim.store import store_cycles

TINY = PRESETS["tiny"]


@pytest.mark.parametrize("depth", [2, 4, 8])
def test_tsim_fifo_matches_syncfifobuffered(depth):
    """TimedFifo's visibility and space rules against amaranth's SyncFIFOBuffered, register for register."""
    for trial in range(40):
        rng = random.Random(trial)
        inner, out = 0, 0
        q = TimedFifo("q", depth)
        pw, pr = rng.random(), rng.random()
        for t in range(150):
            w_rdy, r_rdy = inner != depth - 1, bool(out)
            assert q.can_write(t) == w_rdy, (trial, t)
            nr = len(q.R)
            assert (nr < len(q.W) and q.visible_at(nr) <= t) == r_rdy, (trial, t)
            assert q.level(t) == inner + out
            if not w_rdy:
                rt = q.retry_time(t)
                assert rt is None or rt > t
            w_en, r_en = rng.random() < pw, rng.random() < pr
            do_write, do_read = w_en and w_rdy, r_en and r_rdy
            do_inner = inner != 0 and (not out or r_en)
            if do_read:
                q.R.append(t)
            if do_write:
                q.W.append(t)
            inner += do_write - do_inner
            out = 1 if do_inner else (0 if r_en else out)


def _cycles(insns, cfg=TINY, dram=None):
    return Tsim(cfg, dram or DramModel()).run_insns(insns, 0x1000)


@pytest.mark.parametrize("latency", [1, 8, 30])
def test_tsim_finish_alone(latency):
    """Start pulse 0, fetch latches 1, DMA command 2, AR 3, beats 3+L and 4+L (16-byte instruction on a
    64-bit bus), buffer -> visible 6+L, dispatch, visible to compute 8+L, pop 8+L, EXEC 9+L..10+L,
    retire 11+L, finished 12+L = the cycle finish is seen: 13+L cycles."""
    st = _cycles([Finish()], dram=DramModel(read_latency=latency))
    assert st.cycles == 13 + latency
    assert st.busy == [0, 4, 0] and st.stall == [0, 0, 0]
    assert st.bytes_read == 16


@pytest.mark.parametrize("n_uops,iters,extra", [(1, (1, 1), 4), (3, (2, 5), 4), (0, (1, 1), 1)])
def test_tsim_gemm_alu_duration_from_loop_bounds(n_uops, iters, extra):
    """A GEMM's EXEC lasts n + 5 cycles after start, an ALU's n + 4 (a MUL or SCALE 2n + 3: its
    micro-ops issue every other cycle): busy = that + 3 for the stage."""
    n = n_uops * iters[0] * iters[1]
    g = Gemm(uop_bgn=0, uop_end=n_uops, iter_out=iters[0], iter_in=iters[1])
    base = _cycles([Finish()]).busy[1]
    assert _cycles([g, Finish()]).busy[1] - base == (n + extra + 1 if n else 1) + 3
    for op in AluOp:
        a = Alu(uop_bgn=0, uop_end=n_uops, iter_out=iters[0], iter_in=iters[1], alu_op=op)
        mul = op in (AluOp.MUL, AluOp.SCALE)
        assert _cycles([a, Finish()]).busy[1] - base == (n + (n - 1) * mul + extra if n else 1) + 3, op.name
        assert _cycles([a, Finish()]).alu_uops == n
    assert _cycles([g, Finish()]).gemm_uops == n


def test_tsim_bursts_split_at_4k_and_max_len():
    bursts = plan_bursts(4096 - 64, 40, 16, 8, 256)       # 640 bytes from 64 below a 4 KiB boundary
    assert [b for b, _ in bursts] == [8, 72]
    small = plan_bursts(4, 5, 4, 8, 512)                  # 4-byte entries on an 8-byte bus, unaligned
    assert small == [(3, (1, 2, 2))]
    assert sum(b for b, _ in plan_bursts(0, 3000, 16, 8, 512)) == 6000


@settings(max_examples=300, deadline=None)
@given(st.sampled_from([4, 8, 16]), st.sampled_from([1, 2, 4, 8, 16, 32, 64]), st.sampled_from([1, 2, 3, 16, 256]),
       st.integers(1, 20), st.sampled_from([0, 1, 3, 4, 8]), st.integers(0, 6), st.integers(0, 80),
       st.integers(0, 4095), st.integers(0, 4095), st.booleans(), st.sampled_from([1, 2, 4, 8]))
def test_tsim_store_streaming_skip_is_exact(bus, elem, max_beats, latency, bpc, y, x, base, stride, dense, max_open):
    """The store model's one-step streaming stretches give the cycle-by-cycle model's (U, beats)
    on any shape, alignment, burst limit and DRAM model (throttled and narrow-element stores step)."""
    base, stride = base // elem * elem, (x * elem if dense else stride // elem * elem) % 4096
    key = (bus, elem, max_beats, latency, bpc, y, x, base, stride, max_open)
    assert store_cycles(key, skip=True) == store_cycles(key, skip=False)


def test_tsim_bandwidth_slows_loads():
    ld = [Load(mem_type=MemType.WGT, dram_base=0x100, y_size=4, x_size=8, x_stride=8, push_next=True),
          Finish(pop_prev=True)]
    fast = _cycles(ld).cycles
    slow = _cycles(ld, dram=DramModel(bytes_per_cycle=2)).cycles
    # 16 beats a row, each 4 cycles apart instead of 1 after the first: 3 x 15 cycles more per row
    assert slow >= fast + 4 * 3 * 15


@pytest.mark.parametrize("bpc", [0, 2])
def test_tsim_outstanding_reads_make_loads_bandwidth_bound(bpc):
    """With read_outstanding bursts in flight, a load's rows follow each other at the bus (or DRAM)
    rate after one latency; with one burst in flight every row pays the latency again."""
    L, rows = 40, 8
    ld = [Load(mem_type=MemType.INP, dram_base=0x100, y_size=rows, x_size=8, x_stride=8, push_next=True),
          Finish(pop_prev=True)]                        # a row: 32 bytes, 4 beats of two 4-byte entries
    dram = DramModel(read_latency=L, bytes_per_cycle=bpc)
    # a row's data: 4 beats each held 2 cycles (E < B); at 2 B/cycle a beat every 4 cycles, so a lone row
    # spans 3 * 4 + 2 cycles and back-to-back rows 32 / 2 = 16 cycles each
    span, pace = (8, 8) if bpc == 0 else (14, 16)
    busy = {}
    for n in (1, 4, 8):
        st = Tsim(TINY.replace(read_outstanding=n), dram).run_insns(ld, trace=True)
        busy[n] = st.busy[0]
        loads = sorted((g, f) for c, g, f in st.bursts if c == 1)
        inflight = max(sum(g <= t <= f for g, f in loads) for t in range(loads[0][0], loads[-1][1] + 1))
        assert inflight == min(n, rows), (n, loads)
    assert busy[1] >= rows * (L + span)                 # latency paid per row
    assert busy[8] <= L + rows * pace + 4               # once, then back-to-back data
    assert busy[8] <= busy[4] < busy[1]


def test_tsim_deadlock_is_reported():
    with pytest.raises(DeadlockError, match="compute stage blocked at instruction 0"):
        _cycles([Gemm(pop_prev=True), Finish()])


def test_dram_model_validation():
    with pytest.raises(SimError, match="read_latency=0"):
        DramModel(read_latency=0)
    with pytest.raises(SimError, match="unknown key"):
        DramModel.from_dict({"latency": 3})
    assert DramModel.from_dict({"bytes_per_cycle": 4}).throttled(8)


def _program():
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    return random_program(TINY, 3)[0]


def test_tsim_driver_counters_and_exports(tmp_path):
    prog = _program()
    dram, ref = prog.dram_image(), prog.dram_image()
    drv = get_driver("tsim", TINY, trace=True)
    res = drv.run(dram, prog.insn_addr, len(prog.insns))
    get_driver("fsim", TINY).run(ref, prog.insn_addr, len(prog.insns))
    assert np.array_equal(dram, ref)
    c: Counters = res.raw.counters
    assert res.cycles == c.cycles == res.stats["cycles"] > 0
    for s in c.stages.values():
        assert s.busy + s.stall_token + s.stall_queue == c.cycles and min(s.busy, s.stall_token, s.stall_queue) >= 0
    assert 0 < c.gemm_utilization < 1 and c.gops > 0
    assert res.stats["insns"] == {k: v for k, v in c.insns.items()}
    tl: Timeline = res.raw.timeline
    assert len(tl.slices) == len(prog.insns) and all(s.end > s.start for s in tl.slices)
    write_perfetto(tmp_path / "t.json", TINY, c, tl, prog.insns, "tsim")
    trace = json.loads((tmp_path / "t.json").read_text())
    names = {e["args"]["name"] for e in trace["traceEvents"] if e.get("name") == "thread_name"}
    assert {"load", "compute", "store"} <= names
    assert sum(e["ph"] == "X" and e["tid"] < 3 for e in trace["traceEvents"]) == len(prog.insns)
    write_timeline_png(tmp_path / "t.png", TINY, c, tl)
    assert (tmp_path / "t.png").read_bytes()[:4] == b"\x89PNG"
    write_counters(tmp_path / "c.json", c, "tsim")
    assert json.loads((tmp_path / "c.json").read_text())["cycles"] == c.cycles


def test_cli_run_timing_outputs(tmp_path, capsys):
    prog = _program()
    prog.save(tmp_path / "p.accp")
    rc = main(["run", str(tmp_path / "p.accp"), "--driver", "tsim", "--trace", str(tmp_path / "t.json"),
               "--timeline", str(tmp_path / "t.png"), "--counters"])
    out = capsys.readouterr().out
    assert rc == 0 and "stall_token" in out and (tmp_path / "t.json").exists() and (tmp_path / "t.png").exists()
    assert main(["run", str(tmp_path / "p.accp"), "--counters"]) == 2
    assert "need a timing driver" in capsys.readouterr().err


def test_tsim_faults_where_fetch_does_and_ignores_what_follows_finish():
    """The timing model stops dispatch before a statically faulting instruction (code and index as
    fsim's), never dispatches past FINISH (anything may follow it), and with no FINISH reports
    NO_FINISH."""

    ld = Load(mem_type=MemType.INP, dram_base=0x40, y_size=1, x_size=2, x_stride=2, push_next=True)
    for prog, want in (([ld, Gemm(pop_prev=True), Store(y_size=1, x_size=1, x_pad0=1), Finish()],
                        (ErrorCode.BAD_FIELD, 2)),
                       ([ld, Gemm(pop_prev=True, uop_end=999), Finish()], (ErrorCode.SRAM_RANGE, 1)),
                       ([ld, Gemm(pop_prev=True)], (ErrorCode.NO_FINISH, 2))):
        with pytest.raises(ProgramFault) as e:
            Tsim(TINY).run_insns(prog)
        assert (e.value.code, e.value.index) == want
    cfg = dataclasses.replace(TINY, cmd_queue_depth=2, bus_width=128)
    base = Tsim(cfg).run_insns([ld, Gemm(pop_prev=True), Finish()]).counters()
    junk = [Store(sram_base=999), Load(mem_type=MemType.OUT)]
    tail = Tsim(cfg).run_insns([ld, Gemm(pop_prev=True), Finish()] + junk * 3)
    assert tail.counters()["cycles"] >= base["cycles"] and tail.counters()["gemm_uops"] == 0
