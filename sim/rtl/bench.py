"""cocotb testbench of the accelerator top level: clock, reset, the AXI4 RAM and AXI4-Lite
master of axi_model.py; loads a DRAM image, starts a run through the registers, steps the clock
until the interrupt or a cycle limit, and reads the performance counters.

Runs in the simulator process (imported by tb_accel.py); the host side is runner.py.
"""
from __future__ import annotations

import time

from cocotb.triggers import ClockCycles

from accel.hw.regs import COUNTER_BASE, COUNTERS
from sim.dram import DramModel

from .axi_model import AxiModel

REG_CTRL, REG_STATUS, REG_INSN_ADDR_LO, REG_INSN_ADDR_HI, REG_INSN_COUNT = 0x00, 0x04, 0x08, 0x0C, 0x10
REG_ERROR, REG_ERROR_INSN, REG_WATCHDOG, REG_SOFT_RESET = 0x18, 0x1C, 0x20, 0x24
CTRL_START, CTRL_IRQ_EN = 1, 2
STATUS_BUSY, STATUS_DONE, STATUS_BUS_ERROR, STATUS_ERROR = 1, 2, 4, 8


class TB:
    """Owns reset and the bus model in front of the DUT (stall_seed: random AXI stalls)."""

    def __init__(self, dut, dram_bytes: int, stall_seed: int | None = None, dram: dict | None = None):
        self.dut = dut   # the testbench top (runner.testbench_top): the clock runs in the simulator
        self.axi = AxiModel(dut, dram_bytes, DramModel.from_dict(dram), stall_seed=stall_seed)

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

    async def run(self, dram: bytes, insn_addr: int, insn_count: int, max_cycles: int, watchdog: int = 0,
                  soft_reset: bool = False) -> dict:
        """One program: DRAM in, WATCHDOG set, start, step until irq (at most max_cycles), counters
        out. soft_reset: after a hang, write SOFT_RESET (and check the core went idle) so that the
        next program can start. Returns {"status": "done" | "fault" | "hang" | "reset", "counters",
        "wall_s", "status_reg", "bus_error", "error" (ERROR, ERROR_INSN), "sim_cycles" (edges from
        the CTRL write to irq seen), "protocol_errors"}."""
        ax = self.axi
        ax.mem[:len(dram)] = dram
        ax.mem[len(dram):] = bytes(len(ax.mem) - len(dram))
        await ax.write_reg(REG_WATCHDOG, watchdog)
        await ax.write_reg(REG_INSN_ADDR_LO, insn_addr & 0xFFFFFFFF)
        await ax.write_reg(REG_INSN_ADDR_HI, insn_addr >> 32)
        await ax.write_reg(REG_INSN_COUNT, insn_count)
        got = await ax.read_reg(REG_INSN_COUNT)
        if got != insn_count:
            raise RuntimeError(f"INSN_COUNT reads back {got}, wrote {insn_count}: register interface broken")
        t0, cpu0, steps0, sleeps0 = time.perf_counter(), time.process_time(), ax.steps, ax.sleeps
        await ax.write_reg(REG_CTRL, CTRL_START | CTRL_IRQ_EN)
        c0 = ax.cycle
        done = await ax.run_until_irq(max_cycles)
        wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
        sim_cycles = ax.cycle - c0
        status = await ax.read_reg(REG_STATUS)
        counters = await self.read_counters()
        error = (await ax.read_reg(REG_ERROR), await ax.read_reg(REG_ERROR_INSN))
        state = "fault" if status & STATUS_ERROR else "done" if done else "hang"
        if done:
            await ax.write_reg(REG_STATUS, STATUS_DONE)   # clear done (and the interrupt)
        elif soft_reset:
            await ax.write_reg(REG_SOFT_RESET, 1)
            after = await ax.read_reg(REG_STATUS)
            state = "reset" if not after & (STATUS_BUSY | STATUS_DONE | STATUS_ERROR) else "hang"
        return {"status": state, "counters": counters, "wall_s": wall, "status_reg": status, "error": error,
                "bus_error": bool(status & STATUS_BUS_ERROR), "sim_cycles": sim_cycles,
                "protocol_errors": list(ax.errors), "cpu_s": cpu, "steps": ax.steps - steps0,
                "sleeps": ax.sleeps - sleeps0}

    def dram(self, nbytes: int) -> bytes:
        return bytes(self.axi.mem[:nbytes])
