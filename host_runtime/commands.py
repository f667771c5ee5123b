"""CommandStream: how software talks to the accelerator, in the spirit of VTA's runtime.cc.

Calls append accel.isa instructions: load_2d / store_2d (2-D tile DMA with zero padding),
push_gemm / push_alu over a micro-op kernel (recorded once per Device, cached by key, kept in
DRAM and brought into the micro-op buffer by a LOAD UOP the first time a stream uses it),
dep_push / dep_pop (dependency tokens between neighbouring stages), and synchronize(), which
appends FINISH, encodes the program into DRAM, runs it on the device's driver and returns the
driver's RunResult. `insns` is the instruction list; program() packages it as an accel.isa.Program.

Token discipline (checked here, so the stream is valid in program order): a pop needs a token
pushed earlier in the stream; no queue ever holds more than dep_queue_depth tokens; at
synchronize the compute->load and compute->store queues must be empty.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from accel.isa import (
    INSN_BYTES,
    Alu,
    AluOp,
    Epilogue,
    Finish,
    Gemm,
    Insn,
    Load,
    MemType,
    Program,
    Stage,
    Store,
    Symbol,
    buffer_depth,
    deps,
    elem_bytes,
    encode_insn,
    encode_program,
    encode_uops,
    operands,
)
from accel.isa.config import LOOP_ITER_BITS, PAD_BITS, SIZE_BITS
from accel.isa.errors import EncodingError, OperandError

from .errors import CommandError
from .memory import Buffer

log = logging.getLogger(__name__)

MAX_LOOPS = 2  # GEMM/ALU have two affine loop levels


# ---- micro-op kernels ---------------------------------------------------------------------------
@dataclass(frozen=True)
class UopLoop:
    """One affine loop level of a kernel: `extent` iterations, index factors per iteration."""
    extent: int
    dst_factor: int = 0
    src_factor: int = 0
    wgt_factor: int = 0


class UopKernel:
    """A recorded micro-op kernel: up to two loops (outer first) around a list of micro-ops.

    uops: (n, 3) int64 array of (dst/acc, src, wgt) indices. src is an input-buffer index when
    the kernel drives a GEMM and an accumulator index when it drives an ALU op; the same kernel
    can serve several pushes (e.g. SHR then CLIP over one tile). `buffer` holds its encoded
    micro-ops in DRAM; max_* are the largest indices any iteration reaches.
    """

    def __init__(self, key: Any, loops: tuple[UopLoop, ...], uops: np.ndarray, buffer: Buffer | None):
        self.key = key
        self.loops = loops
        self.uops = uops
        self.buffer = buffer
        reach = [sum((l.extent - 1) * getattr(l, f) for l in loops) for f in ("dst_factor", "src_factor", "wgt_factor")]
        if len(uops):
            self.max_dst, self.max_src, self.max_wgt = (int(uops[:, i].max()) + reach[i] for i in range(3))
        else:
            self.max_dst = self.max_src = self.max_wgt = -1

    def __len__(self) -> int:
        return len(self.uops)

    def __repr__(self) -> str:
        return f"UopKernel({self.key!r}, {len(self)} uops, loops={[l.extent for l in self.loops]})"

    def loop_fields(self) -> dict[str, int]:
        """iter_out/iter_in and the dst/src factors (the GEMM also needs wgt_factors())."""
        outer, inner = (list(self.loops) + [UopLoop(1), UopLoop(1)])[:2]
        return {"iter_out": outer.extent, "iter_in": inner.extent,
                "dst_factor_out": outer.dst_factor, "dst_factor_in": inner.dst_factor,
                "src_factor_out": outer.src_factor, "src_factor_in": inner.src_factor}

    def wgt_factors(self) -> dict[str, int]:
        outer, inner = (list(self.loops) + [UopLoop(1), UopLoop(1)])[:2]
        return {"wgt_factor_out": outer.wgt_factor, "wgt_factor_in": inner.wgt_factor}


def _one_row(y_size: int, x_size: int, x_stride: int) -> tuple[int, int, int]:
    """A 2-D transfer whose rows lie back to back in DRAM (x_stride == x_size, no padding) as one
    row: the same entries in the same places, but the DMA streams it in as few bursts as the bus
    allows instead of one or more per row, each waiting out the memory's latency."""
    if y_size > 1 and x_stride == x_size and y_size * x_size < 1 << SIZE_BITS:
        return 1, y_size * x_size, y_size * x_size
    return y_size, x_size, x_stride


class KernelBuilder:
    """Records a kernel, as VTA's UopLoopBegin / UopPush / UopLoopEnd:

        k.loop_begin(extent, dst_factor, src_factor, wgt_factor)   # at most two, before any push
        k.push(dst, src, wgt)                                      # any number of micro-ops
        k.loop_end()                                               # optional: loops open at the end close
    """

    def __init__(self, key: Any = None):
        self.key = key
        self._loops: list[UopLoop] = []
        self._open = 0
        self._uops: list[tuple[int, int, int]] = []

    def _where(self) -> str:
        return f"kernel {self.key!r}"

    def loop_begin(self, extent: int, dst_factor: int = 0, src_factor: int = 0, wgt_factor: int = 0) -> None:
        if self._uops:
            raise CommandError(f"{self._where()}: loop_begin after push; open every loop before the micro-ops")
        if len(self._loops) == MAX_LOOPS:
            raise CommandError(f"{self._where()}: more than {MAX_LOOPS} loops (GEMM/ALU have two loop levels)")
        if not 1 <= extent < 1 << LOOP_ITER_BITS:
            raise CommandError(f"{self._where()}: loop extent {extent} outside [1, {(1 << LOOP_ITER_BITS) - 1}]")
        for name, v in (("dst_factor", dst_factor), ("src_factor", src_factor), ("wgt_factor", wgt_factor)):
            if v < 0:
                raise CommandError(f"{self._where()}: {name}={v} must be >= 0")
        if extent == 1:  # the factors of a one-iteration loop never matter; keep the fields small
            dst_factor = src_factor = wgt_factor = 0
        self._loops.append(UopLoop(int(extent), int(dst_factor), int(src_factor), int(wgt_factor)))
        self._open += 1

    def loop_end(self) -> None:
        if self._open == 0:
            raise CommandError(f"{self._where()}: loop_end without a matching loop_begin")
        self._open -= 1

    def push(self, dst: int, src: int = 0, wgt: int = 0) -> None:
        for name, v in (("dst", dst), ("src", src), ("wgt", wgt)):
            if v < 0:
                raise CommandError(f"{self._where()}: micro-op {len(self._uops)} has {name}={v} < 0")
        self._uops.append((int(dst), int(src), int(wgt)))

    def uops(self) -> np.ndarray:
        return np.array(self._uops, dtype=np.int64).reshape(-1, 3)

    @property
    def loops(self) -> tuple[UopLoop, ...]:
        return tuple(self._loops)


# ---- the stream ---------------------------------------------------------------------------------
_NEIGHBOURS = frozenset(deps.QUEUES)     # (from, to) stage pairs a token queue joins


def _immediate(imm, what: str) -> None:
    """CommandError unless imm fits the ALU's signed immediate (accel.isa.operands)."""
    try:
        operands.alu_immediate(imm, f"{what}:", "imm")
    except OperandError as e:
        raise CommandError(str(e)) from None


def _stage(s) -> Stage:
    if isinstance(s, Stage):
        return s
    try:
        return Stage[str(s).upper()]
    except KeyError:
        raise CommandError(f"unknown stage {s!r}; stages are {', '.join(x.name.lower() for x in Stage)}") from None


def _mem(m) -> MemType:
    if isinstance(m, MemType):
        return m
    try:
        return MemType[str(m).upper()]
    except KeyError:
        raise CommandError(f"unknown memory type {m!r}; types are {', '.join(x.name.lower() for x in MemType)}") from None


def _alu_op(op) -> AluOp:
    if isinstance(op, AluOp):
        return op
    try:
        return AluOp[str(op).upper()]
    except KeyError:
        raise CommandError(f"unknown ALU op {op!r}; ops are {', '.join(x.name.lower() for x in AluOp)}") from None


def _noop(stage: Stage) -> Insn:
    """An instruction that does nothing but can carry dependency flags."""
    if stage == Stage.LOAD:
        return Load(mem_type=MemType.INP)
    if stage == Stage.STORE:
        return Store()
    return Gemm(uop_bgn=0, uop_end=0)


class CommandStream:
    """An instruction stream under construction for one Device (see the module docstring)."""

    def __init__(self, device):
        self.device = device
        self.cfg = device.cfg
        self.last_insns: list[Insn] = []  # the program of the last synchronize()
        self._reset()

    def _reset(self) -> None:
        self._insns: list[Insn] = []
        self._last: dict[Stage, int | None] = {s: None for s in Stage}
        self._pending: dict[Stage, set[str]] = {s: set() for s in Stage}
        self._tokens: dict[tuple[Stage, Stage], int] = {q: 0 for q in _NEIGHBOURS}
        self._resident: dict[Any, tuple[int, int]] = {}  # kernel key -> (uop_bgn, uop_end)
        self._uop_top = 0
        self.kernels_used: dict[Any, UopKernel] = {}      # every kernel a GEMM or ALU used, in first use order
        self._finished = False
        self._epilogue: Epilogue | None = None   # the latest push_epilogue, which flushing GEMMs use

    @property
    def insns(self) -> list[Insn]:
        """The instructions so far (read-only by convention; FINISH is added by finish())."""
        return self._insns

    def __len__(self) -> int:
        return len(self._insns)

    # ---- appending ------------------------------------------------------------------------
    def _append(self, insn: Insn) -> int:
        if self._finished:
            raise CommandError("the stream is finished (FINISH appended); synchronize() it or start a new stream")
        stage = insn.stage
        if self._pending[stage]:
            insn = insn.with_deps(**{f: True for f in self._pending[stage]})
            self._pending[stage] = set()
        idx = len(self._insns)
        try:
            encode_insn(insn, self.cfg, idx)  # fail at the call that made it, naming the field
        except EncodingError as e:
            raise CommandError(str(e)) from None
        self._insns.append(insn)
        self._last[stage] = idx
        return idx

    def _dram_base(self, what: str, mem: MemType, dram, offset: int, y_size: int, x_size: int,
                   x_stride: int) -> int:
        """DRAM operand (Buffer or byte address, plus an offset in entries) -> dram_base in entries;
        checks alignment and that the tile lies inside the buffer (or DRAM)."""
        eb = elem_bytes(self.cfg, mem)
        if isinstance(dram, Buffer):
            base = dram.entry_index(eb, offset)
            lo, hi, where = dram.addr, dram.end, repr(dram)
        else:
            addr = int(dram)
            if addr % eb:
                raise CommandError(f"{what}: DRAM address {addr:#x} is not aligned to the {eb}-byte {mem.name} entry")
            base = addr // eb + offset
            lo, hi, where = 0, self.device.memory.nbytes, "DRAM"
        if y_size and x_size:
            first = base * eb
            last = (base + (y_size - 1) * x_stride + x_size) * eb
            if first < lo or last > hi:
                raise CommandError(f"{what}: {y_size}x{x_size} {mem.name} entries (stride {x_stride}) at entry "
                                   f"offset {offset} cover bytes [{first:#x}, {last:#x}), outside {where} "
                                   f"[{lo:#x}, {hi:#x})")
        return base

    def _check_sizes(self, what: str, **vals) -> None:
        for name, v in vals.items():
            bits = PAD_BITS if "pad" in name else SIZE_BITS
            if not 0 <= v < 1 << bits:
                raise CommandError(f"{what}: {name}={v} outside [0, {(1 << bits) - 1}]")

    def load_2d(self, mem_type, sram_base: int, src, src_offset: int = 0, *, y_size: int = 1, x_size: int,
                x_stride: int | None = None, y_pad0: int = 0, y_pad1: int = 0, x_pad0: int = 0,
                x_pad1: int = 0) -> int:
        """LOAD a y_size x x_size tile of `mem_type` entries (rows x_stride entries apart, default
        x_size) from `src` (a Buffer or a byte address) + src_offset entries into the on-chip
        buffer at sram_base, surrounded by zero padding. INP/WGT loads run on the load stage,
        ACC loads on compute. Returns the instruction's index."""
        mem = _mem(mem_type)
        what = f"load_2d({mem.name})"
        if mem == MemType.UOP:
            raise CommandError(f"{what}: micro-ops are loaded by the kernels of push_gemm/push_alu")
        if mem == MemType.OUT:
            raise CommandError(f"{what}: LOAD cannot write the output buffer (types: inp, wgt, acc)")
        x_stride = x_size if x_stride is None else x_stride
        self._check_sizes(what, y_size=y_size, x_size=x_size, x_stride=x_stride, y_pad0=y_pad0, y_pad1=y_pad1,
                          x_pad0=x_pad0, x_pad1=x_pad1)
        n = (y_pad0 + y_size + y_pad1) * (x_pad0 + x_size + x_pad1)
        depth = buffer_depth(self.cfg, mem)
        if sram_base < 0 or sram_base + n > depth:
            raise CommandError(f"{what}: sram_base={sram_base} + {n} entries (padding included) exceeds the "
                               f"{mem.name} buffer's {depth} entries")
        base = self._dram_base(what, mem, src, src_offset, y_size, x_size, x_stride)
        if not (y_pad0 or y_pad1 or x_pad0 or x_pad1):
            y_size, x_size, x_stride = _one_row(y_size, x_size, x_stride)
        return self._append(Load(mem_type=mem, sram_base=sram_base, dram_base=base, y_size=y_size, x_size=x_size,
                                 x_stride=x_stride, y_pad0=y_pad0, y_pad1=y_pad1, x_pad0=x_pad0, x_pad1=x_pad1))

    def store_2d(self, sram_base: int, dst, dst_offset: int = 0, *, y_size: int = 1, x_size: int,
                 x_stride: int | None = None) -> int:
        """STORE y_size x x_size output-buffer entries from sram_base (row-major) to `dst` (a Buffer
        or byte address) + dst_offset entries, rows x_stride entries apart. Returns the index."""
        what = "store_2d(OUT)"
        x_stride = x_size if x_stride is None else x_stride
        self._check_sizes(what, y_size=y_size, x_size=x_size, x_stride=x_stride)
        n = y_size * x_size
        if sram_base < 0 or sram_base + n > self.cfg.out_depth:
            raise CommandError(f"{what}: sram_base={sram_base} + {n} entries exceeds the OUT buffer's "
                               f"{self.cfg.out_depth} entries")
        base = self._dram_base(what, MemType.OUT, dst, dst_offset, y_size, x_size, x_stride)
        y_size, x_size, x_stride = _one_row(y_size, x_size, x_stride)
        return self._append(Store(sram_base=sram_base, dram_base=base, y_size=y_size, x_size=x_size,
                                  x_stride=x_stride))

    # ---- kernels --------------------------------------------------------------------------
    def kernel(self, key: Any, build: Callable[[KernelBuilder], None]) -> UopKernel:
        """The device's kernel cached under `key`, or record it by calling build(KernelBuilder)
        once and store its micro-ops in DRAM. `key` must identify the micro-ops completely."""
        cache = self.device.kernels
        k = cache.get(key)
        if k is not None:
            return k
        b = KernelBuilder(key)
        build(b)
        uops = b.uops()
        if len(uops) > self.cfg.uop_depth:
            raise CommandError(f"kernel {key!r}: {len(uops)} micro-ops exceed the micro-op buffer's "
                               f"{self.cfg.uop_depth} entries")
        if len(uops) >= 1 << SIZE_BITS:
            raise CommandError(f"kernel {key!r}: {len(uops)} micro-ops exceed one LOAD's x_size limit "
                               f"{(1 << SIZE_BITS) - 1}")
        buf = None
        if len(uops):
            try:
                data = encode_uops(uops, self.cfg)
            except EncodingError as e:
                raise CommandError(f"kernel {key!r}: {e}") from None
            buf = self.device.memory.alloc(data.nbytes, name=f"uops {key!r}")
            buf.write(data)
        k = UopKernel(key, b.loops, uops, buf)
        cache[key] = k
        log.debug("recorded %r", k)
        return k

    def _resident_range(self, k: UopKernel) -> tuple[int, int]:
        """[uop_bgn, uop_end) of the kernel in the micro-op buffer, loading it if needed. The
        buffer is filled bottom-up; when a kernel does not fit, it starts over from entry 0
        (compute executes in order, so overwriting micro-ops of earlier GEMMs is safe)."""
        if not len(k):
            return 0, 0
        self.kernels_used.setdefault(k.key, k)
        r = self._resident.get(k.key)
        if r is not None:
            return r
        n = len(k)
        if self._uop_top + n > self.cfg.uop_depth:
            log.debug("micro-op buffer full; starting over")
            self._resident.clear()
            self._uop_top = 0
        bgn = self._uop_top
        self._append(Load(mem_type=MemType.UOP, sram_base=bgn, dram_base=k.buffer.entry_index(self.cfg.uop_elem_bytes),
                          y_size=1, x_size=n, x_stride=n))
        self._uop_top += n
        self._resident[k.key] = (bgn, bgn + n)
        return bgn, bgn + n

    def preload(self, kernels) -> None:
        """Make these kernels resident now with one LOAD: their encoded micro-ops, copied from their
        buffers back to back into one DRAM block (cached on the device by their keys), go to the
        micro-op buffer together, so the GEMM and ALU instructions that use them later load nothing.
        A program preloads its kernels first, while the compute stage would wait for its first input
        anyway, instead of loading each where it is first used, behind the load stage's bursts.
        Kernels already resident, empty or too many for the buffer's free entries are left to load
        where they are used."""
        todo = [k for k in kernels if len(k) and k.key not in self._resident]
        n = sum(len(k) for k in todo)
        if not todo or self._uop_top + n > self.cfg.uop_depth or n >= 1 << SIZE_BITS:
            return
        key = ("preload",) + tuple(k.key for k in todo)
        bundle = self.device.kernels.get(key)
        if bundle is None:
            data = np.concatenate([k.buffer.read(shape=(len(k) * self.cfg.uop_elem_bytes,)) for k in todo])
            bundle = self.device.memory.alloc(data.nbytes, name=f"uops preload of {len(todo)} kernels")
            bundle.write(data)
            self.device.kernels[key] = bundle
        bgn = self._uop_top
        self._append(Load(mem_type=MemType.UOP, sram_base=bgn, dram_base=bundle.entry_index(self.cfg.uop_elem_bytes),
                          y_size=1, x_size=n, x_stride=n))
        for k in todo:
            self._resident[k.key] = (bgn, bgn + len(k))
            self.kernels_used.setdefault(k.key, k)
            bgn += len(k)
        self._uop_top = bgn

    def emit_preloaded(self, emit: Callable[["CommandStream"], Any]) -> Any:
        """emit(self), its kernels preloaded first (preload): a dry run of emit on a scratch stream of
        the same device names them. Returns what emit returns."""
        dry = CommandStream(self.device)
        emit(dry)
        self.preload(dry.kernels_used.values())
        return emit(self)

    def _check_reach(self, what: str, k: UopKernel, checks) -> None:
        for name, reach, depth, buf in checks:
            if reach >= depth:
                raise CommandError(f"{what} with kernel {k.key!r}: {name} index reaches {reach}, beyond the "
                                   f"{buf} buffer's {depth} entries")

    def push_gemm(self, kernel: UopKernel, reset: bool = False, flush: bool = False) -> int:
        """GEMM over the kernel: acc[dst] += inp[src] @ wgt[wgt].T, or acc[dst] = 0 with reset.
        flush: each pass's last micro-op ends its sum with the latest push_epilogue's parameters
        (Gemm.flush: the requantized sum to the output buffer, the pass's seed, or with to_acc the
        requantized sum, to the accumulator)."""
        c = self.cfg
        checks = [("dst", kernel.max_dst, c.acc_depth, "accumulator")]
        if not reset:
            checks += [("src", kernel.max_src, c.inp_depth, "input"), ("wgt", kernel.max_wgt, c.wgt_depth, "weight")]
        loops = kernel.loop_fields()
        if flush:
            e = self._epilogue
            if e is None:
                raise CommandError(f"push_gemm(flush=True) with kernel {kernel.key!r}: no push_epilogue before it "
                                   f"sets the flush parameters and seeds")
            seed = e.seed_base + (loops["iter_out"] - 1) * e.seed_factor_out + (loops["iter_in"] - 1) * e.seed_factor_in
            if not e.to_acc:   # to_acc reads no seed
                checks.append(("seed", seed, c.acc_depth, "accumulator"))
        self._check_reach("push_gemm", kernel, checks)
        bgn, end = self._resident_range(kernel)
        return self._append(Gemm(reset=bool(reset), flush=bool(flush), uop_bgn=bgn, uop_end=end, **loops,
                                 **kernel.wgt_factors()))

    def push_epilogue(self, imm: int, seed_base: int = 0, seed_factor_out: int = 0, seed_factor_in: int = 0,
                      to_acc: bool = False) -> int:
        """EPILOGUE: the FLUSH immediate (flush_immediate) and the affine seed index
        (seed_base + i0*seed_factor_out + i1*seed_factor_in) of the flushing GEMMs that follow; with
        to_acc they write the requantized sums to the accumulator instead of the seeds."""
        _immediate(imm, "push_epilogue")
        for name, v in (("seed_base", seed_base), ("seed_factor_out", seed_factor_out),
                        ("seed_factor_in", seed_factor_in)):
            if not 0 <= v < self.cfg.acc_depth:
                raise CommandError(f"push_epilogue: {name}={v} outside [0, {self.cfg.acc_depth}) (accumulator entries)")
        self._epilogue = Epilogue(imm=int(imm), seed_base=int(seed_base), seed_factor_out=int(seed_factor_out),
                                  seed_factor_in=int(seed_factor_in), to_acc=bool(to_acc))
        return self._append(self._epilogue)

    def push_alu(self, kernel: UopKernel, op, imm: int | None = None, use_imm: bool | None = None) -> int:
        """ALU over the kernel: acc[dst] = op(acc[dst], acc[src]), or op(acc[dst], imm) when imm is given.
        use_imm=False with an imm: the register operand, and the immediate as FLUSH's parameters."""
        op = _alu_op(op)
        c = self.cfg
        use_imm = imm is not None if use_imm is None else bool(use_imm)
        if use_imm and imm is None:
            raise CommandError(f"push_alu({op.name}): use_imm=True needs an imm")
        checks = [("dst", kernel.max_dst, c.acc_depth, "accumulator")]
        if not use_imm:
            checks.append(("src", kernel.max_src, c.acc_depth, "accumulator"))
        if imm is not None:
            _immediate(imm, f"push_alu({op.name})")
        self._check_reach(f"push_alu({op.name})", kernel, checks)
        bgn, end = self._resident_range(kernel)
        return self._append(Alu(alu_op=op, use_imm=use_imm, imm=0 if imm is None else int(imm),
                                uop_bgn=bgn, uop_end=end, **kernel.loop_fields()))

    # ---- dependency tokens ----------------------------------------------------------------
    def _queue(self, frm, to, what: str) -> tuple[Stage, Stage]:
        frm, to = _stage(frm), _stage(to)
        if (frm, to) not in _NEIGHBOURS:
            raise CommandError(f"{what}({frm.name.lower()}, {to.name.lower()}): tokens only flow between "
                               f"neighbouring stages (load<->compute<->store)")
        return frm, to

    def _commit_pending(self, stage: Stage) -> None:
        if self._pending[stage]:
            self._append(_noop(stage))

    def dep_push(self, from_stage, to_stage) -> None:
        """`from_stage` pushes a token to `to_stage` after all its instructions so far: the flag is
        set on its last instruction, or on a new no-op when there is none (or it already pushes)."""
        frm, to = self._queue(from_stage, to_stage, "dep_push")
        if self._finished:
            raise CommandError("the stream is finished (FINISH appended); synchronize() it or start a new stream")
        flag = deps.push_flag(frm, to)
        if self._tokens[(frm, to)] >= self.cfg.dep_queue_depth:
            raise CommandError(f"dep_push({frm.name.lower()}, {to.name.lower()}): would be token "
                               f"{self._tokens[(frm, to)] + 1} in a queue of depth {self.cfg.dep_queue_depth} "
                               f"(pop some first, or the accelerator deadlocks)")
        self._commit_pending(frm)  # a pop requested earlier must happen before this push
        last = self._last[frm]
        if last is not None and not getattr(self._insns[last], flag):
            self._insns[last] = self._insns[last].with_deps(**{flag: True})
        else:
            self._insns.append(_noop(frm).with_deps(**{flag: True}))
            self._last[frm] = len(self._insns) - 1
        self._tokens[(frm, to)] += 1

    def dep_pop(self, from_stage, to_stage) -> None:
        """`to_stage` waits for a token from `from_stage` before its next instruction."""
        frm, to = self._queue(from_stage, to_stage, "dep_pop")
        if self._finished:
            raise CommandError("the stream is finished (FINISH appended); synchronize() it or start a new stream")
        if self._tokens[(frm, to)] == 0:
            raise CommandError(f"dep_pop({frm.name.lower()}, {to.name.lower()}): no token is outstanding on that "
                               f"queue; dep_push({frm.name.lower()}, {to.name.lower()}) must come first")
        flag = deps.pop_flag(frm, to)
        if flag in self._pending[to]:
            self._commit_pending(to)
        self._pending[to].add(flag)
        self._tokens[(frm, to)] -= 1

    # ---- finishing and running -------------------------------------------------------------
    def finish(self) -> list[Insn]:
        """Append FINISH, made to wait until every load and store is done; returns the program."""
        if self._finished:
            return self._insns
        for s in (Stage.LOAD, Stage.STORE):
            self._commit_pending(s)
        for q in ((Stage.COMPUTE, Stage.LOAD), (Stage.COMPUTE, Stage.STORE)):
            if self._tokens[q]:
                raise CommandError(f"unbalanced dependency tokens: {self._tokens[q]} token(s) pushed "
                                   f"{q[0].name.lower()}->{q[1].name.lower()} are never popped")
        for s in (Stage.LOAD, Stage.STORE):
            last = self._last[s]
            if last is None:
                continue
            flag = deps.push_flag(s, Stage.COMPUTE)
            pushes, n = getattr(self._insns[last], flag), self._tokens[(s, Stage.COMPUTE)]
            if n == 0 and pushes:
                continue  # compute already waited for the stage's last instruction
            if n == 0:
                self.dep_push(s, Stage.COMPUTE)
            elif not (n == 1 and pushes):
                raise CommandError(f"unbalanced dependency tokens: {n} token(s) pushed {s.name.lower()}->compute "
                                   f"are never popped")
            self.dep_pop(s, Stage.COMPUTE)
        self._append(Finish())
        self._finished = True
        return self._insns

    def program(self, symbols: dict[str, Symbol] | None = None) -> Program:
        """The finished stream as a Program: its instructions, and as the DRAM image every live
        buffer of the device (data, micro-op kernels). The stream stays finished (synchronize runs it)."""
        insns = self.finish()
        mem = self.device.memory
        code = mem.alloc(len(insns) * INSN_BYTES, name="instructions")  # reserve a place for the code
        try:
            segments: list[tuple[int, bytes]] = []
            for b in mem.buffers():
                if b is code:
                    continue
                data = mem.array[b.addr:b.end].tobytes()
                if segments and segments[-1][0] + len(segments[-1][1]) == b.addr:
                    segments[-1] = (segments[-1][0], segments[-1][1] + data)
                else:
                    segments.append((b.addr, data))
            top = max([code.end] + [a + len(d) for a, d in segments])
            dram_bytes = min(mem.nbytes, -(-top // 4096) * 4096)
            return Program(self.cfg, list(insns), insn_addr=code.addr, dram_bytes=dram_bytes, segments=segments,
                           symbols=dict(symbols or {}))
        finally:
            code.free()

    def synchronize(self):
        """finish(), encode the program into DRAM, run it on the device's driver; returns the
        driver's RunResult. The stream is then empty and can be reused."""
        insns = self.finish()
        code = encode_program(insns, self.cfg)
        buf = self.device.memory.alloc(code.nbytes, name="instructions")
        try:
            buf.write(code)
            result = self.device.run(buf.addr, len(insns))
        finally:
            buf.free()
            self.last_insns = list(insns)
            self._reset()
        return result
