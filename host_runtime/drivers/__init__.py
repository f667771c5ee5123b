"""Drivers: one module per executor, each registering itself with host_runtime.device.register_driver.

fsim: the functional simulator (sim.fsim). Later: tsim (timing model), rtl (Verilator), board.
"""
