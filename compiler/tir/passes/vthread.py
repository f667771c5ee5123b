"""LowerVirtualThread (placeholder)."""
from . import register_pass


@register_pass("LowerVirtualThread")
def LowerVirtualThread():
    return lambda func: func
