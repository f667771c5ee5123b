"""The race checker (sim.races) inside fsim: programs whose stages touch one buffer entry without a
dependency token between them fail with both instructions named; the same programs with the token
pass. fsim's own interleaving gives the right bytes either way, which is why the check exists."""
import numpy as np
import pytest

from accel.isa import PRESETS, Finish, Gemm, Load, MemType, Store, Uop, elem_bytes, encode_program, encode_uops
from sim.fsim import Fsim
from sim.races import RaceError

TINY = PRESETS["tiny"]
UOPS_AT = 1 << 12          # DRAM byte address of the one micro-op (acc 0, inp 0, wgt 0)


def _run(prog, check=True):
    dram = np.zeros(1 << 16, np.uint8)
    code = encode_program(prog, TINY).reshape(-1)
    dram[:code.size] = code
    u = encode_uops([Uop(0, 0, 0)], TINY)
    dram[UOPS_AT:UOPS_AT + u.size] = u
    return Fsim(TINY, check_races=check).run(dram, 0, len(prog))


def _load_uop(**flags):
    return Load(mem_type=MemType.UOP, sram_base=0, dram_base=UOPS_AT // elem_bytes(TINY, MemType.UOP), y_size=1,
                x_size=1, x_stride=1, **flags)


def _load_inp(**flags):
    return Load(mem_type=MemType.INP, sram_base=0, dram_base=0x100, y_size=1, x_size=1, x_stride=1, **flags)


def _gemm(**flags):
    return Gemm(uop_bgn=0, uop_end=1, iter_out=1, iter_in=1, **flags)


def _store(**flags):
    return Store(mem_type=MemType.OUT, sram_base=0, dram_base=0x200, y_size=1, x_size=1, x_stride=1, **flags)


def _load_stored(**flags):
    """A LOAD of the bytes _store writes."""
    at = 0x200 * elem_bytes(TINY, MemType.OUT) // elem_bytes(TINY, MemType.INP)
    return Load(mem_type=MemType.INP, sram_base=1, dram_base=at, y_size=1, x_size=1, x_stride=1, **flags)


# name -> (the program with its tokens, the program without them, what the report says); fsim alone
# runs both
CASES = {
    "compute reads a load it did not wait for": (
        [_load_uop(), _load_inp(push_next=True), _gemm(pop_prev=True), Finish()],
        [_load_uop(), _load_inp(), _gemm(), Finish()],
        r"inp buffer entry 0: instruction 2 \(GEMM, compute stage\) reads it, and instruction 1 \(LOAD INP, "
        r"load stage\) wrote it"),
    # the second LOAD reuses entry 0: without compute's token back it may land before the GEMM reads
    "a load overwrites what compute still reads": (
        [_load_uop(), _load_inp(push_next=True), _gemm(pop_prev=True, push_prev=True),
         _load_inp(pop_next=True, push_next=True), Finish(pop_prev=True)],
        [_load_uop(), _load_inp(push_next=True), _load_inp(), _gemm(pop_prev=True), Finish()],
        "inp buffer entry 0"),
    # unordered, fsim happens to run the store first, so the GEMM's write is the access reported
    "a store reads output compute did not hand over": (
        [_load_uop(), _load_inp(push_next=True), _gemm(pop_prev=True, push_next=True),
         _store(pop_prev=True, push_prev=True), Finish(pop_next=True)],
        [_load_uop(), _load_inp(push_next=True), _gemm(pop_prev=True), _store(push_prev=True), Finish(pop_next=True)],
        r"out buffer entry 0: instruction 2 \(GEMM, compute stage\) writes it, and instruction 3 \(STORE OUT, "
        r"store stage\) read it"),
    # DRAM: the load stage reads bytes the store stage writes; fsim runs the load first, so the store's
    # write is the access reported
    "a store overwrites DRAM a load of another stage reads": (
        [_load_uop(), _load_inp(push_next=True), _gemm(pop_prev=True, push_next=True),
         _store(pop_prev=True, push_prev=True), _gemm(pop_next=True, push_prev=True),
         _load_stored(pop_next=True, push_next=True), Finish(pop_prev=True)],
        [_load_uop(), _load_inp(push_next=True), _load_stored(), _gemm(pop_prev=True, push_next=True),
         _store(pop_prev=True, push_prev=True), Finish(pop_next=True)],
        r"DRAM byte 0x\w+: instruction 4 \(STORE OUT, store stage\) writes it, and instruction 2 \(LOAD INP, "
        r"load stage\) read it"),
}


@pytest.mark.parametrize("case", CASES)
def test_race_without_a_token_is_named_and_with_it_passes(case):
    ordered, unordered, match = CASES[case]
    _run(ordered)
    with pytest.raises(RaceError, match=match):
        _run(unordered)
    _run(unordered, check=False)
