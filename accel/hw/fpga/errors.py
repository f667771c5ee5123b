"""Exceptions of the FPGA flow; each message names the board, part, port, tool or file at fault."""
from accel.isa.errors import AccelError


class FpgaError(AccelError, RuntimeError):
    """Base of the FPGA flow's errors."""


class PortError(FpgaError, ValueError):
    """The accelerator's top level lacks a port the board shell needs, or has one it cannot place."""


class ToolError(FpgaError):
    """An open-source tool (yosys, nextpnr, ecppack) is missing or failed; names the tool and its log."""


class RtlUnavailableError(FpgaError):
    """The accelerator's Verilog generator (accel.hw.verilog) cannot be imported or failed."""
