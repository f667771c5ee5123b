"""ISA: config validation, binary round-trips of every instruction kind, assembler round-trips."""
import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

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
    Uop,
    assemble_text,
    decode_insn,
    decode_program,
    decode_uops,
    disassemble,
    encode_insn,
    encode_program,
    encode_uops,
    flush_immediate,
    formats_for,
    preset,
)

CONFIGS = [PRESETS["default"], PRESETS["tiny"], AccelConfig(batch=2, block_in=8, block_out=16, acc_buff_bytes=64 * 1024,
                                                            out_buff_bytes=16 * 1024, dram_addr_width=24)]


def _fields(cfg, name):
    return dict(formats_for(cfg)[name])


@st.composite
def insns(draw, cfg):
    kind = draw(st.sampled_from(["LOAD", "STORE", "GEMM", "ALU", "FINISH", "EPILOGUE"]))
    w = _fields(cfg, kind)
    deps = {f: draw(st.booleans()) for f in ("pop_prev", "pop_next", "push_prev", "push_next")}

    def u(name):
        return draw(st.integers(0, (1 << w[name]) - 1))
    if kind in ("LOAD", "STORE"):
        vals = {k: u(k) for k in ("sram_base", "dram_base", "y_size", "x_size", "x_stride")}
        if kind == "LOAD":
            vals.update({k: u(k) for k in ("y_pad0", "y_pad1", "x_pad0", "x_pad1")})
            vals["mem_type"] = draw(st.sampled_from([MemType.UOP, MemType.WGT, MemType.INP, MemType.ACC]))
            return Load(**vals, **deps)
        return Store(**vals, **deps, mem_type=draw(st.sampled_from(list(MemType))))  # OUT, or one a run rejects
    if kind == "FINISH":
        return Finish(**deps)
    if kind == "EPILOGUE":
        return Epilogue(imm=draw(st.integers(-(1 << 15), (1 << 15) - 1)), seed_base=u("seed_base"),
                        seed_factor_out=u("seed_factor_out"), seed_factor_in=u("seed_factor_in"),
                        to_acc=draw(st.booleans()), **deps)
    loop = {k: u(k) for k in ("uop_bgn", "uop_end", "iter_out", "iter_in", "dst_factor_out", "dst_factor_in",
                              "src_factor_out", "src_factor_in")}
    if kind == "GEMM":
        return Gemm(reset=draw(st.booleans()), flush=draw(st.booleans()), wgt_factor_out=u("wgt_factor_out"),
                    wgt_factor_in=u("wgt_factor_in"), **loop, **deps)
    return Alu(alu_op=draw(st.sampled_from(list(AluOp))), use_imm=draw(st.booleans()),
               imm=draw(st.integers(-(1 << 15), (1 << 15) - 1)), **loop, **deps)


@pytest.mark.parametrize("cfg", CONFIGS, ids=["default", "tiny", "b2x8x16"])
def test_isa_binary_and_text_roundtrip(cfg):
    @settings(max_examples=150, deadline=None)
    @given(st.lists(insns(cfg), min_size=1, max_size=8))
    def check(prog):
        for i in prog:
            word = encode_insn(i, cfg)
            assert word < 1 << 128
            assert decode_insn(word, cfg) == i
        assert decode_program(encode_program(prog, cfg), cfg) == prog
        assert assemble_text(disassemble(prog), cfg) == prog
    check()


#: big buffers, a small micro-op buffer: 37 index bits, so 64-bit micro-op words
UOP64 = AccelConfig(uop_buff_bytes=1 << 10, inp_buff_bytes=1 << 17, acc_buff_bytes=1 << 19, out_buff_bytes=1 << 17,
                    wgt_buff_bytes=1 << 19)


@pytest.mark.parametrize("cfg", CONFIGS + [UOP64], ids=["default", "tiny", "b2x8x16", "uop64"])
def test_isa_uop_roundtrip(cfg):
    @settings(max_examples=50, deadline=None)
    @given(st.lists(st.tuples(st.integers(0, (1 << cfg.acc_idx_bits) - 1), st.integers(0, (1 << cfg.src_idx_bits) - 1),
                              st.integers(0, (1 << cfg.wgt_idx_bits) - 1)), min_size=1, max_size=20))
    def check(rows):
        data = encode_uops([Uop(*r) for r in rows], cfg)
        assert data.size == len(rows) * cfg.uop_elem_bytes
        assert decode_uops(data, cfg).tolist() == [list(r) for r in rows]
        assert decode_uops(data.tobytes(), cfg).dtype == np.int64
    check()
    assert cfg.uop_bits == (64 if cfg is UOP64 else 32)


def test_isa_field_overflow_names_field():
    cfg = PRESETS["tiny"]
    with pytest.raises(EncodingError, match=r"GEMM instruction 3: field dst_factor_out=256 outside the 8-bit"):
        encode_insn(Gemm(dst_factor_out=256), cfg, 3)
    with pytest.raises(EncodingError, match="imm=40000 outside the signed 16-bit"):
        encode_insn(Alu(imm=40000), cfg)
    with pytest.raises(EncodingError, match="micro-op 1: field acc=256"):
        encode_uops([Uop(0, 0, 0), Uop(256, 0, 0)], cfg)
    with pytest.raises(EncodingError, match=r"FLUSH shift=32 outside its range \[0, 31\]"):
        flush_immediate(32, 127)
    with pytest.raises(EncodingError, match=r"FLUSH hi=128 outside its range \[-128, 127\]"):
        flush_immediate(8, 128)


def test_isa_decode_rejects_bad_words():
    cfg = PRESETS["default"]
    with pytest.raises(EncodingError, match="instruction 7: unknown opcode 7"):
        decode_insn(7, cfg, 7)
    with pytest.raises(EncodingError, match="non-zero bits above"):
        decode_insn(int(encode_insn(Finish(), cfg)) | (1 << 100), cfg)
    with pytest.raises(EncodingError, match="mem_type=7"):
        decode_insn(0 | (7 << 7), cfg)


def test_config_presets_and_derived_values():
    d = preset("default")
    assert (d.batch, d.block_in, d.block_out) == (1, 16, 16)
    assert (d.inp_depth, d.wgt_depth, d.acc_depth, d.uop_depth) == (2048, 1024, 2048, 8192)
    assert d.macs_per_cycle == 256 and d.peak_gops == pytest.approx(51.2)
    assert max(d.insn_bits_used().values()) <= 128
    t = preset("tiny")
    assert (t.block_in, t.block_out) == (4, 4)
    with pytest.raises(ConfigError, match="unknown config preset 'nope'; presets are default"):
        preset("nope")


def test_config_json_roundtrip(tmp_path):
    cfg = CONFIGS[2]
    p = tmp_path / "c.json"
    cfg.save(p)
    assert AccelConfig.load(p) == cfg
    assert AccelConfig.from_json(cfg.to_json()) == cfg


@pytest.mark.parametrize("changes, match", [
    ({"block_in": 12}, r"AccelConfig.block_in=12: must be a power of two in \[1, 256\]"),
    ({"inp_width": 4}, r"AccelConfig.inp_width=4: allowed values are 8, 16"),
    ({"dram_addr_width": 48}, r"AccelConfig.dram_addr_width=48: the LOAD instruction would need 135 bits"),
    ({"uop_buff_bytes": 256 * 1024}, r"AccelConfig.uop_buff_bytes=262144: the GEMM instruction would need"),
    ({"inp_buff_bytes": 1000}, r"AccelConfig.inp_buff_bytes=1000: must be a positive multiple of its entry size"),
    ({"acc_buff_bytes": 96 * 1024}, r"AccelConfig.acc_buff_bytes=98304: must hold a power-of-two number"),
    ({"out_buff_bytes": 8 * 1024}, r"AccelConfig.out_buff_bytes=8192: the output buffer mirrors"),
    ({"cmd_queue_depth": 3}, r"AccelConfig.cmd_queue_depth=3: must be a power of two in \[2, 4096\]"),
    ({"clock_mhz": 0.5}, r"AccelConfig.clock_mhz=0.5: allowed range is \[1, 1000\]"),
    ({"batch": "1"}, r"AccelConfig.batch='1': must be an integer"),
])
def test_config_invalid_names_key_value_and_range(changes, match):
    with pytest.raises(ConfigError, match=match):
        dataclasses.replace(PRESETS["default"], **changes)


def test_config_unknown_key_and_bad_json():
    with pytest.raises(ConfigError, match="unknown key\\(s\\) 'blok_in'; allowed keys are"):
        AccelConfig.from_dict({"blok_in": 16})
    with pytest.raises(ConfigError, match="invalid JSON"):
        AccelConfig.from_json("{")


def test_asm_errors_name_the_line():
    with pytest.raises(AsmError, match="line 2: unknown mnemonic 'jump'"):
        assemble_text("finish\njump 3\n")
    with pytest.raises(AsmError, match="line 1: unknown load kind 'foo'"):
        assemble_text("load foo sram_base=1")
    with pytest.raises(AsmError, match="line 1: gemm has no field 'imm'"):
        assemble_text("gemm imm=3")
    with pytest.raises(AsmError, match="line 1: .*x_size=70000 outside the 16-bit range"):
        assemble_text("load inp x_size=70000", PRESETS["tiny"])


def test_program_file_roundtrip_and_config_check(tmp_path):
    cfg = PRESETS["tiny"]
    prog = Program(cfg, [Load(mem_type=MemType.INP, y_size=1, x_size=2, x_stride=2), Finish()],
                   insn_addr=0x100, dram_bytes=4096, segments=[(0x200, b"\x01\x02")])
    p = tmp_path / "p.accp"
    prog.save(p)
    back = Program.load(p, cfg)
    assert back.insns == prog.insns and back.segments == prog.segments and back.insn_addr == 0x100
    assert (back.dram_image() == prog.dram_image()).all()
    with pytest.raises(ProgramFormatError, match="built for another config; differing keys .*block_in=4 vs 16"):
        Program.load(p, PRESETS["default"])
    p.write_bytes(p.read_bytes()[:-1])
    with pytest.raises(ProgramFormatError, match="truncated"):
        Program.load(p)
    p.write_bytes(b"garbage" * 4)
    with pytest.raises(ProgramFormatError, match="bad magic"):
        Program.load(p)


def test_program_save_leaves_no_partial_file(tmp_path):
    cfg = PRESETS["tiny"]
    p = tmp_path / "bad.accp"
    with pytest.raises(EncodingError):
        Program(cfg, [Gemm(dst_factor_out=1 << 20)]).save(p)
    assert not p.exists() and not list(tmp_path.iterdir())
