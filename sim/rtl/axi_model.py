"""AXI4 RAM and AXI4-Lite master for the cocotb bench, in one coroutine stepping once per clock.

Why not cocotbext-axi: tried first (0.1.28 installs with cocotb 1.8.1); it works on Icarus, but
under Verilator 5.006 its AXI-Lite master's channel writes never reached the DUT (awvalid stays
low), so no run could start. This model samples every DUT output in the ReadOnly phase (values
the DUT's flops see at the next rising edge) and drives inputs right after the edge, which is
race-free on both simulators. It also gives the timing model a fixed, documented memory:

  AR / AW / W are accepted in the cycle they are valid (ARREADY = AWREADY = WREADY = 1).
  Reads are served in order; a burst whose AR handshake is in cycle t has its first R beat
  valid in cycle t + read_latency and one beat per cycle after that while RREADY is high
  (a beat not taken is held). Bursts queue back to back.
  A write burst's B response is valid in cycle t + write_latency, t the cycle of its WLAST beat.

With `stall_seed`, each ready/valid the model drives is instead dropped at random in ~30% of
cycles (protocol robustness only: cycle counts then differ).
"""
from __future__ import annotations

import random
from collections import deque

from cocotb.triggers import ReadOnly, RisingEdge

READ_LATENCY = 8
WRITE_LATENCY = 2


def _int(sig) -> int:
    try:
        return int(sig.value)
    except ValueError:
        raise RuntimeError(f"DUT output {sig._name} is {sig.value.binstr} (X/Z) after reset") from None


class AxiModel:
    """The DRAM (AXI4 slave on m_axi_*) and a register port driver (AXI4-Lite master on
    s_axil_*). Call `start()` once; `cycle` counts rising edges since then."""

    def __init__(self, dut, dram_bytes: int, read_latency: int = READ_LATENCY, write_latency: int = WRITE_LATENCY,
                 stall_seed: int | None = None):
        self.dut = dut
        self.mem = bytearray(dram_bytes)
        self.bus_bytes = len(dut.m_axi_rdata) // 8
        self.read_latency, self.write_latency = read_latency, write_latency
        self.rng = random.Random(stall_seed) if stall_seed is not None else None
        self.cycle = 0
        self.reads: deque = deque()     # [ready_cycle, addr, beats_left, id]
        self.writes: deque = deque()    # [addr, beats_left] of accepted AWs
        self.bresp: deque = deque()     # cycles at which a B response becomes valid
        self.lite_req = None            # pending AXI-Lite transaction
        self.lite_res = None
        self.beats_read = self.beats_written = 0
        self.errors: list[str] = []
        for name, v in (("m_axi_arready", 0), ("m_axi_awready", 0), ("m_axi_wready", 0), ("m_axi_rvalid", 0),
                        ("m_axi_bvalid", 0), ("m_axi_rresp", 0), ("m_axi_bresp", 0), ("m_axi_rlast", 0),
                        ("m_axi_rdata", 0), ("m_axi_rid", 0), ("m_axi_bid", 0),
                        ("s_axil_awvalid", 0), ("s_axil_wvalid", 0), ("s_axil_bready", 0), ("s_axil_arvalid", 0),
                        ("s_axil_rready", 0), ("s_axil_awaddr", 0), ("s_axil_wdata", 0), ("s_axil_wstrb", 0),
                        ("s_axil_araddr", 0)):
            getattr(dut, name).value = v

    def _go(self) -> int:
        return 1 if self.rng is None or self.rng.random() >= 0.3 else 0

    # ---- one clock cycle ----------------------------------------------------------------------
    async def step(self):
        """Drive this cycle's inputs, sample what the DUT presents at the next edge, take the edge."""
        d, B = self.dut, self.bus_bytes
        # drive: R beat, B response, readies
        r = self.reads[0] if self.reads and self.reads[0][0] <= self.cycle else None
        rvalid = int(r is not None and self._go())
        if rvalid:
            a = r[1]
            d.m_axi_rdata.value = int.from_bytes(self.mem[a:a + B], "little") if a + B <= len(self.mem) else 0
            d.m_axi_rlast.value = int(r[2] == 1)
            d.m_axi_rid.value = r[3]
            d.m_axi_rresp.value = 0 if a + B <= len(self.mem) else 2
        d.m_axi_rvalid.value = rvalid
        bvalid = int(bool(self.bresp) and self.bresp[0] <= self.cycle and self._go())
        d.m_axi_bvalid.value = bvalid
        arready, awready, wready = self._go(), self._go(), self._go()
        d.m_axi_arready.value, d.m_axi_awready.value, d.m_axi_wready.value = arready, awready, wready
        lite = self.lite_req
        if lite is not None:
            self._drive_lite(lite)

        await ReadOnly()
        ar = _int(d.m_axi_arvalid) and arready
        if ar:
            ar_req = (_int(d.m_axi_araddr), _int(d.m_axi_arlen) + 1, _int(d.m_axi_arid))
        r_fire = rvalid and _int(d.m_axi_rready)
        aw = _int(d.m_axi_awvalid) and awready
        if aw:
            aw_req = (_int(d.m_axi_awaddr), _int(d.m_axi_awlen) + 1)
        w_fire = _int(d.m_axi_wvalid) and wready
        if w_fire:
            w_beat = (_int(d.m_axi_wdata), _int(d.m_axi_wstrb), _int(d.m_axi_wlast))
        b_fire = bvalid and _int(d.m_axi_bready)
        lite_sample = self._sample_lite(lite) if lite is not None else None
        self.irq = _int(d.irq)

        await RisingEdge(d.clk)
        self.cycle += 1
        # commit what happened at this edge
        if ar:
            self.reads.append([self.cycle - 1 + self.read_latency, ar_req[0], ar_req[1], ar_req[2]])
        if r_fire:
            self.beats_read += 1
            r[1] += B
            r[2] -= 1
            if r[2] == 0:
                self.reads.popleft()
        if aw:
            self.writes.append(list(aw_req))
        if w_fire:
            if not self.writes:
                self.errors.append(f"cycle {self.cycle}: W beat before its AW")
            else:
                wa = self.writes[0]
                data, strb, last = w_beat
                for j in range(B):
                    if strb >> j & 1 and wa[0] + j < len(self.mem):
                        self.mem[wa[0] + j] = (data >> (8 * j)) & 0xFF
                wa[0] += B
                wa[1] -= 1
                self.beats_written += 1
                if bool(last) != (wa[1] == 0):
                    self.errors.append(f"cycle {self.cycle}: WLAST={last} with {wa[1]} beats of the burst left")
                if wa[1] == 0:
                    self.writes.popleft()
                    self.bresp.append(self.cycle - 1 + self.write_latency)
        if b_fire:
            self.bresp.popleft()
        if lite is not None:
            self._commit_lite(lite, lite_sample)

    # ---- AXI4-Lite master --------------------------------------------------------------------
    def _drive_lite(self, t):
        d = self.dut
        if t["kind"] == "w":
            d.s_axil_awaddr.value, d.s_axil_wdata.value, d.s_axil_wstrb.value = t["addr"], t["data"], 0xF
            d.s_axil_awvalid.value = int(not t["aw"])
            d.s_axil_wvalid.value = int(not t["w"])
            d.s_axil_bready.value = 1
        else:
            d.s_axil_araddr.value = t["addr"]
            d.s_axil_arvalid.value = int(not t["ar"])
            d.s_axil_rready.value = 1

    def _sample_lite(self, t):
        d = self.dut
        if t["kind"] == "w":
            return (not t["aw"] and _int(d.s_axil_awready), not t["w"] and _int(d.s_axil_wready),
                    t["aw"] and t["w"] and _int(d.s_axil_bvalid))
        return (not t["ar"] and _int(d.s_axil_arready), t["ar"] and _int(d.s_axil_rvalid),
                _int(d.s_axil_rdata))

    def _commit_lite(self, t, s):
        d = self.dut
        if t["kind"] == "w":
            t["aw"] |= bool(s[0])
            t["w"] |= bool(s[1])
            if s[2]:
                self.lite_req, self.lite_res = None, True
        else:
            t["ar"] |= bool(s[0])
            if s[1]:
                self.lite_req, self.lite_res = None, s[2]
        if self.lite_req is None:
            for name in ("s_axil_awvalid", "s_axil_wvalid", "s_axil_bready", "s_axil_arvalid", "s_axil_rready"):
                getattr(d, name).value = 0

    async def _lite(self, req, limit: int = 1000):
        self.lite_req, self.lite_res = req, None
        for _ in range(limit):
            await self.step()
            if self.lite_req is None:
                return self.lite_res
        raise RuntimeError(f"AXI-Lite {'write' if req['kind'] == 'w' else 'read'} of 0x{req['addr']:02x} "
                           f"not answered in {limit} cycles")

    async def write_reg(self, addr: int, data: int) -> None:
        await self._lite({"kind": "w", "addr": addr, "data": data & 0xFFFFFFFF, "aw": False, "w": False})

    async def read_reg(self, addr: int) -> int:
        return await self._lite({"kind": "r", "addr": addr, "ar": False})
