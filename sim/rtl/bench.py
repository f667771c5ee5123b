"""cocotb testbench of the accelerator top level: clock, reset, the AXI4 RAM and AXI4-Lite
master of axi_model.py; loads a DRAM image, starts a run through the registers, steps the clock
until the interrupt or a cycle limit, and reads the performance counters.

Runs in the simulator process (imported by tb_accel.py); the host side is runner.py.
"""
from __future__ import annotations

import time

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import ClockCycles

from accel.hw.regs import COUNTER_BASE, COUNTERS

from .axi_model import AxiModel

CLOCK_NS = 10
REG_CTRL, REG_STATUS, REG_INSN_ADDR_LO, REG_INSN_ADDR_HI, REG_INSN_COUNT = 0x00, 0x04, 0x08, 0x0C, 0x10
CTRL_START, CTRL_IRQ_EN = 1, 2
STATUS_BUSY, STATUS_DONE, STATUS_BUS_ERROR = 1, 2, 4


class TB:
    """Owns the clock, reset and bus model in front of the DUT (stall_seed: random AXI stalls)."""

    def __init__(self, dut, dram_bytes: int, stall_seed: int | None = None, read_latency: int | None = None):
        self.dut = dut
        cocotb.start_soon(Clock(dut.clk, CLOCK_NS, units="ns").start())
        kw = {} if read_latency is None else {"read_latency": read_latency}
        self.axi = AxiModel(dut, dram_bytes, stall_seed=stall_seed, **kw)

    async def reset(self):
        self.dut.rst.value = 1
        await ClockCycles(self.dut.clk, 4)
        self.dut.rst.value = 0
        await self.axi.step()

    async def read_counters(self) -> dict[str, int]:
        out = {}
        for i, name in enumerate(COUNTERS):
            lo = await self.axi.read_reg(COUNTER_BASE + 8 * i)
            hi = await self.axi.read_reg(COUNTER_BASE + 8 * i + 4)
            out[name] = lo | hi << 32
        return out

    async def run(self, dram: bytes, insn_addr: int, insn_count: int, max_cycles: int) -> dict:
        """One program: DRAM in, start, step until irq (at most max_cycles), counters out.
        Returns {"status": "done" | "hang", "counters", "wall_s", "status_reg", "bus_error",
        "sim_cycles" (edges from the CTRL write to irq seen), "protocol_errors"}."""
        ax = self.axi
        ax.mem[:len(dram)] = dram
        ax.mem[len(dram):] = bytes(len(ax.mem) - len(dram))
        await ax.write_reg(REG_INSN_ADDR_LO, insn_addr & 0xFFFFFFFF)
        await ax.write_reg(REG_INSN_ADDR_HI, insn_addr >> 32)
        await ax.write_reg(REG_INSN_COUNT, insn_count)
        got = await ax.read_reg(REG_INSN_COUNT)
        if got != insn_count:
            raise RuntimeError(f"INSN_COUNT reads back {got}, wrote {insn_count}: register interface broken")
        t0 = time.perf_counter()
        await ax.write_reg(REG_CTRL, CTRL_START | CTRL_IRQ_EN)
        c0 = ax.cycle
        while not ax.irq and ax.cycle - c0 < max_cycles:
            await ax.step()
        done = bool(ax.irq)
        wall = time.perf_counter() - t0
        sim_cycles = ax.cycle - c0
        status = await ax.read_reg(REG_STATUS)
        counters = await self.read_counters()
        if done:
            await ax.write_reg(REG_STATUS, STATUS_DONE)   # clear done (and the interrupt)
        return {"status": "done" if done else "hang", "counters": counters, "wall_s": wall, "status_reg": status,
                "bus_error": bool(status & STATUS_BUS_ERROR), "sim_cycles": sim_cycles,
                "protocol_errors": list(ax.errors)}

    def dram(self, nbytes: int) -> bytes:
        return bytes(self.axi.mem[:nbytes])
