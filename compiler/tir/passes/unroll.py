"""UnrollLoops (placeholder)."""
from . import register_pass


@register_pass("UnrollLoops")
def UnrollLoops():
    return lambda func: func
