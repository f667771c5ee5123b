"""Exceptions of the host runtime; each message names the buffer, stage, kernel or driver at fault."""
from accel.isa.errors import AccelError


class HostRuntimeError(AccelError, RuntimeError):
    """Base of the host runtime's errors."""


class OutOfMemoryError(HostRuntimeError, MemoryError):
    """A DRAM allocation does not fit: the message gives the size asked, the free bytes and the largest hole."""


class MemoryAccessError(HostRuntimeError, ValueError):
    """A buffer is used after free, written with data that does not fit, or addressed outside DRAM."""


class CommandError(HostRuntimeError, ValueError):
    """A command-stream call is invalid: an SRAM range, a loop bound, a padding or a dependency token."""


class DriverError(HostRuntimeError, LookupError):
    """An unknown driver name, or a driver that cannot start (the message says which and why)."""
