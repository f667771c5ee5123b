"""AXI4 RAM and AXI4-Lite master for the cocotb bench, in one coroutine stepping once per clock.

Why not cocotbext-axi: tried first (0.1.28 installs with cocotb 1.8.1); it works on Icarus, but
under Verilator 5.006 its AXI-Lite master's channel writes never reached the DUT (awvalid stays
low), so no run could start. This model samples every DUT output in the ReadOnly phase (values
the DUT's flops see at the next rising edge) and drives inputs right after the edge, which is
race-free on both simulators. Its timing is sim.dram.DramModel's, the one DRAM definition the
timing model (sim/tsim) and the Verilator harness (sim/verilator) implement too:

  ARREADY = AWREADY = 1. Reads are served in order; beat k of a burst whose AR handshake is in
  cycle a is available from s + floor(k * bus_bytes / bytes_per_cycle), s = a + read_latency
  (throttled: not before the previous burst's s + floor(beats * bus_bytes / bytes_per_cycle)), and shown
  from the cycle after beat k-1 was taken at the earliest, held until RREADY. WREADY accepts
  beat k of the oldest accepted AW (cycle w) from w + 1 + floor(k * bus_bytes / bytes_per_cycle).
  A burst's B response is valid write_latency cycles after its WLAST beat, at most one per cycle.
  (bytes_per_cycle = 0: no bandwidth limit, one beat per cycle.)

With `stall_seed`, each ready/valid the model drives is instead dropped at random in ~30% of
cycles (protocol robustness only: cycle counts then differ).

Speed: while no handshake is pending, `run_until_irq` sleeps until the model's next event (a
read's latency or a write response's running out) or a rising ARVALID/AWVALID/WVALID/irq,
instead of waking every cycle (the clock runs in the simulator), so compute-bound stretches and
memory latency cost no Python.
"""
from __future__ import annotations

import random
from collections import deque

from cocotb.triggers import First, ReadOnly, RisingEdge, Timer
from cocotb.utils import get_sim_time

from sim.dram import DEFAULT_DRAM, DramModel

_DEBUG = bool(__import__("os").environ.get("ACCEL_AXI_DEBUG"))
CLOCK_NS = 10   # the testbench top's clock period (runner.CLOCK_NS)


def _int(sig) -> int:
    """A DUT output's value. Reads through the simulator handle (several times faster than
    sig.value's BinaryValue); X/Z bits on an output after reset are a bug and raise."""
    s = sig._handle.get_signal_val_binstr()
    try:
        return int(s, 2)
    except ValueError:
        raise RuntimeError(f"DUT output {sig._name} is {s} (X/Z) after reset") from None


class AxiModel:
    """The DRAM (AXI4 slave on m_axi_*) and a register port driver (AXI4-Lite master on
    s_axil_*). Call `start()` once; `cycle` counts rising edges since then."""

    def __init__(self, dut, dram_bytes: int, dram: DramModel = DEFAULT_DRAM, stall_seed: int | None = None):
        self.dut = dut
        self.mem = bytearray(dram_bytes)
        self.bus_bytes = len(dut.m_axi_rdata) // 8
        self.dram = dram
        self.read_latency, self.write_latency = dram.read_latency, dram.write_latency
        self.r_data_end = 0      # throttled reads: cycle the last accepted burst's data is produced
        self.rng = random.Random(stall_seed) if stall_seed is not None else None
        self.cycle = 0
        self.reads: deque = deque()     # [first_beat_cycle, addr, beats_left, id, beat index]
        self.writes: deque = deque()    # [addr, beats_left, aw_cycle, beat index] of accepted AWs
        self.bresp: deque = deque()     # cycles at which a B response becomes valid
        self.lite_req = None            # pending AXI-Lite transaction
        self.lite_res = None
        self.beats_read = self.beats_written = 0
        self.errors: list[str] = []
        self.pending_addr = {"ar": None, "aw": None}   # payload of an AR/AW offered and not accepted
        self.irq = 0
        self.steps = self.sleeps = 0    # Python wake-ups, for the speed figures
        self._driven: dict = {}
        for name, v in (("m_axi_arready", 0), ("m_axi_awready", 0), ("m_axi_wready", 0), ("m_axi_rvalid", 0),
                        ("m_axi_bvalid", 0), ("m_axi_rresp", 0), ("m_axi_bresp", 0), ("m_axi_rlast", 0),
                        ("m_axi_rdata", 0), ("m_axi_rid", 0), ("m_axi_bid", 0),
                        ("s_axil_awvalid", 0), ("s_axil_wvalid", 0), ("s_axil_bready", 0), ("s_axil_arvalid", 0),
                        ("s_axil_rready", 0), ("s_axil_awaddr", 0), ("s_axil_wdata", 0), ("s_axil_wstrb", 0),
                        ("s_axil_araddr", 0)):
            self._set(getattr(dut, name), v)

    def _set(self, sig, v: int) -> None:
        """Drive an input, skipping the (costly) scheduled write when the value is unchanged."""
        if self._driven.get(sig) != v:
            self._driven[sig] = v
            sig.value = v

    def _go(self) -> int:
        return 1 if self.rng is None or self.rng.random() >= 0.3 else 0

    # ---- one clock cycle ----------------------------------------------------------------------
    def _now(self) -> int:
        """Index of the last rising edge (edge n is at n * CLOCK_NS + CLOCK_NS / 2)."""
        return (int(get_sim_time("ps")) - CLOCK_NS * 500) // (CLOCK_NS * 1000)

    async def run_until_irq(self, max_cycles: int) -> bool:
        """Step until irq is high (True) or max_cycles edges have passed (False)."""
        d = self.dut
        end = self.cycle + max_cycles
        while not self.irq and self.cycle < end:
            requests = await self.step()
            if (requests or self.rng is not None or self.lite_req is not None or self.irq
                    or self._driven.get(d.m_axi_rvalid) or self._driven.get(d.m_axi_bvalid)):
                continue
            # Quiet: no handshake pending in either direction. Sleep until our next event (an
            # R beat or B response falling due, or the cycle limit) or until a valid or irq
            # rises. First look at what the edge just taken changed (a valid may have risen in
            # it, before we could wait for that).
            off = self.dram.beat_offset
            nxt = min([end] + ([self.reads[0][0] + off(self.reads[0][4], self.bus_bytes)] if self.reads else [])
                      + ([self.bresp[0]] if self.bresp else []))
            if nxt <= self.cycle + 1:
                continue
            await ReadOnly()
            if _int(d.m_axi_arvalid) or _int(d.m_axi_awvalid) or _int(d.m_axi_wvalid) or _int(d.irq):
                await Timer(1, units="ps")   # leave the read-only phase, still before the next edge
                continue
            # Waking on a valid, we are in the time step of the edge after which it rose, so the
            # next step() samples it before the edge that completes the handshake. Waking on the
            # timer, we are 2 ns before edge `nxt`, so the next step() takes that edge.
            self.sleeps += 1
            await First(RisingEdge(d.m_axi_arvalid), RisingEdge(d.m_axi_awvalid), RisingEdge(d.m_axi_wvalid),
                        RisingEdge(d.irq), Timer(CLOCK_NS * (nxt - self.cycle) - 2, units="ns"))
            self.cycle = self._now()
            if _DEBUG:
                d._log.warning(f"woke at cycle {self.cycle}: arvalid={d.m_axi_arvalid.value} irq={d.irq.value}")
        return bool(self.irq)

    def _check_stable(self, ch: str, valid: int, ready: int) -> None:
        """AXI4: once VALID is high, it and the channel's payload hold until READY (A3.2.1)."""
        d = self.dut
        was = self.pending_addr[ch]
        cur = tuple(_int(getattr(d, f"m_axi_{ch}{f}")) for f in ("addr", "len", "id")) if valid else None
        if was is not None and cur != was:
            what = "withdrawn" if cur is None else f"changed from {was} to {cur}"
            self.errors.append(f"cycle {self.cycle}: {ch.upper()}VALID high, {ch.upper()}READY low: "
                               f"(addr, len, id) {what}")
        self.pending_addr[ch] = cur if valid and not ready else None

    async def step(self):
        """Drive this cycle's inputs, sample what the DUT presents at the next edge, take the edge.
        Returns whether the DUT presented any AR/AW/W valid this cycle."""
        d, B = self.dut, self.bus_bytes
        self.steps += 1
        # drive: R beat, B response, readies
        off = self.dram.beat_offset
        r = self.reads[0] if self.reads and self.reads[0][0] + off(self.reads[0][4], B) <= self.cycle else None
        rvalid = int(r is not None and self._go())
        if rvalid:
            a = r[1]
            self._set(d.m_axi_rdata, int.from_bytes(self.mem[a:a + B], "little") if a + B <= len(self.mem) else 0)
            self._set(d.m_axi_rlast, int(r[2] == 1))
            self._set(d.m_axi_rid, r[3])
            self._set(d.m_axi_rresp, 0 if a + B <= len(self.mem) else 2)
        self._set(d.m_axi_rvalid, rvalid)
        bvalid = int(bool(self.bresp) and self.bresp[0] <= self.cycle and self._go())
        self._set(d.m_axi_bvalid, bvalid)
        wa = self.writes[0] if self.writes else None
        w_open = wa is not None and wa[2] + 1 + off(wa[3], B) <= self.cycle
        arready, awready, wready = self._go(), self._go(), int(w_open and self._go())
        self._set(d.m_axi_arready, arready)
        self._set(d.m_axi_awready, awready)
        self._set(d.m_axi_wready, wready)
        lite = self.lite_req
        if lite is not None:
            self._drive_lite(lite)

        await ReadOnly()
        arvalid, awvalid, wvalid = _int(d.m_axi_arvalid), _int(d.m_axi_awvalid), _int(d.m_axi_wvalid)
        ar = arvalid and arready
        if ar:
            ar_req = (_int(d.m_axi_araddr), _int(d.m_axi_arlen) + 1, _int(d.m_axi_arid))
        r_fire = rvalid and _int(d.m_axi_rready)
        aw = awvalid and awready
        if aw:
            aw_req = (_int(d.m_axi_awaddr), _int(d.m_axi_awlen) + 1)
        w_fire = wvalid and wready
        if w_fire:
            w_beat = (_int(d.m_axi_wdata), _int(d.m_axi_wstrb), _int(d.m_axi_wlast))
        b_fire = bvalid and _int(d.m_axi_bready)
        self._check_stable("ar", arvalid, arready)
        self._check_stable("aw", awvalid, awready)
        lite_sample = self._sample_lite(lite) if lite is not None else None
        self.irq = _int(d.irq)
        requests = bool(arvalid or awvalid or wvalid)

        if _DEBUG:
            d._log.warning(f"cycle {self.cycle}: ar={ar} r_fire={r_fire} aw={aw} w={w_fire} b={b_fire} irq={self.irq} "
                           f"reads={list(self.reads)[:2]}")
        await RisingEdge(d.clk)
        self.cycle += 1
        # commit what happened at this edge
        if ar:
            start = self.cycle - 1 + self.read_latency
            if self.dram.throttled(B):    # the DRAM streams the bursts' data one after another
                start = max(start, self.r_data_end)
                self.r_data_end = start + self.dram.beat_offset(ar_req[1], B)
            self.reads.append([start, ar_req[0], ar_req[1], ar_req[2], 0])
        if r_fire:
            self.beats_read += 1
            r[1] += B
            r[2] -= 1
            r[4] += 1
            if r[2] == 0:
                self.reads.popleft()
        if aw:
            self.writes.append([aw_req[0], aw_req[1], self.cycle - 1, 0])
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
                wa[3] += 1
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
        return requests

    # ---- AXI4-Lite master --------------------------------------------------------------------
    def _drive_lite(self, t):
        d = self.dut
        if t["kind"] == "w":
            self._set(d.s_axil_awaddr, t["addr"])
            self._set(d.s_axil_wdata, t["data"])
            self._set(d.s_axil_wstrb, 0xF)
            self._set(d.s_axil_awvalid, int(not t["aw"]))
            self._set(d.s_axil_wvalid, int(not t["w"]))
            self._set(d.s_axil_bready, 1)
        else:
            self._set(d.s_axil_araddr, t["addr"])
            self._set(d.s_axil_arvalid, int(not t["ar"]))
            self._set(d.s_axil_rready, 1)

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
                self._set(getattr(d, name), 0)

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
