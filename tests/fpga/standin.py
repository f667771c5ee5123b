"""A small stand-in core with the accelerator's kinds of top-level ports, for flow tests.

Ports like the real top: clk/rst, an AXI4 master `mem__*` (cfg.bus_width data, cfg.dram_addr_width
address), an AXI4-Lite slave `ctrl__*` (32-bit), and `irq`. Inside: a control register file
(start, address, count, done), a read DMA that streams `count` beats into a block RAM of
cfg.inp_depth entries, a multiply-accumulate over the loaded words (one DSP-sized multiplier),
and a write-back of the sum. Enough logic that yosys maps a memory, a multiplier, LUTs and FFs.
"""
from __future__ import annotations

import json

from amaranth.back import verilog
from amaranth.hdl import Cat, Module, Signal
from amaranth.lib import memory, wiring
from amaranth.lib.wiring import In, Out

from accel.isa import AccelConfig


def _axi4(addr_width: int, data_width: int) -> dict:
    m = {}
    for ch in ("aw", "ar"):
        m.update({f"{ch}addr": Out(addr_width), f"{ch}len": Out(8), f"{ch}size": Out(3), f"{ch}burst": Out(2),
                  f"{ch}cache": Out(4), f"{ch}prot": Out(3), f"{ch}valid": Out(1), f"{ch}ready": In(1)})
    m.update({"wdata": Out(data_width), "wstrb": Out(data_width // 8), "wlast": Out(1), "wvalid": Out(1),
              "wready": In(1), "bresp": In(2), "bvalid": In(1), "bready": Out(1),
              "rdata": In(data_width), "rresp": In(2), "rlast": In(1), "rvalid": In(1), "rready": Out(1)})
    return m


def _axi4lite(addr_width: int) -> dict:
    return {"awaddr": Out(addr_width), "awvalid": Out(1), "awready": In(1), "wdata": Out(32), "wstrb": Out(4),
            "wvalid": Out(1), "wready": In(1), "bresp": In(2), "bvalid": In(1), "bready": Out(1),
            "araddr": Out(addr_width), "arvalid": Out(1), "arready": In(1), "rdata": In(32), "rresp": In(2),
            "rvalid": In(1), "rready": Out(1)}


REGISTERS = [
    {"name": "CTRL", "offset": 0x00, "access": "rw", "fields": {"start": 0}},
    {"name": "STATUS", "offset": 0x04, "access": "ro", "fields": {"done": 0}},
    {"name": "ADDR", "offset": 0x08, "access": "rw"},
    {"name": "COUNT", "offset": 0x0C, "access": "rw"},
    {"name": "RESULT", "offset": 0x10, "access": "ro"},
]


class StandIn(wiring.Component):
    def __init__(self, cfg: AccelConfig):
        self.cfg = cfg
        super().__init__({"mem": Out(wiring.Signature(_axi4(cfg.dram_addr_width, cfg.bus_width))),
                          "ctrl": In(wiring.Signature(_axi4lite(12))),
                          "irq": Out(1)})

    def elaborate(self, platform):
        m = Module()
        cfg, bus, c = self.cfg, self.mem, self.ctrl
        depth = min(cfg.inp_depth, 4096)
        m.submodules.buf = buf = memory.Memory(shape=cfg.bus_width, depth=depth, init=[])
        wp, rp = buf.write_port(), buf.read_port()

        start, done = Signal(), Signal()
        addr, count, result = Signal(32), Signal(16), Signal(32)
        # AXI-Lite: one write and one read at a time, answered the cycle after the handshake.
        with m.If(c.awvalid & c.wvalid & ~c.bvalid):
            m.d.comb += [c.awready.eq(1), c.wready.eq(1)]
            m.d.sync += c.bvalid.eq(1)
            with m.Switch(c.awaddr[2:5]):
                with m.Case(0):
                    m.d.sync += start.eq(c.wdata[0])
                with m.Case(2):
                    m.d.sync += addr.eq(c.wdata)
                with m.Case(3):
                    m.d.sync += count.eq(c.wdata)
        with m.If(c.bvalid & c.bready):
            m.d.sync += c.bvalid.eq(0)
        with m.If(c.arvalid & ~c.rvalid):
            m.d.comb += c.arready.eq(1)
            m.d.sync += c.rvalid.eq(1)
            with m.Switch(c.araddr[2:5]):
                with m.Case(1):
                    m.d.sync += c.rdata.eq(done)
                with m.Case(2):
                    m.d.sync += c.rdata.eq(addr)
                with m.Case(3):
                    m.d.sync += c.rdata.eq(count)
                with m.Case(4):
                    m.d.sync += c.rdata.eq(result)
        with m.If(c.rvalid & c.rready):
            m.d.sync += c.rvalid.eq(0)

        beat, idx = Signal(16), Signal(range(depth))
        acc = Signal(32)
        # Fold the whole word into 16 bits so every stored bit is used (yosys trims unread bits).
        mix = Signal(16)
        m.d.comb += mix.eq(rp.data[:16])
        for i in range(1, cfg.bus_width // 16):
            mix = mix ^ rp.data[16 * i:16 * (i + 1)]
        word = mix.as_signed()
        with m.FSM():
            with m.State("IDLE"):
                with m.If(start):
                    m.d.sync += [start.eq(0), done.eq(0), beat.eq(0), acc.eq(0)]
                    m.next = "AR"
            with m.State("AR"):
                m.d.comb += [bus.arvalid.eq(1), bus.araddr.eq(addr), bus.arlen.eq(count - 1)]
                with m.If(bus.arready):
                    m.next = "R"
            with m.State("R"):
                m.d.comb += [bus.rready.eq(1), wp.en.eq(bus.rvalid), wp.addr.eq(beat), wp.data.eq(bus.rdata)]
                with m.If(bus.rvalid):
                    m.d.sync += beat.eq(beat + 1)
                    with m.If(bus.rlast):
                        m.d.sync += idx.eq(0)
                        m.next = "MAC"
            with m.State("MAC"):
                m.d.comb += rp.addr.eq(idx)
                m.d.sync += [idx.eq(idx + 1), acc.eq(acc + word * word)]
                with m.If(idx == count[:len(idx)]):
                    m.next = "AW"
            with m.State("AW"):
                m.d.comb += [bus.awvalid.eq(1), bus.awaddr.eq(addr), bus.awlen.eq(0)]
                with m.If(bus.awready):
                    m.next = "W"
            with m.State("W"):
                m.d.comb += [bus.wvalid.eq(1), bus.wdata.eq(acc), bus.wstrb.eq(-1), bus.wlast.eq(1)]
                with m.If(bus.wready):
                    m.next = "B"
            with m.State("B"):
                m.d.comb += bus.bready.eq(1)
                with m.If(bus.bvalid):
                    m.d.sync += [done.eq(1), result.eq(acc)]
                    m.next = "IDLE"
        size = (cfg.bus_bytes - 1).bit_length()
        m.d.comb += [bus.arsize.eq(size), bus.awsize.eq(size), bus.arburst.eq(1), bus.awburst.eq(1),
                     bus.arcache.eq(0b0011), bus.awcache.eq(0b0011), self.irq.eq(done),
                     Cat(c.bresp, c.rresp).eq(0)]
        return m


def standin_verilog(cfg: AccelConfig, name: str = "accel_top") -> tuple[str, dict]:
    """(Verilog text, description JSON) of the stand-in, in the shape the generator writes."""
    text = verilog.convert(StandIn(cfg), name=name, emit_src=False)
    desc = {"top": name, "config": cfg.to_dict(), "registers": REGISTERS}
    return text, desc


if __name__ == "__main__":
    import sys

    from accel.isa import resolve_config
    text, desc = standin_verilog(resolve_config(sys.argv[1] if len(sys.argv) > 1 else "tiny"))
    print(text)
    print(json.dumps(desc), file=sys.stderr)
