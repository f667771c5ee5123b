"""Fuzz tests of every accel.isa parser: instruction decoder, assembler, program files (.accp) and
configurations. Whatever the input, a parser returns a value or raises the kit's own error type
(AccelError): nothing else escapes. What parses also round-trips.

The targets below are plain functions of one input; the suite drives them with hypothesis on a
small budget (derandomized in CI: tests/conftest.py), bench/fuzz_parsers.py runs them for long.
"""
from __future__ import annotations

import json
import os
import random
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import accel.isa.asm as asm
from accel.isa import (
    PRESETS,
    AccelConfig,
    Alu,
    AluOp,
    AsmError,
    ConfigError,
    EncodingError,
    Epilogue,
    Finish,
    Gemm,
    Load,
    MemType,
    Program,
    ProgramFormatError,
    Store,
    Symbol,
    assemble_text,
    decode_insn,
    decode_program,
    disassemble,
    encode_insn,
    format_insn,
    formats_for,
)

CONFIGS = [PRESETS["tiny"], PRESETS["default"]]
#: the suite's budget per test; ACCEL_FUZZ_EXAMPLES=5000 pytest tests/isa/test_fuzz.py digs deeper
FUZZ = settings(max_examples=int(os.environ.get("ACCEL_FUZZ_EXAMPLES", 150)), deadline=None,
                suppress_health_check=[HealthCheck.too_slow])


# ---- targets: one input -> None, or an AssertionError / unexpected exception --------------------
def target_decode(word: int, cfg: AccelConfig) -> None:
    """Decoder: any 128-bit word decodes or raises EncodingError; a decoded word re-encodes to
    itself, and its assembly text (disassembler) assembles to the same word: every field survives."""
    try:
        insn = decode_insn(word, cfg, 0)
    except EncodingError:
        return
    assert encode_insn(insn, cfg) == word
    back = assemble_text(format_insn(insn), cfg)
    assert back == [insn], (format_insn(insn), back)
    assert encode_insn(back[0], cfg) == word


def target_decode_program(data: bytes, cfg: AccelConfig) -> None:
    try:
        insns = decode_program(data, cfg)
    except EncodingError:
        return
    assert assemble_text(disassemble(insns), cfg) == insns


def target_asm(text: str, cfg: AccelConfig | None) -> None:
    """Assembler: any text assembles or raises AsmError; what assembles round-trips through the
    disassembler (with a config, every field also fits its width)."""
    try:
        insns = assemble_text(text, cfg)
    except AsmError:
        return
    assert assemble_text(disassemble(insns), cfg) == insns
    if cfg is not None:
        for i in insns:
            encode_insn(i, cfg)


def target_program(data: bytes) -> None:
    """.accp reader: any bytes load or raise ProgramFormatError; what loads writes back the same bytes."""
    try:
        prog = Program.from_bytes(data, source="fuzz.accp")
    except ProgramFormatError:
        return
    again = Program.from_bytes(prog.to_bytes())
    assert again.insns == prog.insns and again.segments == prog.segments and again.symbols == prog.symbols
    assert (again.insn_addr, again.dram_bytes, again.config) == (prog.insn_addr, prog.dram_bytes, prog.config)
    if prog.dram_bytes <= 1 << 24:   # bounded by validation anyway; keep the suite's memory small
        assert prog.dram_image().size == prog.dram_bytes


def target_config(data: bytes) -> None:
    """Config reader: any bytes give a config or ConfigError; a config saves and loads to itself."""
    try:
        cfg = AccelConfig.from_json(data, source="fuzz.json")
    except ConfigError:
        return
    assert AccelConfig.from_json(cfg.to_json()) == cfg


# ---- seeds --------------------------------------------------------------------------------------
def seed_program(cfg: AccelConfig = PRESETS["tiny"]) -> Program:
    insns = [Load(mem_type=MemType.UOP, y_size=1, x_size=2, x_stride=2),
             Load(mem_type=MemType.INP, y_size=2, x_size=2, x_stride=3, x_pad0=1, push_next=True),
             Gemm(uop_end=2, iter_out=2, dst_factor_out=1, reset=True, pop_prev=True),
             Epilogue(imm=645, seed_base=3, seed_factor_out=1), Gemm(uop_end=1, flush=True),
             Alu(alu_op=AluOp.SHR, use_imm=True, imm=-4, uop_end=1, push_next=True),
             Store(y_size=1, x_size=2, x_stride=2, pop_prev=True, push_prev=True), Finish(pop_next=True)]
    return Program(cfg, insns, insn_addr=0x100, dram_bytes=8192, segments=[(0x200, bytes(range(64))), (0x400, b"\7")],
                   symbols={"out": Symbol(0x800, (2, 4), "int8"), "w": Symbol(0x200, (4, 4), "int32")})


SEED_ASM = disassemble(seed_program().insns)
SEED_CONFIG = PRESETS["tiny"].to_json().encode()


def mutate_bytes(data: bytes, rng: random.Random, n: int = 4) -> bytes:
    """A few random edits: flip/set bytes, insert, delete, truncate, duplicate a chunk."""
    b = bytearray(data)
    for _ in range(rng.randint(1, n)):
        op = rng.randrange(6)
        i = rng.randrange(len(b) + 1)
        if op == 0 and b:
            b[min(i, len(b) - 1)] ^= 1 << rng.randrange(8)
        elif op == 1 and b:
            b[min(i, len(b) - 1)] = rng.choice((0, 0xFF, 0x7F, 0x80, ord("-"), ord("["), ord('"'), ord("9")))
        elif op == 2:
            b[i:i] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
        elif op == 3:
            del b[i:i + rng.randint(1, 16)]
        elif op == 4:
            del b[i:]
        else:
            j = rng.randrange(len(b) + 1)
            b[i:i] = b[j:j + rng.randint(1, 32)]
    return bytes(b)


def mutate_json(value, rng: random.Random):
    """Replace one value somewhere in a JSON tree by a hostile one (null, negative, huge, wrong type)."""
    hostile = [None, -1, -(1 << 40), 1 << 64, 0, 1.5, "1", True, [], {}, [[[]]], "\udc80", float("1e308")]
    if isinstance(value, dict) and value and rng.random() < 0.8:
        k = rng.choice(sorted(value))
        out = dict(value)
        if rng.random() < 0.1:
            del out[k]
        else:
            out[k] = mutate_json(value[k], rng)
        return out
    if isinstance(value, list) and value and rng.random() < 0.8:
        out = list(value)
        i = rng.randrange(len(out))
        out[i] = mutate_json(out[i], rng)
        return out
    return rng.choice(hostile)


def program_with_header(header: dict, prog: Program | None = None) -> bytes:
    """A program file whose header is replaced (the body after it kept)."""
    body = (prog or seed_program()).to_bytes()
    hlen = struct.unpack_from("<I", body, 12)[0]
    hj = json.dumps(header).encode("utf-8", "surrogatepass")
    return body[:8] + struct.pack("<II", 1, len(hj)) + hj + body[16 + hlen:]


# ---- the suite's small, derandomizable budget --------------------------------------------------
@pytest.mark.parametrize("cfg", CONFIGS, ids=["tiny", "default"])
def test_fuzz_decoder_any_word(cfg):
    @FUZZ
    @given(st.integers(0, (1 << 128) - 1) | st.integers(0, 7).flatmap(
        lambda op: st.integers(0, (1 << 121) - 1).map(lambda hi: hi << 7 | op)))
    def check(word):
        target_decode(word, cfg)
    check()


@pytest.mark.parametrize("cfg", CONFIGS, ids=["tiny", "default"])
def test_fuzz_decoder_valid_words_roundtrip_through_text(cfg):
    """Words with no bits above the format: most decode, so every field goes through the text."""
    used = {name: sum(w for _, w in fmt) for name, fmt in formats_for(cfg).items()}

    @FUZZ
    @given(st.sampled_from(list(used)).flatmap(
        lambda name: st.integers(0, (1 << (used[name] - 3)) - 1).map(lambda hi: hi << 3 | _OPCODES[name])))
    def check(word):
        target_decode(word, cfg)
    check()


_OPCODES = {"LOAD": 0, "STORE": 1, "GEMM": 2, "ALU": 3, "FINISH": 4, "EPILOGUE": 5}


def test_fuzz_decode_program_any_bytes():
    @FUZZ
    @given(st.binary(max_size=200))
    def check(data):
        target_decode_program(data, PRESETS["tiny"])
    check()


_WORDS = ["load", "store", "gemm", "alu", "finish", "epilogue", "inp", "wgt", "out", "acc", "uop", "add", "shr",
          "flush", "reset", "use_imm", "to_acc", "push_next", "pop_prev", "x_size=", "imm=", "uop_end=", "=", "#",
          ";", "0x", "-1", "99999999999", "\n", " ", "\t", "\x00", "é", "\r", "iter_out=0", "sram_base="]


@pytest.mark.parametrize("cfg", [None, PRESETS["tiny"]], ids=["nocfg", "tiny"])
def test_fuzz_assembler_any_text(cfg):
    @FUZZ
    @given(st.text(max_size=80) | st.lists(st.sampled_from(_WORDS) | st.text(max_size=4), max_size=20).map("".join))
    def check(text):
        target_asm(text, cfg)
    check()


def test_fuzz_assembler_mutated_program():
    @FUZZ
    @given(st.randoms(use_true_random=False))
    def check(rng):
        text = mutate_bytes(SEED_ASM.encode(), rng, 6).decode("utf-8", "replace")
        target_asm(text, PRESETS["tiny"])
    check()


def test_fuzz_program_file_mutated_bytes():
    seed = seed_program().to_bytes()

    @FUZZ
    @given(st.randoms(use_true_random=False))
    def check(rng):
        target_program(mutate_bytes(seed, rng))
    check()


def test_fuzz_program_file_mutated_header():
    header = seed_program().header()

    @FUZZ
    @given(st.randoms(use_true_random=False))
    def check(rng):
        h = header
        for _ in range(rng.randint(1, 3)):
            h = mutate_json(h, rng)
        target_program(program_with_header(h))
    check()


def test_fuzz_program_file_any_bytes():
    @FUZZ
    @given(st.binary(max_size=300).map(lambda b: b"ACCPROG\0\1\0\0\0" + b))
    def check(data):
        target_program(data)
    check()


_JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
                     lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=8), kids, max_size=3),
                     max_leaves=8)


def test_fuzz_config_json_values():
    keys = list(PRESETS["tiny"].to_dict()) + ["", "x"]

    @FUZZ
    @given(st.dictionaries(st.sampled_from(keys), _JSON | st.integers(-(1 << 30), 1 << 30), max_size=6) | _JSON)
    def check(d):
        target_config(json.dumps(d).encode())
    check()


def test_fuzz_config_mutated_bytes():
    @FUZZ
    @given(st.randoms(use_true_random=False))
    def check(rng):
        target_config(mutate_bytes(SEED_CONFIG, rng))
    check()


def test_fuzz_config_any_bytes():
    @FUZZ
    @given(st.binary(max_size=100))
    def check(data):
        target_config(data)
    check()


def test_fuzz_targets_catch_a_broken_parser(monkeypatch):
    """The targets are not vacuous: a decoder that leaks a KeyError, or a disassembler that drops a
    field, fails them."""
    cfg = PRESETS["tiny"]
    word = encode_insn(Store(mem_type=MemType.ACC, y_size=1), cfg)
    monkeypatch.setattr(asm, "_kind_word", lambda insn: insn.alu_op.name.lower() if isinstance(insn, Alu) else (
        insn.mem_type.name.lower() if isinstance(insn, Load) else None))   # the old STORE-dropping printer
    with pytest.raises(AssertionError):
        target_decode(word, cfg)
    monkeypatch.undo()
    target_decode(word, cfg)
    with pytest.raises(KeyError):
        def leaky(data, source=""):
            raise KeyError("insn_count")
        monkeypatch.setattr(Program, "from_bytes", staticmethod(leaky))
        target_program(b"")

