"""Exceptions raised by the simulators; messages name the instruction index, field or queue."""
from accel.isa.errors import AccelError


class SimError(AccelError, RuntimeError):
    """A program cannot be executed."""


class ExecError(SimError):
    """An instruction is out of range: buffer index, DRAM address or micro-op range."""


class DeadlockError(SimError):
    """No stage can make progress: each blocked stage, its instruction and the queue it waits on."""


class CycleLimitError(SimError):
    """A simulation ran past its cycle or step limit."""


class ProgramFault(ExecError):
    """The program faults as the hardware reports it (accel.hw.params.ErrorCode in STATUS/ERROR):
    `code`, the faulting instruction's `index`, and the message naming it and the field."""

    def __init__(self, code, index: int, message: str):
        super().__init__(message)
        self.code, self.index = code, index
