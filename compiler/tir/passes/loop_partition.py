"""PartitionLoops (placeholder)."""
from . import register_pass


@register_pass("PartitionLoops")
def PartitionLoops():
    return lambda func: func
