"""The virtual-thread token protocol shared by every accelerator operator.

Work is a sequence of load iterations j (one input chunk each) grouped into output tiles.
With S slots (virtual threads) the load of iteration j reuses the slot of j - S, so it waits
for compute to release that slot; compute waits for its loads, and before it starts a tile it
waits for the store of tile ti - S to have drained the accumulator/output slot it reuses.
Tokens are pushed only when a later instruction will pop them, so every queue ends empty.
"""
from __future__ import annotations

from accel.isa import Stage


class TokenPipeline:
    def __init__(self, stream, slots: int, n_loads: int, n_tiles: int):
        self.s, self.slots, self.n_loads, self.n_tiles = stream, slots, n_loads, n_tiles

    def before_load(self, j: int) -> None:
        if j >= self.slots:
            self.s.dep_pop(Stage.COMPUTE, Stage.LOAD)

    def after_load(self) -> None:
        self.s.dep_push(Stage.LOAD, Stage.COMPUTE)

    def before_compute(self) -> None:
        self.s.dep_pop(Stage.LOAD, Stage.COMPUTE)

    def before_tile(self, ti: int) -> None:
        if ti >= self.slots:
            self.s.dep_pop(Stage.STORE, Stage.COMPUTE)

    def after_chunk(self, j: int) -> None:
        if j + self.slots < self.n_loads:
            self.s.dep_push(Stage.COMPUTE, Stage.LOAD)

    def after_tile(self) -> None:
        self.s.dep_push(Stage.COMPUTE, Stage.STORE)

    def before_store(self) -> None:
        self.s.dep_pop(Stage.COMPUTE, Stage.STORE)

    def after_store(self, ti: int) -> None:
        if ti + self.slots < self.n_tiles:
            self.s.dep_push(Stage.STORE, Stage.COMPUTE)
