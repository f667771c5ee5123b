"""The accelerator's RTL in Amaranth 0.5: one wiring.Component per unit, wired in top.py.

    fetch.py   instruction fetch and dispatch      load.py    load stage (2-D DMA with padding)
    compute.py compute stage (uop loops, loads)    gemm.py    GEMM core     alu.py  tensor ALU
    store.py   store stage                         queues.py  command / token queues
    stage.py   instruction sequencing with tokens  dma.py     burst reader
    axi.py     AXI4 master and interfaces          regs.py    AXI4-Lite registers and counters
    verilog.py Verilog generation (`accel verilog`)

Importing this package does not import Amaranth; `Accelerator` loads on first use.
"""


def __getattr__(name):
    if name == "Accelerator":
        from .top import Accelerator  # noqa: PLC0415 - amaranth loads only when the RTL is used
        return Accelerator
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
