"""RTL simulation of the accelerator: Verilator/Icarus builds (runner.py), the cocotb testbench
(bench.py, tb_accel.py) and a host-side API to run programs on the RTL and get DRAM back.

    from sim.rtl import run_programs
    runs = run_programs(cfg, [RtlProgram("p0", dram, insn_addr, insn_count)], simulator="verilator")
    runs[0].dram, runs[0].counters["cycles"]
"""
from .runner import RtlError, RtlHang, RtlProgram, RtlRun, build, run_programs, simulators_available

__all__ = ["RtlError", "RtlHang", "RtlProgram", "RtlRun", "build", "run_programs", "simulators_available"]
