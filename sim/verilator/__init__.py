"""The accelerator's Verilog under Verilator with a C++ harness, loaded through ctypes (the `rtl` driver).

build.py compiles and caches the shared library; harness.cpp is the AXI4 DRAM model (sim/dram.py
timing), the AXI4-Lite master and the cycle loop; model.py is the Python front (VerilatorModel).
"""
