"""Drivers: one module per executor, each registering itself with host_runtime.device.register_driver.

fsim: the functional simulator (sim.fsim); tsim: the timing model (sim.tsim) with fsim's data;
rtl: the RTL under Verilator (sim.verilator). Later: board.
"""
