"""Lockstep co-simulation: the first instruction whose architectural effect differs between two
executors of one program.

An instruction's effect is what it changes: the buffer entries (inp, wgt, acc, out, uop) a
LOAD/GEMM/ALU writes, the DRAM bytes a STORE writes, the registers an EPILOGUE sets.
- Two steppable executors (RecordingFsim, or a subclass of it with an injected fault) each run the
  program once recording every instruction's effect; the effects are compared in program order
  (for a race-free program, program order is a valid order; the stages' own interleaving does not
  matter) and the first index whose effects differ is the divergence.
- An executor that cannot be single-stepped (the RTL in Verilator, the timing model, a board: any
  object with run(dram, insn_addr, insn_count)) runs prefixes instead: the first k+1 instructions,
  with the dependency-token pushes no instruction of the prefix pops dropped, then a synchronizing
  tail (EPILOGUE pushing to load and store, an empty LOAD and an empty STORE passing the tokens on,
  FINISH popping both) so that FINISH waits for every load and store of the prefix. Both executors
  run the same prefix from the same DRAM; k is bisected over the STOREs (DRAM changes only there)
  for the first prefix whose DRAM differs. Only DRAM is compared in this mode, so the divergence
  named is the first STORE that writes a differing byte; the steppable side's effect log then says
  which instruction last wrote the OUT entries that STORE read (the likely origin).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from accel.isa import AccelConfig, Alu, Epilogue, Finish, Gemm, Insn, Load, MemType, Store, encode_program
from accel.isa.asm import format_insn
from accel.isa.errors import AccelError
from accel.isa.isa import INSN_BYTES

from .errors import SimError
from .fsim import Fsim, token_queue

log = logging.getLogger(__name__)

#: differing entries (or DRAM bytes) listed per resource in a report
MOST = 8


class LockstepError(SimError):
    """Lockstep cannot compare the two executors (a prefix does not run, bad executor); names why."""


@dataclass
class Effect:
    """What one instruction changed: resource -> (entry indices or byte addresses, new values)."""
    index: int
    writes: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)


class RecordingFsim(Fsim):
    """The functional simulator, recording each executed instruction's effect in `effects`
    (instruction index -> Effect). Executes exactly as Fsim; the recording costs a copy of the
    buffer (or DRAM span) an instruction may write. Subclass and override _load/_gemm/_alu/_store
    to inject a fault (tests do)."""

    def __init__(self, cfg: AccelConfig, check_races: bool | None = False,
                 fault: Callable[[int, "RecordingFsim", np.ndarray], None] | None = None):
        """fault(index, sim, dram): called after each instruction executes, before its effect is
        taken, to model a broken executor (tests inject one this way)."""
        super().__init__(cfg, check_races)
        self.fault = fault
        self.effects: dict[int, Effect] = {}
        self._lockstep_nest = 0   # _in_chunks re-enters _gemm/_alu: record the outermost call only

    def _touched(self, insn) -> list[str]:
        if isinstance(insn, Load):
            return [{MemType.INP: "inp", MemType.WGT: "wgt", MemType.ACC: "acc", MemType.UOP: "uop"}.get(
                insn.mem_type, "out")]
        if isinstance(insn, (Gemm, Alu)):
            return ["acc", "out"]
        return []

    def _record(self, fn, idx: int, insn, dram: np.ndarray, stats) -> None:
        if self._lockstep_nest:
            return fn(idx, insn, dram, stats)
        names = self._touched(insn)
        before = {n: getattr(self, n).copy() for n in names}
        span = None
        if isinstance(insn, Store) and insn.y_size and insn.x_size:
            eb = self.cfg.out_elem_bytes
            lo = insn.dram_base * eb
            hi = min(dram.size, (insn.dram_base + (insn.y_size - 1) * insn.x_stride + insn.x_size) * eb)
            span = (lo, dram[lo:hi].copy()) if 0 <= lo < hi else None
        epi = self.epilogue
        self._lockstep_nest += 1
        try:
            fn(idx, insn, dram, stats)
            if self.fault is not None:
                self.fault(idx, self, dram)
        finally:
            self._lockstep_nest -= 1
        eff = Effect(idx)
        for n, old in before.items():
            new = getattr(self, n)
            rows = np.flatnonzero(np.any((old != new).reshape(old.shape[0], -1), axis=1))
            if rows.size:
                eff.writes[n] = (rows, new[rows].copy())
        if span is not None:
            lo, old = span
            new = dram[lo:lo + old.size]
            at = np.flatnonzero(old != new)
            if at.size:
                eff.writes["dram"] = (at + lo, new[at].copy())
        if isinstance(insn, Epilogue) and insn != epi:
            vals = np.array([insn.imm, insn.seed_base, insn.seed_factor_out, insn.seed_factor_in, int(insn.to_acc)],
                            np.int64)
            eff.writes["epilogue"] = (np.arange(5), vals)
        self.effects[idx] = eff

    def _load(self, idx, insn, dram, stats):
        return self._record(super()._load, idx, insn, dram, stats)

    def _store(self, idx, insn, dram, stats):
        return self._record(super()._store, idx, insn, dram, stats)

    def _gemm(self, idx, insn, dram, stats):
        return self._record(super()._gemm, idx, insn, dram, stats)

    def _alu(self, idx, insn, dram, stats):
        return self._record(super()._alu, idx, insn, dram, stats)

    def _set_epilogue(self, idx, insn, dram, stats):
        return self._record(super()._set_epilogue, idx, insn, dram, stats)


EPILOGUE_REGS = ("imm", "seed_base", "seed_factor_out", "seed_factor_in", "to_acc")


@dataclass
class Divergence:
    index: int
    insn: str                    # its disassembly
    lines: list[str]             # the differing entries, one per line
    origin: list[str] = field(default_factory=list)   # prefix mode: the instructions behind a STORE's data

    def to_dict(self) -> dict:
        return {"index": self.index, "insn": self.insn, "differences": self.lines, "origin": self.origin}


@dataclass
class LockstepResult:
    names: tuple[str, str]
    insn_count: int
    mode: str                    # "effects" or "prefix"
    divergence: Divergence | None
    runs: int = 1                # prefix runs per executor
    note: str = ""

    @property
    def diverged(self) -> bool:
        return self.divergence is not None

    def to_dict(self) -> dict:
        return {"executors": list(self.names), "insns": self.insn_count, "mode": self.mode, "runs": self.runs,
                "note": self.note, "divergence": None if self.divergence is None else self.divergence.to_dict()}

    def text(self) -> str:
        a, b = self.names
        if self.mode == "effects":
            how = "every instruction's buffer entries and DRAM bytes written compared"
        elif self.divergence is None:
            how = "the whole run's DRAM compared: an executor that cannot be single-stepped"
        else:
            how = f"prefixes bisected over the STOREs, DRAM compared: {self.runs} prefix runs each"
        if self.divergence is None:
            return f"lockstep {a}~{b}: {self.insn_count} instructions, no divergence ({how})"
        d = self.divergence
        out = [f"lockstep {a}~{b}: first divergence at instruction {d.index}: {d.insn}  ({how})"]
        out += [f"  {line}" for line in d.lines]
        out += [f"  {line}" for line in d.origin]
        if self.note:
            out.append(f"  note: {self.note}")
        return "\n".join(out)


def _fmt_vals(v: np.ndarray) -> str:
    flat = np.asarray(v).ravel()
    s = " ".join(str(int(x)) for x in flat[:16])
    return f"[{s}{' ...' if flat.size > 16 else ''}]"


def diff_effects(ea: Effect | None, eb: Effect | None, names: tuple[str, str], most: int = MOST) -> list[str]:
    """Lines naming each entry (or DRAM byte) written differently; [] when the effects agree."""
    wa = ea.writes if ea is not None else {}
    wb = eb.writes if eb is not None else {}
    lines = []
    for res in sorted(set(wa) | set(wb)):
        ia, va = wa.get(res, (np.zeros(0, np.int64), None))
        ib, vb = wb.get(res, (np.zeros(0, np.int64), None))
        da = {int(i): va[k] for k, i in enumerate(ia)}
        db = {int(i): vb[k] for k, i in enumerate(ib)}
        bad = sorted(i for i in set(da) | set(db) if i not in da or i not in db or not np.array_equal(da[i], db[i]))
        for i in bad[:most]:
            if res == "dram":
                where = f"dram[{i:#x}]"
            elif res == "epilogue":
                where = f"epilogue.{EPILOGUE_REGS[i]}"
            else:
                where = f"{res}[{i}]"
            sa = _fmt_vals(da[i]) if i in da else "(unchanged)"
            sb = _fmt_vals(db[i]) if i in db else "(unchanged)"
            lines.append(f"{where}: {names[0]} {sa}  {names[1]} {sb}")
        if len(bad) > most:
            lines.append(f"{res}: {len(bad) - most} more differing entries")
    return lines


def _effects_lockstep(insns: list[Insn], ea: dict[int, Effect], eb: dict[int, Effect],
                      names: tuple[str, str]) -> Divergence | None:
    for idx in range(len(insns)):
        if idx not in ea and idx not in eb:
            continue
        lines = diff_effects(ea.get(idx), eb.get(idx), names)
        if lines:
            return Divergence(idx, format_insn(insns[idx]), lines)
    return None


# ---- prefixes ------------------------------------------------------------------------------
_FLAGS = ("push_prev", "push_next")


def prefix_program(insns: list[Insn], k: int) -> list[Insn]:
    """Instructions 0..k with the token pushes nothing in them pops dropped, then a tail that makes
    FINISH wait for every load and store of the prefix (see the module doc)."""
    pre = [i for i in insns[:k + 1] if not isinstance(i, Finish)]
    pushes: dict[str, list[tuple[int, str]]] = {}
    pops: dict[str, int] = {}
    for j, ins in enumerate(pre):
        for flag in ("pop_prev", "pop_next"):
            if getattr(ins, flag):
                q = token_queue(ins.stage, flag)
                pops[q] = pops.get(q, 0) + 1
        for flag in _FLAGS:
            if getattr(ins, flag):
                q = token_queue(ins.stage, flag)
                pushes.setdefault(q, []).append((j, flag))
    for q, ps in pushes.items():
        extra = len(ps) - pops.get(q, 0)
        for j, flag in ps[len(ps) - extra:] if extra > 0 else []:
            pre[j] = pre[j].with_deps(**{flag: False})
    tail = [Epilogue(push_prev=True, push_next=True),
            Load(mem_type=MemType.INP, pop_next=True, push_next=True),
            Store(mem_type=MemType.OUT, pop_prev=True, push_prev=True),
            Finish(pop_prev=True, pop_next=True)]
    return pre + tail


def _run_prefix(make: Callable[[], Any], cfg: AccelConfig, insns: list[Insn], dram: np.ndarray,
                name: str) -> np.ndarray:
    """DRAM after running `insns` on a fresh executor; the code goes after the image's end."""
    code = encode_program(insns, cfg).reshape(-1)
    base = -(-dram.size // 64) * 64
    if base + code.size > 1 << cfg.dram_addr_width:
        raise LockstepError(f"no room for a prefix program after the {dram.size}-byte DRAM image within the "
                            f"{cfg.dram_addr_width}-bit DRAM address space")
    d = np.zeros(base + code.size, np.uint8)
    d[:dram.size] = dram
    d[base:] = code
    ex = make()
    try:
        ex.run(d, base, len(insns))
    except AccelError as e:   # the simulators' and the drivers' own errors: one line naming the executor
        raise LockstepError(f"executor {name!r} cannot run a prefix ({len(insns)} instructions): {e}") from None
    finally:
        close = getattr(ex, "close", None)
        if close is not None:
            close()
    return d[:dram.size]


def _store_entries(st: Store, byte_addrs: np.ndarray, eb: int) -> dict[int, int]:
    """DRAM byte address -> the OUT entry a STORE wrote there."""
    out = {}
    for b in byte_addrs:
        off = int(b) // eb - st.dram_base
        r = off // st.x_stride if st.x_stride else 0
        c = off - r * st.x_stride
        if 0 <= r < st.y_size and 0 <= c < st.x_size:
            out[int(b)] = st.sram_base + r * st.x_size + c
    return out


def _dram_lines(da: np.ndarray, db: np.ndarray, names: tuple[str, str], eb: int, st: Insn | None = None,
                most: int = MOST) -> list[str]:
    """The differing DRAM, one line per entry-sized chunk (naming the OUT entry a STORE wrote there)."""
    at = np.flatnonzero(da != db)
    chunks = sorted({int(i) // eb for i in at})
    entry = _store_entries(st, np.array([c * eb for c in chunks]), eb) if isinstance(st, Store) else {}
    lines = []
    for c in chunks[:most]:
        lo = c * eb
        what = f" (OUT entry {entry[lo]})" if lo in entry else ""
        lines.append(f"dram[{lo:#x}..{lo + eb - 1:#x}]{what}: {names[0]} {_fmt_vals(da[lo:lo + eb])}  "
                     f"{names[1]} {_fmt_vals(db[lo:lo + eb])}")
    if len(chunks) > most:
        lines.append(f"dram: {len(chunks) - most} more differing {eb}-byte entries")
    return lines


def _origin(insns: list[Insn], effects: dict[int, Effect], idx: int, byte_addrs: np.ndarray, eb: int) -> list[str]:
    """For STORE idx: the instructions that last wrote (in program order) the OUT entries behind
    the differing bytes."""
    st = insns[idx]
    if not isinstance(st, Store) or not effects:
        return []
    want = set(_store_entries(st, byte_addrs, eb).values())
    last: dict[int, int] = {}
    for j in sorted(i for i in effects if i < idx):
        w = effects[j].writes.get("out")
        if w is not None:
            for e in w[0]:
                if int(e) in want:
                    last[int(e)] = j
    writers = sorted(set(last.values()))
    if not writers and want:
        return [f"OUT entries {sorted(want)[:MOST]} were not changed by any earlier instruction"]
    return [f"the differing OUT entries were last changed by instruction {j}: {format_insn(insns[j])}"
            for j in writers[:4]]


def lockstep(cfg: AccelConfig, insns: list[Insn], dram: np.ndarray, insn_addr: int,
             make_a: Callable[[], Any], make_b: Callable[[], Any], names: tuple[str, str] = ("a", "b")
             ) -> LockstepResult:
    """Compare executors made by make_a() and make_b() on the program `insns` (encoded at insn_addr
    of `dram`, which is not modified). A RecordingFsim is stepped; anything else with
    run(dram, insn_addr, insn_count) runs prefixes (module doc)."""
    eb = cfg.out_elem_bytes
    a, b = make_a(), make_b()
    da, db = dram.copy(), dram.copy()
    for ex, d, name in ((a, da, names[0]), (b, db, names[1])):
        try:
            ex.run(d, insn_addr, len(insns))
        except AccelError as e:
            raise LockstepError(f"executor {name!r} cannot run the program: {e}") from None
        finally:
            close = getattr(ex, "close", None)
            if close is not None and not isinstance(ex, Fsim):
                close()
    rec_a, rec_b = isinstance(a, RecordingFsim), isinstance(b, RecordingFsim)
    if rec_a and rec_b:
        div = _effects_lockstep(insns, a.effects, b.effects, names)
        if div is None and not np.array_equal(da, db):   # a write outside what the effects cover
            div = Divergence(len(insns) - 1, format_insn(insns[-1]), _dram_lines(da, db, names, eb),
                             ["DRAM differs after the run although every instruction's recorded effect agrees"])
        return LockstepResult(names, len(insns), "effects", div)
    effects = a.effects if rec_a else (b.effects if rec_b else {})
    stores = [i for i, ins in enumerate(insns) if isinstance(ins, Store) and ins.y_size and ins.x_size]
    if np.array_equal(da, db):
        return LockstepResult(names, len(insns), "prefix", None, 0,
                              "buffer entries no STORE writes out are not compared in this mode")
    if not stores:
        return LockstepResult(names, len(insns), "prefix",
                              Divergence(len(insns) - 1, format_insn(insns[-1]), _dram_lines(da, db, names, eb),
                                         ["the program has no STORE, yet DRAM differs"]), 0)
    runs = 0
    seen: dict[int, tuple[bool, np.ndarray, np.ndarray]] = {}

    def differs(k: int) -> tuple[bool, np.ndarray, np.ndarray]:
        nonlocal runs
        if k not in seen:
            runs += 1
            p = prefix_program(insns, k)
            xa = _run_prefix(make_a, cfg, p, dram, names[0])
            xb = _run_prefix(make_b, cfg, p, dram, names[1])
            seen[k] = (not np.array_equal(xa, xb), xa, xb)
        return seen[k]

    lo, hi = 0, len(stores) - 1   # smallest store whose prefix differs (DRAM only changes at stores)
    while lo < hi:
        mid = (lo + hi) // 2
        if differs(stores[mid])[0]:
            hi = mid
        else:
            lo = mid + 1
    k = stores[lo]
    bad, xa, xb = differs(k)
    if not bad:   # every prefix agrees although the whole run does not
        return LockstepResult(names, len(insns), "prefix",
                              Divergence(len(insns) - 1, format_insn(insns[-1]), _dram_lines(da, db, names, eb),
                                         ["every prefix agrees; DRAM differs only after the whole program"]), runs)
    at = np.flatnonzero(xa != xb)
    div = Divergence(k, format_insn(insns[k]), _dram_lines(xa, xb, names, eb, insns[k]),
                     _origin(insns, effects, k, at, eb))
    return LockstepResult(names, len(insns), "prefix", div, runs,
                          "only DRAM is compared for an executor that cannot be single-stepped: the divergence is "
                          "the first STORE writing a differing byte")


def decode_at(dram: np.ndarray, insn_addr: int, insn_count: int, cfg: AccelConfig) -> list[Insn]:
    from accel.isa import decode_program
    end = insn_addr + insn_count * INSN_BYTES
    if insn_addr < 0 or end > dram.size:
        raise LockstepError(f"instruction stream [{insn_addr:#x}, {end:#x}) lies outside the {dram.size}-byte DRAM")
    return decode_program(dram[insn_addr:end].tobytes(), cfg)


__all__ = ["lockstep", "LockstepResult", "Divergence", "RecordingFsim", "prefix_program", "LockstepError",
           "Effect", "diff_effects", "decode_at"]
