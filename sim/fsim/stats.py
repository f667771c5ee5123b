"""What a run of fsim did: instructions per kind and stage, micro-ops, MACs, bytes, leftover tokens."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class FsimStats:
    insns: dict[str, int] = field(default_factory=dict)
    per_stage: dict[str, int] = field(default_factory=dict)
    gemm_uops: int = 0
    macs: int = 0
    alu_uops: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    leftover_tokens: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict:
        """asdict's result (ints and dicts of ints, copied) without its recursive deep copy (60 us, a
        noticeable share of a small program's run)."""
        d = dict(self.__dict__)
        for k in ("insns", "per_stage", "leftover_tokens"):
            d[k] = dict(d[k])
        return d
