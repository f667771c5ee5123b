"""VectorizeLoops (placeholder)."""
from . import register_pass


@register_pass("VectorizeLoops")
def VectorizeLoops():
    return lambda func: func
