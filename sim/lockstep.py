"""Lockstep co-simulation: the first instruction whose architectural effect differs between two
executors of one program.

An instruction's effect is what it changes: the buffer entries (inp, wgt, acc, out, uop) a
LOAD/GEMM/ALU writes, the DRAM bytes a STORE writes, the registers an EPILOGUE sets.
- Two steppable executors (RecordingFsim, or a subclass of it with an injected fault) each run the
  program once recording every instruction's effect; the effects are compared in program order
  (for a race-free program, program order is a valid order; the stages' own interleaving does not
  matter) and the first index whose effects differ is the divergence.
- An executor that cannot be single-stepped (the RTL in Verilator, the timing model, a board: any
  object with run(dram, insn_addr, insn_count)) runs the whole program, then prefixes: the first
  k+1 instructions, with the dependency-token pushes no instruction of the prefix pops dropped, then
  a tail that waits for every load and store of the prefix (EPILOGUE pushing to both neighbours, an
  empty LOAD passing the token on), stores the whole OUT buffer, runs one ALU pass adding 0 to
  every accumulator (which writes out = narrow(acc)), stores OUT again and ends with FINISH.
  Both executors run the same prefix from the same DRAM, and DRAM plus the two buffer dumps are
  compared; k is bisected for the first prefix that differs (the last prefix is always run, so
  buffer state no STORE writes out is compared too). Input, weight and micro-op entries are seen
  only through the GEMMs that use them; the accumulators only in their low out_width bits.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from accel.isa import (
    AccelConfig,
    Alu,
    AluOp,
    Epilogue,
    Finish,
    Gemm,
    Insn,
    Load,
    MemType,
    Store,
    Uop,
    decode_program,
    encode_program,
    encode_uops,
)
from accel.isa.asm import format_insn
from accel.isa.config import LOOP_ITER_BITS
from accel.isa.deps import token_queue
from accel.isa.errors import AccelError
from accel.isa.isa import INSN_BYTES

from .errors import SimError
from .fsim import Fsim

log = logging.getLogger(__name__)

#: differing entries (or DRAM bytes) listed per resource in a report
MOST = 8
#: the largest GEMM/ALU loop count
LOOP_MAX = (1 << LOOP_ITER_BITS) - 1


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
                 fault: Callable[[int, Insn, "RecordingFsim", np.ndarray], None] | None = None):
        """fault(index, insn, sim, dram): called after each instruction executes, before its effect
        is taken, to model a broken executor (tests inject one this way)."""
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
                self.fault(idx, insn, self, dram)
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
            how = "DRAM and the final OUT and accumulator entries compared: an executor that cannot be single-stepped"
        else:
            how = f"prefixes bisected, DRAM and buffer dumps compared: {self.runs} prefix runs each"
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


@dataclass(frozen=True)
class DumpLayout:
    """Where a prefix's tail writes the buffers (byte addresses): one micro-op word, the OUT buffer,
    and the accumulators narrowed to OUT's width (an ALU pass adding 0 writes out = narrow(acc))."""
    uop: int
    out: int
    acc: int
    out_entries: int
    acc_entries: int


def dump_layout(cfg: AccelConfig, base: int) -> tuple[DumpLayout, int]:
    """A DumpLayout from byte address `base` (aligned for every element size) and its end."""
    eb, ub = cfg.out_elem_bytes, cfg.uop_elem_bytes
    align = int(np.lcm.reduce([64, eb, ub]))
    up = lambda x: -(-x // align) * align   # noqa: E731
    n_acc = min(cfg.acc_depth, cfg.out_depth)
    if n_acc > LOOP_MAX:   # the ALU pass covers what whole rows of its two loops reach
        n_acc = (n_acc // -(-n_acc // LOOP_MAX)) * -(-n_acc // LOOP_MAX)
    uop = up(base)
    out = up(uop + ub)
    acc = up(out + cfg.out_depth * eb)
    return DumpLayout(uop, out, acc, cfg.out_depth, n_acc), acc + n_acc * eb


def _dump_tail(cfg: AccelConfig, dump: DumpLayout) -> list[Insn]:
    """After the prefix: OUT stored, then acc narrowed into OUT by an ALU pass and stored, then
    FINISH; tokens order each step after the one it must follow (module doc)."""
    eb, ub = cfg.out_elem_bytes, cfg.uop_elem_bytes
    n = dump.acc_entries
    inner = -(-n // LOOP_MAX)
    outer = n // inner
    return [Epilogue(push_prev=True, push_next=True),
            Load(mem_type=MemType.INP, pop_next=True, push_next=True),
            Store(mem_type=MemType.OUT, sram_base=0, dram_base=dump.out // eb, y_size=1, x_size=dump.out_entries,
                  x_stride=dump.out_entries, pop_prev=True, push_prev=True),
            Load(mem_type=MemType.UOP, sram_base=0, dram_base=dump.uop // ub, y_size=1, x_size=1, x_stride=1,
                 pop_prev=True, pop_next=True),
            Alu(alu_op=AluOp.ADD, use_imm=True, imm=0, uop_bgn=0, uop_end=1, iter_out=outer, iter_in=inner,
                dst_factor_out=inner, dst_factor_in=1, src_factor_out=inner, src_factor_in=1, push_next=True),
            Store(mem_type=MemType.OUT, sram_base=0, dram_base=dump.acc // eb, y_size=1, x_size=outer * inner,
                  x_stride=outer * inner, pop_prev=True, push_prev=True),
            Finish(pop_next=True)]


def prefix_program(insns: list[Insn], k: int, cfg: AccelConfig | None = None,
                   dump: DumpLayout | None = None) -> list[Insn]:
    """Instructions 0..k with the token pushes nothing in them pops dropped, then a tail that makes
    FINISH wait for every load and store of the prefix; with `dump` (and cfg) the tail also writes
    the OUT buffer and the narrowed accumulators to DRAM (see the module doc)."""
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
    if dump is not None:
        return pre + _dump_tail(cfg, dump)
    tail = [Epilogue(push_prev=True, push_next=True),
            Load(mem_type=MemType.INP, pop_next=True, push_next=True),
            Store(mem_type=MemType.OUT, pop_prev=True, push_prev=True),
            Finish(pop_prev=True, pop_next=True)]
    return pre + tail


def _run_prefix(make: Callable[[], Any], cfg: AccelConfig, insns: list[Insn], k: int, dram: np.ndarray,
                name: str) -> tuple[np.ndarray, DumpLayout]:
    """DRAM (the image, then the buffer dumps) after running prefix k on a fresh executor; the
    prefix program and the dumps go after the image's end."""
    base = -(-dram.size // 64) * 64
    dump, end = dump_layout(cfg, base)
    p = prefix_program(insns, k, cfg, dump)
    code = encode_program(p, cfg).reshape(-1)
    code_at = -(-end // 64) * 64
    total = code_at + code.size
    if total > 1 << cfg.dram_addr_width:
        raise LockstepError(f"no room for a prefix program and buffer dumps after the {dram.size}-byte DRAM image "
                            f"within the {cfg.dram_addr_width}-bit DRAM address space")
    d = np.zeros(total, np.uint8)
    d[:dram.size] = dram
    d[dump.uop:dump.uop + cfg.uop_elem_bytes] = encode_uops([Uop(0, 0, 0)], cfg).reshape(-1)
    d[code_at:] = code
    ex = make()
    try:
        ex.run(d, code_at, len(p))
    except AccelError as e:   # the simulators' and the drivers' own errors: one line naming the executor
        raise LockstepError(f"executor {name!r} cannot run prefix {k} ({len(p)} instructions): {e}") from None
    finally:
        close = getattr(ex, "close", None)
        if close is not None:
            close()
    return d[:end], dump


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
                dump: DumpLayout | None = None, image: int | None = None, most: int = MOST) -> list[str]:
    """The differing DRAM, one line per entry-sized chunk: the OUT entry a STORE wrote there, or,
    past the image, the OUT or accumulator entry the dump holds."""
    at = np.flatnonzero(da != db)
    chunks = sorted({int(i) // eb for i in at})
    entry = _store_entries(st, np.array([c * eb for c in chunks]), eb) if isinstance(st, Store) else {}
    lines = []
    for c in chunks[:most]:
        lo = c * eb
        if dump is not None and image is not None and lo >= image:
            if dump.out <= lo < dump.out + dump.out_entries * eb:
                where = f"out[{(lo - dump.out) // eb}]"
            elif dump.acc <= lo < dump.acc + dump.acc_entries * eb:
                where = f"acc[{(lo - dump.acc) // eb}] (narrowed to out_width)"
            else:
                where = f"dump[{lo:#x}]"
        else:
            where = f"dram[{lo:#x}..{lo + eb - 1:#x}]" + (f" (OUT entry {entry[lo]})" if lo in entry else "")
        lines.append(f"{where}: {names[0]} {_fmt_vals(da[lo:lo + eb])}  {names[1]} {_fmt_vals(db[lo:lo + eb])}")
    if len(chunks) > most:
        lines.append(f"{len(chunks) - most} more differing {eb}-byte entries")
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
    errors: dict[str, str] = {}
    for ex, d, name in ((a, da, names[0]), (b, db, names[1])):
        try:
            ex.run(d, insn_addr, len(insns))
        except AccelError as e:   # one executor failing where the other does not is a divergence too
            errors[name] = str(e)
        finally:
            close = getattr(ex, "close", None)
            if close is not None and not isinstance(ex, Fsim):
                close()
    if len(errors) == 2:
        raise LockstepError("neither executor can run the program: " +
                            "; ".join(f"{n}: {m}" for n, m in errors.items()))
    rec_a, rec_b = isinstance(a, RecordingFsim), isinstance(b, RecordingFsim)
    if rec_a and rec_b and not errors:
        div = _effects_lockstep(insns, a.effects, b.effects, names)
        if div is None and not np.array_equal(da, db):   # a write outside what the effects cover
            div = Divergence(len(insns) - 1, format_insn(insns[-1]), _dram_lines(da, db, names, eb),
                             ["DRAM differs after the run although every instruction's recorded effect agrees"])
        return LockstepResult(names, len(insns), "effects", div)
    effects = a.effects if rec_a else (b.effects if rec_b else {})
    last = max((i for i, ins in enumerate(insns) if not isinstance(ins, Finish)), default=None)
    if last is None:
        return LockstepResult(names, len(insns), "prefix", None, 0)
    runs = 0
    seen: dict[int, tuple] = {}

    def differs(k: int):
        """(differ?, DRAM+dumps of a, of b, layout, error lines) of prefix k."""
        nonlocal runs
        if k not in seen:
            runs += 1
            got, errs, lay = [], [], None
            for make, name in ((make_a, names[0]), (make_b, names[1])):
                try:
                    x, lay = _run_prefix(make, cfg, insns, k, dram, name)
                except LockstepError as e:
                    x = None
                    errs.append(str(e))
                got.append(x)
            if len(errs) == 2:
                raise LockstepError(f"neither executor can run prefix {k}: {errs[0]}; {errs[1]}")
            bad = bool(errs) or not np.array_equal(got[0], got[1])
            seen[k] = (bad, got[0], got[1], lay, errs)
        return seen[k]

    whole = bool(errors) or not np.array_equal(da, db)
    if not whole and not differs(last)[0]:   # same DRAM, and the same OUT and accumulators at the end
        return LockstepResult(names, len(insns), "prefix", None, runs,
                              "input, weight and micro-op buffer entries are compared only through their use")
    if not differs(last)[0]:
        lines = [f"{n}: {m}" for n, m in errors.items()] or _dram_lines(da, db, names, eb)
        return LockstepResult(names, len(insns), "prefix",
                              Divergence(len(insns) - 1, format_insn(insns[-1]), lines,
                                         ["every prefix agrees; the whole program does not"]), runs)
    lo, hi = 0, last   # the first prefix whose DRAM or buffer dumps differ (or that one executor fails)
    while lo < hi:
        mid = (lo + hi) // 2
        if differs(mid)[0]:
            hi = mid
        else:
            lo = mid + 1
    k = lo
    _, xa, xb, lay, errs = differs(k)
    if errs:
        div = Divergence(k, format_insn(insns[k]), errs)
    else:
        at = np.flatnonzero(xa[:dram.size] != xb[:dram.size])
        div = Divergence(k, format_insn(insns[k]), _dram_lines(xa, xb, names, eb, insns[k], lay, dram.size),
                         _origin(insns, effects, k, at, eb) if at.size else [])
    return LockstepResult(names, len(insns), "prefix", div, runs,
                          "compared after each prefix: DRAM, the OUT buffer and the accumulators narrowed to OUT's "
                          "width (input, weight and micro-op entries only through their use)")


def decode_at(dram: np.ndarray, insn_addr: int, insn_count: int, cfg: AccelConfig) -> list[Insn]:
    end = insn_addr + insn_count * INSN_BYTES
    if insn_addr < 0 or end > dram.size:
        raise LockstepError(f"instruction stream [{insn_addr:#x}, {end:#x}) lies outside the {dram.size}-byte DRAM")
    return decode_program(dram[insn_addr:end].tobytes(), cfg)


__all__ = ["lockstep", "LockstepResult", "Divergence", "RecordingFsim", "prefix_program", "LockstepError",
           "Effect", "diff_effects", "decode_at"]
