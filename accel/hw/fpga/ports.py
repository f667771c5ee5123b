"""The accelerator's top-level ports, read from its Verilog, grouped into the interfaces a board
shell connects: clock, reset, interrupt, an AXI4 memory master and an AXI4-Lite control slave.

Reading the Verilog (rather than trusting a naming scheme) keeps the shell correct whatever
prefix the generator gives each interface: `mem__awaddr`, `m_axi_awaddr` and `bus__aw__addr` all
resolve to the AWADDR of one interface. The grouping is by the AXI signal suffix at an `_`
boundary; the interface whose AWVALID is an output is the master.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from .errors import PortError

# AXI signals by channel, in the order the shell lists them. Longest names are matched first so
# that WVALID is never taken for the tail of AWVALID (matches must start at an `_` boundary anyway).
AXI4_SIGNALS = (
    "awid", "awaddr", "awlen", "awsize", "awburst", "awlock", "awcache", "awprot", "awqos", "awregion",
    "awuser", "awvalid", "awready",
    "wid", "wdata", "wstrb", "wlast", "wuser", "wvalid", "wready",
    "bid", "bresp", "buser", "bvalid", "bready",
    "arid", "araddr", "arlen", "arsize", "arburst", "arlock", "arcache", "arprot", "arqos", "arregion",
    "aruser", "arvalid", "arready",
    "rid", "rdata", "rresp", "rlast", "ruser", "rvalid", "rready",
)
_BY_LENGTH = sorted(AXI4_SIGNALS, key=len, reverse=True)
_REQUIRED = ("awaddr", "awvalid", "awready", "wdata", "wvalid", "wready", "bvalid", "bready",
             "araddr", "arvalid", "arready", "rdata", "rvalid", "rready")
# Signals a master drives (outputs of the master).
_MASTER_OUT = {s for s in AXI4_SIGNALS
               if (s.startswith(("aw", "w", "ar")) and not s.endswith("ready")) or s in ("bready", "rready")}

_CLOCK_NAMES = ("clk", "clock", "aclk", "ap_clk", "sync_clk")
_RESET_NAMES = {"rst": False, "reset": False, "sync_rst": False, "rst_n": True, "resetn": True,
                "aresetn": True, "ap_rst_n": True, "rstn": True}
_IRQ_NAMES = ("irq", "interrupt", "intr", "done", "irq_out")


@dataclass(frozen=True)
class Port:
    name: str
    direction: str  # "input" | "output" | "inout"
    width: int

    @property
    def is_input(self) -> bool:
        return self.direction == "input"


@dataclass
class AxiInterface:
    """One AXI4 or AXI4-Lite interface of the core: AXI signal name -> core port."""

    prefix: str
    signals: dict[str, Port] = field(default_factory=dict)

    @property
    def is_master(self) -> bool:
        return not self.signals["awvalid"].is_input

    @property
    def is_lite(self) -> bool:
        return "awlen" not in self.signals and "arlen" not in self.signals

    @property
    def data_width(self) -> int:
        return self.signals["wdata"].width

    @property
    def addr_width(self) -> int:
        return self.signals["awaddr"].width

    @property
    def id_width(self) -> int:
        p = self.signals.get("awid") or self.signals.get("arid")
        return p.width if p else 0

    @property
    def protocol(self) -> str:
        return "AXI4LITE" if self.is_lite else "AXI4"

    def ordered(self) -> list[tuple[str, Port]]:
        return [(s, self.signals[s]) for s in AXI4_SIGNALS if s in self.signals]


@dataclass
class TopPorts:
    """The core's top level, grouped for a board shell."""

    module: str
    ports: list[Port]
    clock: Port
    reset: Port | None
    reset_active_low: bool
    irq: Port | None
    mem: AxiInterface
    ctrl: AxiInterface
    other: list[Port]

    def to_dict(self) -> dict:
        def intf(i: AxiInterface) -> dict:
            return {"prefix": i.prefix, "protocol": i.protocol, "role": "master" if i.is_master else "slave",
                    "data_width": i.data_width, "addr_width": i.addr_width, "id_width": i.id_width,
                    "signals": {s: p.name for s, p in i.ordered()}}
        return {"module": self.module, "clock": self.clock.name,
                "reset": self.reset.name if self.reset else None, "reset_active_low": self.reset_active_low,
                "irq": self.irq.name if self.irq else None, "mem": intf(self.mem), "ctrl": intf(self.ctrl),
                "other": [{"name": p.name, "direction": p.direction, "width": p.width} for p in self.other]}


# ---- Verilog parsing ------------------------------------------------------------------------
_COMMENTS = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)
_ATTRS = re.compile(r"\(\*.*?\*\)", re.S)
_MODULE = re.compile(r"\bmodule\s+(\\\S+|[A-Za-z_][\w$]*)\s*(#\s*\(.*?\)\s*)?\((.*?)\)\s*;(.*?)\bendmodule\b", re.S)
_DECL = re.compile(r"\b(input|output|inout)\b\s*(?:wire|reg|logic)?\s*(?:signed\s*)?(\[\s*(-?\d+)\s*:\s*(-?\d+)\s*\])?"
                   r"\s*([^;]*?)\s*;", re.S)
_ANSI = re.compile(r"\b(input|output|inout)\b\s*(?:wire|reg|logic)?\s*(?:signed\s*)?(\[\s*(-?\d+)\s*:\s*(-?\d+)\s*\])?"
                   r"\s*(\\\S+|[A-Za-z_][\w$]*)")


def _strip(text: str) -> str:
    return _ATTRS.sub(" ", _COMMENTS.sub(" ", text))


def verilog_modules(text: str) -> list[str]:
    """Names of the modules a Verilog file defines, in order."""
    return [m.group(1) for m in _MODULE.finditer(_strip(text))]


def parse_ports(text: str, module: str | None = None) -> tuple[str, list[Port]]:
    """(module name, ports in header order) of `module`, or of the file's top module.

    The top module is the one marked `(* top = 1 *)` (yosys/Amaranth output), else the one no
    other module instantiates, else the last one.
    """
    if module is None:
        m = re.search(r"\(\*[^*]*\btop\s*=\s*(?:1|32'd1)[^*]*\*\)\s*(?:\(\*.*?\*\)\s*)*module\s+(\\\S+|[\w$]+)", text, re.S)
        if m:
            module = m.group(1)
    body = _strip(text)
    found = {mm.group(1): mm for mm in _MODULE.finditer(body)}
    if not found:
        raise PortError("no Verilog module found in the accelerator's source")
    if module is None:
        names = list(found)
        uninstantiated = [n for n in names if not any(re.search(rf"(^|\s){re.escape(n)}\s+[\\\w$]", found[o].group(4))
                                                    for o in names if o != n)]
        module = (uninstantiated or names)[-1]
    if module not in found:
        raise PortError(f"module {module!r} not found; the file defines {', '.join(found)}")
    mm = found[module]
    header, mbody = mm.group(3), mm.group(4)
    ports: dict[str, Port] = {}
    if re.search(r"\b(input|output|inout)\b", header):  # ANSI style
        for d in _ANSI.finditer(header):
            w = abs(int(d.group(3)) - int(d.group(4))) + 1 if d.group(2) else 1
            ports[d.group(5)] = Port(d.group(5), d.group(1), w)
        order = list(ports)
    else:
        order = [n.strip() for n in header.split(",") if n.strip()]
        for d in _DECL.finditer(mbody):
            w = abs(int(d.group(3)) - int(d.group(4))) + 1 if d.group(2) else 1
            for n in d.group(5).split(","):
                n = n.strip().split("=")[0].strip()
                if n:
                    ports[n] = Port(n, d.group(1), w)
    missing = [n for n in order if n not in ports]
    if missing:
        raise PortError(f"module {module}: no direction declared for port(s) {', '.join(missing)}")
    return module, [ports[n] for n in order]


# ---- grouping -------------------------------------------------------------------------------
def _axi_split(name: str) -> tuple[str, str] | None:
    """('prefix', 'awaddr') if `name` ends in an AXI signal at an `_` boundary (or is one)."""
    low = name.lower()
    squashed = low.replace("_", "")
    for sig in _BY_LENGTH:
        if not squashed.endswith(sig):
            continue
        # Find where the signal starts in the original name (underscores may split it, e.g. aw__addr).
        count, i = len(sig), len(low)
        while count and i:
            i -= 1
            if low[i] != "_":
                count -= 1
        prefix = name[:i]
        if prefix == "" or prefix.endswith("_"):
            return prefix, sig
    return None


def group_ports(module: str, ports: list[Port]) -> TopPorts:
    """Find clock, reset, interrupt and the two AXI interfaces among `ports`."""
    groups: dict[str, AxiInterface] = {}
    rest: list[Port] = []
    for p in ports:
        hit = _axi_split(p.name)
        if hit:
            groups.setdefault(hit[0], AxiInterface(hit[0])).signals[hit[1]] = p
        else:
            rest.append(p)
    complete = {}
    for prefix, g in groups.items():
        if all(s in g.signals for s in _REQUIRED):
            complete[prefix] = g
        else:  # a partial match is an ordinary port that happens to end like an AXI signal
            rest.extend(g.signals.values())
    masters = [g for g in complete.values() if g.is_master]
    slaves = [g for g in complete.values() if not g.is_master]
    desc = ", ".join(f"{p.direction} {p.name}[{p.width}]" for p in ports)
    if len(masters) != 1:
        raise PortError(f"module {module}: expected one AXI4 master port group for memory, found "
                        f"{len(masters)} ({', '.join(g.prefix + '*' for g in masters) or 'none'}); ports: {desc}")
    if len(slaves) != 1:
        raise PortError(f"module {module}: expected one AXI4-Lite slave port group for the control registers, "
                        f"found {len(slaves)} ({', '.join(g.prefix + '*' for g in slaves) or 'none'}); ports: {desc}")
    mem, ctrl = masters[0], slaves[0]
    for g, role in ((mem, "master"), (ctrl, "slave")):
        for s, p in g.signals.items():
            want_out = (s in _MASTER_OUT) == (role == "master")
            if p.is_input == want_out:
                raise PortError(f"module {module}: port {p.name} ({p.direction}) has the wrong direction for "
                                f"{s.upper()} of an AXI {role}")
    if ctrl.data_width != 32:
        raise PortError(f"module {module}: control interface {ctrl.prefix}* is {ctrl.data_width} bits wide; "
                        f"the Zynq general-purpose port carries 32-bit AXI4-Lite")

    def pick(names, direction):
        for n in names:
            for p in rest:
                if p.name.lower() == n and p.direction == direction and p.width == 1:
                    return p
        return None

    clock = pick(_CLOCK_NAMES, "input")
    if clock is None:
        raise PortError(f"module {module}: no clock input (looked for {', '.join(_CLOCK_NAMES)}); ports: {desc}")
    reset = pick(_RESET_NAMES, "input")
    irq = pick(_IRQ_NAMES, "output")
    other = [p for p in rest if p not in (clock, reset, irq)]
    unconnectable = [p for p in other if p.is_input]
    if unconnectable:
        raise PortError(f"module {module}: input port(s) {', '.join(p.name for p in unconnectable)} belong to no "
                        f"interface the board shell drives (clock, reset, AXI master, AXI-Lite slave)")
    return TopPorts(module=module, ports=ports, clock=clock, reset=reset,
                    reset_active_low=bool(reset and _RESET_NAMES[reset.name.lower()]), irq=irq,
                    mem=mem, ctrl=ctrl, other=other)


def read_top_ports(verilog: str, module: str | None = None) -> TopPorts:
    name, ports = parse_ports(verilog, module)
    return group_ports(name, ports)
