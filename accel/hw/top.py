"""Accelerator: the top level. Wiring only: the stages, their queues, the on-chip buffers, the
AXI4 master and the control registers.

Ports: m_axi (AXI4 master to DRAM), s_axil (AXI4-Lite control slave), irq. Everything but the
control registers and the buffer contents is reset by the start pulse, so every run begins
with empty queues; a run ends (done) when FINISH has retired in compute, the load and store
stages are idle with empty command queues, and fetch has no read in progress; or, after a
fault, when the core is quiet (regs.py, Errors).
"""
from __future__ import annotations

from amaranth.hdl import Cat, Module, Mux, ResetInserter, unsigned
from amaranth.lib import wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from accel.isa import AccelConfig, MemType, buffer_depth, elem_bytes
from accel.isa.config import INSN_BITS

from .axi import AXI4LiteSignature, AXI4Signature, AxiMaster
from .compute import ComputeStage
from .fetch import Fetch
from .load import LoadStage
from .params import INDEX_BITS, ErrorCode
from .queues import Queue
from .regs import REG_ADDR_WIDTH, ControlRegs
from .store import StoreStage

READ_CLIENTS = ("fetch", "load", "compute")   # AxiMaster read client order (round robin)


class Accelerator(wiring.Component):
    """m_axi (Out, AXI4Signature): DRAM. s_axil (In, AXI4LiteSignature): registers (regs.py).
    irq (Out): done & irq_enable."""

    def __init__(self, cfg: AccelConfig):
        self.cfg = cfg
        super().__init__({"m_axi": Out(AXI4Signature(addr_width=cfg.dram_addr_width, data_width=cfg.bus_width)),
                          "s_axil": In(AXI4LiteSignature(addr_width=REG_ADDR_WIDTH)),
                          "irq": Out(1)})

    def elaborate(self, platform):
        m = Module()
        cfg = self.cfg
        connect, flipped = wiring.connect, wiring.flipped

        m.submodules.regs = regs = ControlRegs(cfg)
        connect(m, flipped(self.s_axil), regs.s_axil)
        m.d.comb += self.irq.eq(regs.irq)

        def core(name, elaboratable):
            """Submodules of the core are reset by the start pulse (and SOFT_RESET)."""
            m.submodules[name] = ResetInserter(regs.reset_core)(elaboratable)
            return elaboratable

        fetch = core("fetch", Fetch(cfg))
        load = core("load", LoadStage(cfg))
        compute = core("compute", ComputeStage(cfg))
        store = core("store", StoreStage(cfg))
        # not reset with the core: it finishes the bursts on the bus first (quiesce / idle)
        m.submodules.axi = axi = AxiMaster(cfg, n_read=len(READ_CLIENTS))
        m.d.comb += [axi.quiesce.eq(regs.quiesce), regs.bus_idle.eq(axi.idle)]
        connect(m, flipped(self.m_axi), axi.bus)
        for i, stage in enumerate((fetch, load, compute)):
            connect(m, stage.dma, axi.rd[i])
        connect(m, store.wr, axi.wr)

        # ---- command queues (fetch -> stages) and dependency-token queues -------------------------
        queues = {}
        for name, src, dst, width in (("load_cmd", fetch.ld_cmd, load.cmd, INSN_BITS),
                                      ("compute_cmd", fetch.cp_cmd, compute.cmd, INSN_BITS + INDEX_BITS),
                                      ("store_cmd", fetch.st_cmd, store.cmd, INSN_BITS)):
            q = queues[name] = core(name, Queue(width, cfg.cmd_queue_depth))
            connect(m, src, q.w)
            connect(m, q.r, dst)
        for name, src, dst in (("l2c", load.next_out, compute.prev_in), ("c2l", compute.prev_out, load.next_in),
                               ("c2s", compute.next_out, store.prev_in), ("s2c", store.prev_out, compute.next_in)):
            q = core(f"tok_{name}", Queue(1, cfg.dep_queue_depth))
            connect(m, src, q.w)
            connect(m, q.r, dst)

        # ---- on-chip buffers ------------------------------------------------------------------------
        def buffer(mem):
            bits = cfg.uop_bits if mem == MemType.UOP else elem_bytes(cfg, mem) * 8
            mm = m.submodules[f"{mem.name.lower()}_buf"] = Memory(shape=unsigned(bits), depth=buffer_depth(cfg, mem),
                                                                   init=[])
            return mm
        uop, inp, wgt, acc, out = (buffer(t) for t in (MemType.UOP, MemType.INP, MemType.WGT, MemType.ACC, MemType.OUT))
        connect(m, load.wr_inp, inp.write_port())
        connect(m, load.wr_wgt, wgt.write_port())
        connect(m, compute.inp_rd, inp.read_port())
        connect(m, compute.wgt_rd, wgt.read_port())
        connect(m, compute.wr_uop, uop.write_port())
        connect(m, compute.uop_rd, uop.read_port())
        acc_wp = acc.write_port()
        connect(m, compute.wr_acc, acc_wp)
        connect(m, compute.acc_rd_a, acc.read_port(transparent_for=(acc_wp,)))
        connect(m, compute.acc_rd_b, acc.read_port(transparent_for=(acc_wp,)))
        connect(m, compute.wr_out, out.write_port())
        connect(m, store.out_rd, out.read_port())

        # ---- run control and counters ------------------------------------------------------------------
        m.d.comb += [fetch.run.eq(regs.busy), fetch.insn_addr.eq(regs.insn_addr), fetch.insn_count.eq(regs.insn_count),
                     regs.finish.eq(compute.finished & fetch.stopped & load.idle & store.idle & fetch.dma_idle &
                                    (queues["load_cmd"].level == 0) & (queues["store_cmd"].level == 0)),
                     regs.bus_error.eq(axi.bus_error),
                     fetch.halt.eq(regs.halt), load.halt.eq(regs.halt), compute.halt.eq(regs.halt),
                     store.halt.eq(regs.halt)]
        # ---- faults, watchdog and counters ----------------------------------------------------------------
        # compute's fault is in an instruction already dispatched: a lower index than fetch's
        stages = (load, compute, store)
        m.d.comb += [regs.fault.eq(fetch.fault | compute.fault),
                     regs.fault_code.eq(Mux(compute.fault, ErrorCode.INDEX_RANGE, fetch.fault_code)),
                     regs.fault_index.eq(Mux(compute.fault, compute.fault_index, fetch.fault_index)),
                     regs.quiet.eq(~Cat(*(st.executing | st.event for st in stages)).any() & fetch.dma_idle &
                                   ~fetch.dispatch & axi.rd_idle),
                     regs.progress.eq(fetch.dispatch | Cat(*(st.event for st in stages)).any() | compute.gemm_uop |
                                      compute.alu_uop | axi.rd_beat | axi.wr_beat),
                     regs.wd_index.eq(fetch.next_index),
                     regs.ev_load_busy.eq(load.busy_cycle), regs.ev_load_stall.eq(load.stall_cycle),
                     regs.ev_compute_busy.eq(compute.busy_cycle), regs.ev_compute_stall.eq(compute.stall_cycle),
                     regs.ev_store_busy.eq(store.busy_cycle), regs.ev_store_stall.eq(store.stall_cycle),
                     regs.ev_gemm_uops.eq(compute.gemm_uop), regs.ev_alu_uops.eq(compute.alu_uop),
                     regs.ev_bytes_read.eq(axi.rd_beat), regs.ev_bytes_written.eq(axi.wr_beat)]
        return m
