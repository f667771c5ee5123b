"""AXI4 master for DRAM: one read arbiter for the read clients (fetch, load, compute) and the
write channel of the store stage.

Interfaces: `rd[i]` (ReadClientSignature, flipped) per read client, `wr` (WriteClientSignature,
flipped), `bus` (AXI4Signature). Reads: up to cfg.read_outstanding bursts in flight on the bus
(all clients together; a burst counts from its AR handshake to its RLAST beat, and its slot is
free from the cycle after). While a slot is free the arbiter grants, combinationally, the first
client requesting AR in round-robin order after the client granted last (order 0, 1, 2, ... =
fetch, load, compute); an AR offered and not accepted (ARREADY low) keeps its client's grant (a
registered hold), so ARID/ARADDR/ARLEN stay stable while ARVALID is high, as AXI requires (clients
never withdraw a request). Every read carries the same ARID (READ_ID) and every write the same AWID (WRITE_ID): AXI
(A5.3) returns transactions of one ID in issue order, so R beats are routed to the clients in AR
order by a FIFO of grants, which no interconnect may reorder. (With one ID per client an
interconnect may return different IDs' bursts in any order.) Writes pass straight through (the store is the only writer), with
at most cfg.write_outstanding bursts awaiting their B: AWVALID waits for a free slot.
All bursts are INCR with full-width beats (ARSIZE/AWSIZE = log2(bus bytes)). bus_error flags a
response other than OKAY or with an ID other than the one issued.
Quiescing (before the core is reset by start or SOFT_RESET): while `quiesce` is high no new AR or
AW is offered, but one already offered stays until taken (AXI A3.2.1), every read burst in
flight takes all its beats (rready high once its client is gone) and every write burst its B;
`idle` says that nothing is offered or in flight, so the core can be reset without breaking a
transaction. The master itself is never reset mid-run for that reason.
"""
from __future__ import annotations

from amaranth.hdl import Array, Const, Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from accel.isa import AccelConfig

AXI_BURST_INCR = 0b01
AXI_CACHE_NORMAL = 0b0011  # normal non-cacheable bufferable: what Xilinx HP ports expect
AXI_RESP_OKAY = 0b00
ID_WIDTH = 1                 # one ID per direction: in-order responses (see the module docstring)
READ_ID = 0
WRITE_ID = 0


class AXI4Signature(wiring.Signature):
    """Full AXI4 master port without user/QoS/region signals.

    AW/AR: id, addr, len (beats - 1), size, burst, lock, cache, prot, valid (Out), ready (In).
    W: data, strb, last, valid (Out), ready (In). B: id, resp, valid (In), ready (Out).
    R: id, data, resp, last, valid (In), ready (Out).
    """

    def __init__(self, *, addr_width: int, data_width: int, id_width: int = ID_WIDTH):
        self.addr_width, self.data_width, self.id_width = addr_width, data_width, id_width
        members = {}
        for ch in ("aw", "ar"):
            members.update({f"{ch}id": Out(id_width), f"{ch}addr": Out(addr_width), f"{ch}len": Out(8), f"{ch}size": Out(3),
                            f"{ch}burst": Out(2), f"{ch}lock": Out(1), f"{ch}cache": Out(4), f"{ch}prot": Out(3),
                            f"{ch}valid": Out(1), f"{ch}ready": In(1)})
            if ch == "aw":
                members.update({"wdata": Out(data_width), "wstrb": Out(data_width // 8), "wlast": Out(1),
                                "wvalid": Out(1), "wready": In(1),
                                "bid": In(id_width), "bresp": In(2), "bvalid": In(1), "bready": Out(1)})
        members.update({"rid": In(id_width), "rdata": In(data_width), "rresp": In(2), "rlast": In(1), "rvalid": In(1),
                        "rready": Out(1)})
        super().__init__(members)


class AXI4LiteSignature(wiring.Signature):
    """AXI4-Lite master port (32-bit data); a slave uses it flipped (In(...))."""

    def __init__(self, *, addr_width: int, data_width: int = 32):
        self.addr_width, self.data_width = addr_width, data_width
        super().__init__({
            "awaddr": Out(addr_width), "awvalid": Out(1), "awready": In(1),
            "wdata": Out(data_width), "wstrb": Out(data_width // 8), "wvalid": Out(1), "wready": In(1),
            "bresp": In(2), "bvalid": In(1), "bready": Out(1),
            "araddr": Out(addr_width), "arvalid": Out(1), "arready": In(1),
            "rdata": In(data_width), "rresp": In(2), "rvalid": In(1), "rready": Out(1)})


class ReadClientSignature(wiring.Signature):
    """A DMA's read port, client view: AR request (addr, len = beats - 1) and the R beats of it."""

    def __init__(self, cfg: AccelConfig):
        super().__init__({"ar_valid": Out(1), "ar_addr": Out(cfg.dram_addr_width), "ar_len": Out(8),
                          "ar_ready": In(1),
                          "r_valid": In(1), "r_data": In(cfg.bus_width), "r_last": In(1), "r_ready": Out(1)})


class WriteClientSignature(wiring.Signature):
    """The store's write port, client view: AW request, W beats, B responses."""

    def __init__(self, cfg: AccelConfig):
        super().__init__({"aw_valid": Out(1), "aw_addr": Out(cfg.dram_addr_width), "aw_len": Out(8),
                          "aw_ready": In(1),
                          "w_valid": Out(1), "w_data": Out(cfg.bus_width), "w_strb": Out(cfg.bus_bytes),
                          "w_last": Out(1), "w_ready": In(1),
                          "b_valid": In(1), "b_ready": Out(1)})


class AxiMaster(wiring.Component):
    """Read arbiter and write pass-through onto one AXI4 master port.

    rd[i]: read clients (In = flipped client view); wr: the write client; bus: AXI4 master.
    rd_beat / wr_beat: one cycle per R / W beat transferred (for the byte counters);
    rd_idle: no read burst in flight; bus_error: a beat or response with RRESP/BRESP != OKAY.
    quiesce (In): offer no new burst and take every R and B beat (the clients are about to be
    reset); idle (Out): no burst offered or open.
    """

    def __init__(self, cfg: AccelConfig, n_read: int = 3):
        self.cfg, self.n_read = cfg, n_read
        super().__init__({
            "rd": In(ReadClientSignature(cfg)).array(n_read),
            "wr": In(WriteClientSignature(cfg)),
            "bus": Out(AXI4Signature(addr_width=cfg.dram_addr_width, data_width=cfg.bus_width)),
            "rd_beat": Out(1), "wr_beat": Out(1), "rd_idle": Out(1), "bus_error": Out(1),
            "quiesce": In(1), "idle": Out(1)})

    def elaborate(self, platform):
        m = Module()
        cfg, n, bus = self.cfg, self.n_read, self.bus
        size = Const((cfg.bus_bytes - 1).bit_length(), 3)
        max_rd = cfg.read_outstanding

        inflight = Signal(range(max_rd + 1))  # read bursts whose AR was taken and whose RLAST has not come
        last = Signal(range(n), init=n - 1)   # client granted last (round-robin pointer)
        grant = Signal(range(n))
        any_req = Signal()
        hold = Signal()                   # an AR was offered last cycle and not accepted
        held = Signal(range(n))           # its client

        # Round robin: for each value of `last`, a fixed priority list; later If's override
        # earlier ones, so walk the list backwards. A pending AR keeps its grant.
        with m.If(hold):
            m.d.comb += [grant.eq(held), any_req.eq(1)]
        with m.Else():
            with m.Switch(last):
                for lst in range(n):
                    with m.Case(lst):
                        for c in reversed([(lst + k) % n for k in range(1, n + 1)]):
                            with m.If(self.rd[c].ar_valid):
                                m.d.comb += [grant.eq(c), any_req.eq(1)]
        m.d.sync += [hold.eq(bus.arvalid & ~bus.arready), held.eq(grant)]

        ar_offered = Signal()             # AR shown and not yet taken: it must stay
        m.d.sync += ar_offered.eq(bus.arvalid & ~bus.arready)
        # a free slot: inflight only falls while an AR waits, so an offered AR keeps its slot
        m.d.comb += [bus.arvalid.eq(any_req & (inflight < max_rd) & (~self.quiesce | ar_offered)),
                     bus.arid.eq(READ_ID), bus.arsize.eq(size), bus.arburst.eq(AXI_BURST_INCR),
                     bus.arcache.eq(AXI_CACHE_NORMAL), bus.arlock.eq(0), bus.arprot.eq(0)]
        with m.Switch(grant):
            for c in range(n):
                with m.Case(c):
                    m.d.comb += [bus.araddr.eq(self.rd[c].ar_addr), bus.arlen.eq(self.rd[c].ar_len),
                                 self.rd[c].ar_ready.eq(bus.arready & bus.arvalid)]
        ar_fire = bus.arvalid & bus.arready
        with m.If(ar_fire):
            m.d.sync += last.eq(grant)
        with m.If(self.quiesce & self.idle):     # the core's reset cycle: every run arbitrates alike
            m.d.sync += last.eq(n - 1)

        # Bursts of one ID come back in AR order: a FIFO of the granted clients names the owner of
        # the R beats (registers only, so RREADY never depends combinationally on a bus input).
        order = Array(Signal(range(n), name=f"rd_order{i}") for i in range(max_rd))
        o_wr, o_rd = Signal(range(max_rd)), Signal(range(max_rd))
        owner = Signal(range(n))
        m.d.comb += owner.eq(order[o_rd])
        for c in range(n):
            m.d.comb += [self.rd[c].r_valid.eq(bus.rvalid & (inflight != 0) & (owner == c)),
                         self.rd[c].r_data.eq(bus.rdata), self.rd[c].r_last.eq(bus.rlast)]
        with m.Switch(owner):
            for c in range(n):
                with m.Case(c):
                    m.d.comb += bus.rready.eq((inflight != 0) & (self.rd[c].r_ready | self.quiesce))
        r_fire = bus.rvalid & bus.rready
        r_done = r_fire & bus.rlast
        m.d.sync += inflight.eq(inflight + ar_fire - r_done)
        with m.If(ar_fire):
            m.d.sync += [order[o_wr].eq(grant), o_wr.eq(Mux(o_wr == max_rd - 1, 0, o_wr + 1))]
        with m.If(r_done):
            m.d.sync += o_rd.eq(Mux(o_rd == max_rd - 1, 0, o_rd + 1))

        wr = self.wr
        aw_offered = Signal()
        m.d.sync += aw_offered.eq(bus.awvalid & ~bus.awready)
        open_writes = Signal(range(cfg.write_outstanding + 1))   # AW taken, B not yet come
        m.d.sync += open_writes.eq(open_writes + (bus.awvalid & bus.awready) - (bus.bvalid & bus.bready))
        m.d.comb += [bus.awvalid.eq(wr.aw_valid & (open_writes < cfg.write_outstanding) & (~self.quiesce | aw_offered)), bus.awid.eq(WRITE_ID), bus.awaddr.eq(wr.aw_addr), bus.awlen.eq(wr.aw_len),
                     bus.awsize.eq(size), bus.awburst.eq(AXI_BURST_INCR), bus.awcache.eq(AXI_CACHE_NORMAL),
                     bus.awlock.eq(0), bus.awprot.eq(0), wr.aw_ready.eq(bus.awready & bus.awvalid),
                     bus.wvalid.eq(wr.w_valid), bus.wdata.eq(wr.w_data), bus.wstrb.eq(wr.w_strb),
                     bus.wlast.eq(wr.w_last), wr.w_ready.eq(bus.wready),
                     wr.b_valid.eq(bus.bvalid), bus.bready.eq(wr.b_ready | self.quiesce)]

        w_fire = bus.wvalid & bus.wready
        m.d.comb += self.idle.eq((inflight == 0) & ~bus.arvalid & ~bus.awvalid & (open_writes == 0))
        m.d.comb += [self.rd_beat.eq(r_fire), self.wr_beat.eq(w_fire), self.rd_idle.eq(inflight == 0),
                     self.bus_error.eq((r_fire & ((bus.rresp != AXI_RESP_OKAY) | (bus.rid != READ_ID))) |
                                       (bus.bvalid & bus.bready & ((bus.bresp != AXI_RESP_OKAY) |
                                                                   (bus.bid != WRITE_ID))))]
        return m
