"""FPGA flow: Vivado project inputs for Zynq boards, open-tool synthesis reports (yosys,
nextpnr-ecp5), and a resource/clock estimate from the config alone.

vivado.py writes build directories; synth.py runs yosys/nextpnr/ecppack and parses their
reports; estimate.py models resources per module, calibrated by calibrate.py.
"""
from .errors import FpgaError, PortError, RtlUnavailableError, ToolError
from .ports import AxiInterface, Port, TopPorts, read_top_ports
from .rtl import RtlSource, family_config, make_rtl, rtl_for_config, rtl_from_files
from .vivado import BuildResult, lint_wrapper, write_project
