"""Dependency-token routing: which token queue each pop/push flag of an instruction talks to.

The stages are neighbours load <-> compute <-> store, with one token queue per direction (names
as in VTA): l2c (load -> compute), c2l, c2s, s2c. An instruction of stage S pops from the queue
its neighbour fills (pop_prev: prev -> S, pop_next: next -> S) and pushes to the queue towards
that neighbour (push_prev: S -> prev, push_next: S -> next). A flag naming a neighbour the stage
does not have (load has no prev, store no next) routes nowhere: fetch rejects it
(accel.hw.params.static_fault). Every executor and the command stream read this one table.
"""
from __future__ import annotations

from .errors import EncodingError
from .isa import DEP_FLAGS, Stage

#: the four token queues by (producer stage, consumer stage)
QUEUES: dict[tuple[Stage, Stage], str] = {
    (Stage.LOAD, Stage.COMPUTE): "l2c", (Stage.COMPUTE, Stage.LOAD): "c2l",
    (Stage.COMPUTE, Stage.STORE): "c2s", (Stage.STORE, Stage.COMPUTE): "s2c"}
QUEUE_NAMES: tuple[str, ...] = tuple(QUEUES.values())

PREV: dict[Stage, Stage] = {Stage.COMPUTE: Stage.LOAD, Stage.STORE: Stage.COMPUTE}
NEXT: dict[Stage, Stage] = {Stage.LOAD: Stage.COMPUTE, Stage.COMPUTE: Stage.STORE}


def token_queue(stage: Stage, flag: str) -> str | None:
    """The queue that `flag` (one of DEP_FLAGS) of a `stage` instruction pops or pushes, or None
    when the flag names a neighbour the stage does not have."""
    if flag not in DEP_FLAGS:
        raise EncodingError(f"dependency flag {flag!r} is not one of {', '.join(DEP_FLAGS)}")
    other = (PREV if flag.endswith("prev") else NEXT).get(Stage(stage))
    if other is None:
        return None
    return QUEUES[(other, stage)] if flag.startswith("pop") else QUEUES[(stage, other)]


#: per stage, {flag: queue} of the pop flags and of the push flags that route somewhere
POPS: dict[Stage, dict[str, str]] = {
    s: {f: q for f in ("pop_prev", "pop_next") if (q := token_queue(s, f)) is not None} for s in Stage}
PUSHES: dict[Stage, dict[str, str]] = {
    s: {f: q for f in ("push_prev", "push_next") if (q := token_queue(s, f)) is not None} for s in Stage}


def dead_flags(stage: Stage) -> tuple[str, ...]:
    """The flags of a `stage` instruction that name a missing neighbour (must stay clear)."""
    return tuple(f for f in DEP_FLAGS if token_queue(stage, f) is None)


def push_flag(frm: Stage, to: Stage) -> str:
    """The flag a `frm` instruction sets to hand a token to neighbour `to`."""
    return _flag(frm, to, "push", frm)


def pop_flag(frm: Stage, to: Stage) -> str:
    """The flag a `to` instruction sets to wait for a token from neighbour `frm`."""
    return _flag(frm, to, "pop", to)


def _flag(frm: Stage, to: Stage, kind: str, own: Stage) -> str:
    if (Stage(frm), Stage(to)) not in QUEUES:
        raise EncodingError(f"{Stage(frm).name.lower()} -> {Stage(to).name.lower()}: tokens only flow between "
                         f"neighbouring stages (load<->compute<->store)")
    other = to if own == frm else frm
    return f"{kind}_{'next' if NEXT.get(own) == other else 'prev'}"
