"""Host runtime: device DRAM, command streams (how software talks to the accelerator), drivers.

    dev = Device(cfg, driver="fsim")
    a = dev.memory.alloc_array(x)                 # DRAM buffers with physical addresses
    s = dev.stream()                              # LOAD/STORE, micro-op kernels, GEMM/ALU, tokens
    ...; result = s.synchronize()                 # FINISH, encode into DRAM, run on the driver
"""
from .commands import CommandStream, KernelBuilder, UopKernel
from .device import Device, Driver, RunResult, available_drivers, get_driver, register_driver
from .errors import CommandError, DriverError, HostRuntimeError, MemoryAccessError, OutOfMemoryError
from .memory import Buffer, DeviceMemory

__all__ = [n for n in dir() if not n.startswith("_")]
