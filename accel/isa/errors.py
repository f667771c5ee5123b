"""Exceptions of accel.isa; each message names the key, field or instruction at fault."""


class AccelError(Exception):
    """Base of every error the kit raises on purpose."""


class ConfigError(AccelError, ValueError):
    """An AccelConfig key is missing, unknown, or outside its allowed range."""


class EncodingError(AccelError, ValueError):
    """An instruction or micro-op field does not fit its width, or a binary word is malformed."""


class AsmError(AccelError, ValueError):
    """A line of assembly text cannot be parsed; the message gives the line number."""


class ProgramFormatError(AccelError, ValueError):
    """A program file is malformed, of another format version, or built for another config."""


class LayoutError(AccelError, ValueError):
    """A tensor cannot be packed to (or unpacked from) a blocked layout: wrong rank, shape or block."""


class OperandError(EncodingError):
    """An ALU operand (immediate or register lane value) is outside the range its op can encode."""
