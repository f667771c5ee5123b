"""The board and part table: every FPGA fact the kit uses, in one place.

`PARTS` holds device capacities (what a synthesis report is checked against) and how the open
tools address each device; `PROCESSING_SYSTEMS` holds the Zynq PS IP names, pins and CONFIG keys
the block design uses; `BOARDS` ties a part and a PS to a board's port widths, fabric-clock limit
and address map. Nothing else in the kit stores a part name, a capacity or a PS pin name.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from accel.isa.errors import AccelError


class BoardError(AccelError, ValueError):
    """An unknown board or part, or a configuration the board cannot host."""


# ---- parts ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Part:
    """One FPGA device and its capacities in the units its synthesis reports use.

    family: the yosys synth family ("xc7", "xcup" for Zynq UltraScale+, "ecp5").
    luts: logic LUTs (LUT6 on Xilinx, LUT4 on ECP5), including those usable as distributed RAM.
    ffs: flip-flops. dsps: DSP48E1/DSP48E2 slices, or MULT18X18D multipliers on ECP5.
    brams: block RAMs in the unit `bram_unit` names (36 Kb RAMB36 on Xilinx, 18 Kb DP16KD on ECP5).
    lutram_luts: LUTs that can be distributed RAM or shift registers (SLICEM on Xilinx).
    nextpnr: command-line flags that select the device in nextpnr (ECP5 only).
    """

    name: str
    family: str
    luts: int
    ffs: int
    dsps: int
    brams: int
    bram_unit: str
    lutram_luts: int
    nextpnr: tuple[str, ...] = ()
    aliases: tuple[str, ...] = ()

    @property
    def is_xilinx(self) -> bool:
        return self.family in ("xc7", "xcup")

    def capacity(self) -> dict[str, int]:
        """Capacities keyed like the synthesis report's utilization ("lut", "ff", "dsp", "bram")."""
        return {"lut": self.luts, "ff": self.ffs, "dsp": self.dsps, "bram": self.brams}


PARTS: dict[str, Part] = {p.name: p for p in (
    # Zynq-7000 (UG585, DS190). BRAM counted as RAMB36 (two RAMB18 each).
    Part("xc7z020clg400-1", "xc7", luts=53200, ffs=106400, dsps=220, brams=140, bram_unit="RAMB36",
         lutram_luts=17400, aliases=("xc7z020",)),
    Part("xc7z010clg400-1", "xc7", luts=17600, ffs=35200, dsps=80, brams=60, bram_unit="RAMB36",
         lutram_luts=6000, aliases=("xc7z010",)),
    # Artix-7 (DS180), for users synthesizing for a plain 7-series part.
    Part("xc7a35ticsg324-1L", "xc7", luts=20800, ffs=41600, dsps=90, brams=50, bram_unit="RAMB36",
         lutram_luts=9600, aliases=("xc7a35t",)),
    Part("xc7a100tcsg324-1", "xc7", luts=63400, ffs=126800, dsps=240, brams=135, bram_unit="RAMB36",
         lutram_luts=19000, aliases=("xc7a100t",)),
    # Zynq UltraScale+ (DS891). URAM not counted: yosys does not infer it for these buffers.
    Part("xczu3eg-sbva484-1-i", "xcup", luts=70560, ffs=141120, dsps=360, brams=216, bram_unit="RAMB36",
         lutram_luts=28800, aliases=("xczu3eg",)),
    Part("xczu7ev-ffvc1156-2-e", "xcup", luts=230400, ffs=460800, dsps=1728, brams=312, bram_unit="RAMB36",
         lutram_luts=101760, aliases=("xczu7ev",)),
    # Lattice ECP5 (FPGA-DS-02012): one slice = 2 LUT4 + 2 FF; EBR = DP16KD (18 Kb).
    Part("LFE5U-25F-6BG381C", "ecp5", luts=24288, ffs=24288, dsps=28, brams=56, bram_unit="DP16KD",
         lutram_luts=6072, nextpnr=("--25k", "--package", "CABGA381", "--speed", "6"), aliases=("LFE5U-25F", "25k")),
    Part("LFE5U-45F-6BG381C", "ecp5", luts=43848, ffs=43848, dsps=72, brams=108, bram_unit="DP16KD",
         lutram_luts=10962, nextpnr=("--45k", "--package", "CABGA381", "--speed", "6"), aliases=("LFE5U-45F", "45k")),
    Part("LFE5U-85F-6BG381C", "ecp5", luts=83640, ffs=83640, dsps=156, brams=208, bram_unit="DP16KD",
         lutram_luts=20910, nextpnr=("--85k", "--package", "CABGA381", "--speed", "6"), aliases=("LFE5U-85F", "85k")),
)}

DEFAULT_PART = {"xc7": "xc7z020clg400-1", "xcup": "xczu3eg-sbva484-1-i", "ecp5": "LFE5U-85F-6BG381C"}
"""The part `accel synth --family F` checks against when no --part is given."""


def part(name: str) -> Part:
    """Look a part up by full name or alias (case-insensitive)."""
    key = name.strip().lower()
    for p in PARTS.values():
        if key == p.name.lower() or key in (a.lower() for a in p.aliases):
            return p
    known = ", ".join(f"{p.name} ({'/'.join(p.aliases)})" if p.aliases else p.name for p in PARTS.values())
    raise BoardError(f"unknown part {name!r}; parts are {known}")


def default_part(family: str) -> Part:
    try:
        return PARTS[DEFAULT_PART[family]]
    except KeyError:
        raise BoardError(f"unknown FPGA family {family!r}; families are {', '.join(DEFAULT_PART)}") from None


# ---- Zynq processing systems --------------------------------------------------------------------
@dataclass(frozen=True)
class ProcessingSystem:
    """How the block design talks to one kind of Zynq PS IP.

    Pins and interfaces are the IP's names; `config_*` are its CONFIG.* property keys. `hp_seg` is
    the DDR address segment of the HP slave port, `gp_space` the PS address space the control
    registers are mapped into.
    """

    kind: str
    vlnv: str
    automation_rule: str
    clk_pin: str
    resetn_pin: str
    irq_pin: str
    hp_intf: str
    hp_aclk: str
    hp_seg: str
    gp_intf: str
    gp_aclk: str
    gp_space: str
    config_fclk_mhz: str
    config_hp_enable: str
    config_hp_width: str
    config_gp_enable: str
    config_irq: tuple[str, ...]
    config_fixed: dict[str, str] = field(default_factory=dict)
    gp_width_key: str = ""


PROCESSING_SYSTEMS: dict[str, ProcessingSystem] = {
    "ps7": ProcessingSystem(
        kind="ps7", vlnv="xilinx.com:ip:processing_system7:5.5",
        automation_rule="xilinx.com:bd_rule:processing_system7",
        clk_pin="FCLK_CLK0", resetn_pin="FCLK_RESET0_N", irq_pin="IRQ_F2P",
        hp_intf="S_AXI_HP0", hp_aclk="S_AXI_HP0_ACLK", hp_seg="S_AXI_HP0/HP0_DDR_LOWOCM",
        gp_intf="M_AXI_GP0", gp_aclk="M_AXI_GP0_ACLK", gp_space="Data",
        config_fclk_mhz="PCW_FPGA0_PERIPHERAL_FREQMHZ", config_hp_enable="PCW_USE_S_AXI_HP0",
        config_hp_width="PCW_S_AXI_HP0_DATA_WIDTH", config_gp_enable="PCW_USE_M_AXI_GP0",
        config_irq=("PCW_USE_FABRIC_INTERRUPT", "PCW_IRQ_F2P_INTR"),
        config_fixed={"PCW_EN_CLK0_PORT": "1", "PCW_EN_RST0_PORT": "1"}),
    "zynq_ultra_ps_e": ProcessingSystem(
        kind="zynq_ultra_ps_e", vlnv="xilinx.com:ip:zynq_ultra_ps_e:3.*",
        automation_rule="xilinx.com:bd_rule:zynq_ultra_ps_e",
        clk_pin="pl_clk0", resetn_pin="pl_resetn0", irq_pin="pl_ps_irq0",
        hp_intf="S_AXI_HP0_FPD", hp_aclk="saxihp0_fpd_aclk", hp_seg="SAXIGP2/HP0_DDR_LOW",
        gp_intf="M_AXI_HPM0_FPD", gp_aclk="maxihpm0_fpd_aclk", gp_space="Data",
        config_fclk_mhz="PSU__CRL_APB__PL0_REF_CTRL__FREQMHZ", config_hp_enable="PSU__USE__S_AXI_GP2",
        config_hp_width="PSU__SAXIGP2__DATA_WIDTH", config_gp_enable="PSU__USE__M_AXI_GP0",
        config_irq=("PSU__USE__IRQ0",),
        # HPM1 is on by default and would need its own clock; the kit uses HPM0 only.
        config_fixed={"PSU__FPGA_PL0_ENABLE": "1", "PSU__USE__M_AXI_GP1": "0", "PSU__USE__M_AXI_GP2": "0"},
        gp_width_key="PSU__MAXIGP0__DATA_WIDTH"),
}


# ---- boards -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Board:
    """A Zynq board the kit builds for.

    hp_widths: data widths the PS's high-performance slave port accepts (the widest is used when
    the accelerator's bus is at least that wide; a SmartConnect converts otherwise).
    hp_addr_width: address width of that port. max_fabric_mhz: the kit's upper limit for the
    PS-generated fabric clock on this board's speed grade. ctrl_base/ctrl_range: where the
    control registers appear in the PS address map (PYNQ's usual window). ddr_bytes: PS DDR size.
    """

    name: str
    description: str
    part_name: str
    board_part: str
    ps_kind: str
    hp_widths: tuple[int, ...]
    hp_addr_width: int
    gp_width: int
    max_fabric_mhz: float
    ctrl_base: int
    ctrl_range: int
    ddr_bytes: int
    pynq_name: str
    aliases: tuple[str, ...] = ()

    @property
    def part(self) -> Part:
        return PARTS[self.part_name]

    @property
    def ps(self) -> ProcessingSystem:
        return PROCESSING_SYSTEMS[self.ps_kind]

    @property
    def hp_width_max(self) -> int:
        return max(self.hp_widths)

    def hp_width_for(self, bus_width: int) -> int:
        """HP port width to configure for an accelerator bus of `bus_width` bits."""
        fitting = [w for w in self.hp_widths if w <= bus_width]
        return max(fitting) if fitting else min(self.hp_widths)

    def to_dict(self) -> dict:
        p = self.part
        return {"name": self.name, "description": self.description, "part": p.name, "family": p.family,
                "board_part": self.board_part, "ps": self.ps_kind, "hp_widths": list(self.hp_widths),
                "hp_addr_width": self.hp_addr_width, "gp_width": self.gp_width,
                "max_fabric_mhz": self.max_fabric_mhz, "ctrl_base": hex(self.ctrl_base),
                "ctrl_range": self.ctrl_range, "ddr_bytes": self.ddr_bytes, "capacity": p.capacity()}


BOARDS: dict[str, Board] = {b.name: b for b in (
    Board("pynq-z1", "Digilent PYNQ-Z1 (Zynq-7020)", "xc7z020clg400-1", "www.digilentinc.com:pynq-z1:part0:1.0",
          "ps7", hp_widths=(32, 64), hp_addr_width=32, gp_width=32, max_fabric_mhz=250.0,
          ctrl_base=0x43C0_0000, ctrl_range=0x1_0000, ddr_bytes=512 << 20, pynq_name="Pynq-Z1"),
    Board("ultra96", "Avnet Ultra96-V2 (Zynq UltraScale+ ZU3EG)", "xczu3eg-sbva484-1-i",
          "avnet.com:ultra96v2:part0:1.2", "zynq_ultra_ps_e", hp_widths=(32, 64, 128), hp_addr_width=49,
          gp_width=32, max_fabric_mhz=333.0, ctrl_base=0xA000_0000, ctrl_range=0x1_0000, ddr_bytes=2 << 30,
          pynq_name="Ultra96", aliases=("ultra96v2", "ultra96-v2")),
    Board("zcu104", "Xilinx ZCU104 (Zynq UltraScale+ ZU7EV)", "xczu7ev-ffvc1156-2-e", "xilinx.com:zcu104:part0:1.1",
          "zynq_ultra_ps_e", hp_widths=(32, 64, 128), hp_addr_width=49, gp_width=32, max_fabric_mhz=400.0,
          ctrl_base=0xA000_0000, ctrl_range=0x1_0000, ddr_bytes=2 << 30, pynq_name="ZCU104"),
)}


def board(name: str) -> Board:
    """Look a board up by name or alias (case-insensitive)."""
    key = name.strip().lower()
    for b in BOARDS.values():
        if key == b.name or key in b.aliases:
            return b
    raise BoardError(f"unknown board {name!r}; boards are {', '.join(BOARDS)}")


__all__ = ["BOARDS", "DEFAULT_PART", "PARTS", "PROCESSING_SYSTEMS", "Board", "BoardError", "Part",
           "ProcessingSystem", "board", "default_part", "part"]
