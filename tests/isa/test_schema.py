"""Schema validation of configurations and program files: every crafted field is refused with one
line naming the field, the value and the allowed range; documented maxima hold before allocating."""
import json
import struct

import numpy as np
import pytest

import accel.isa.asm as asm
from accel.cli import main
from accel.isa import (
    PRESETS,
    AccelConfig,
    Alu,
    AluOp,
    AsmError,
    ConfigError,
    EncodingError,
    Finish,
    Gemm,
    Load,
    MemType,
    Program,
    ProgramFormatError,
    Store,
    Symbol,
    Uop,
    assemble_file,
    assemble_text,
    disassemble,
    encode_insn,
    encode_program,
    encode_uops,
    resolve_config,
)
from accel.isa.config import MAX_BUFF_BYTES, MAX_ONCHIP_BYTES
from accel.isa.program import MAX_DRAM_BYTES, MAX_INSNS
from accel.isa.schema import Fields, json_depth, parse_json

TINY = PRESETS["tiny"]


# ---- JSON parsing -------------------------------------------------------------------------------
def test_schema_json_tolerates_a_bom():
    assert AccelConfig.from_json(b"\xef\xbb\xbf" + TINY.to_json().encode()) == TINY


def test_schema_json_depth_ignores_brackets_in_strings():
    assert json_depth(b'{"a": [1, {"b": "[[[{{{\\"]]]"}]}') == 3
    assert json_depth(b"1") == 0


@pytest.mark.parametrize("data, match", [
    (b'{"a": \xff}', r"cfg.json: not UTF-8 text \(byte 0xff at offset 6\)"),
    (b"[" * 100_000 + b"]" * 100_000, "cfg.json: JSON nested 100000 levels deep, more than the 64 allowed"),
    (b'{"a": NaN}', r"cfg.json: invalid JSON \(NaN is not a JSON number\)"),
    (b'{"a": -Infinity}', "invalid JSON"),
    (b'{"a": 1' + b"1" * 5000 + b"}", "invalid JSON"),
    (b'{"a": 1', "invalid JSON"),
])
def test_schema_parse_json_refuses_with_one_line(data, match):
    with pytest.raises(ConfigError, match=match) as e:
        parse_json(data, "cfg.json", ConfigError)
    assert "\n" not in str(e.value)


def test_schema_fields_name_field_value_and_range():
    f = Fields({"n": None, "s": "x" * 500, "b": 1}, "hdr", ProgramFormatError)
    with pytest.raises(ProgramFormatError, match=r"^hdr.n=None: must be an integer in \[0, 10\]$"):
        f.int("n", 0, 10)
    with pytest.raises(ProgramFormatError, match=r"hdr.s='xxx.*\.\.\.: must be a string of at most 8"):
        f.str("s", 8)
    with pytest.raises(ProgramFormatError, match="hdr.b=1: must be true or false"):
        f.bool("b")
    with pytest.raises(ProgramFormatError, match="hdr: missing key 'q'"):
        f.int("q", 0, 1)
    with pytest.raises(ProgramFormatError, match="hdr: unknown key\\(s\\) 'b', 's'; allowed keys are n"):
        f.require_keys({"n"})
    with pytest.raises(ProgramFormatError, match="hdr: expected a JSON object, got an array"):
        Fields([], "hdr", ProgramFormatError)


# ---- configurations -----------------------------------------------------------------------------
@pytest.mark.parametrize("text, match", [
    ('{"batch": null}', r"AccelConfig.batch=None: must be an integer \(a power of two in \[1, 256\]\)"),
    ('{"wgt_buff_bytes": "big"}', r"AccelConfig.wgt_buff_bytes='big': must be an integer"),
    ('{"clock_mhz": [100]}', r"AccelConfig.clock_mhz=\[100\]: must be a number \(allowed range is \[1, 1000\]\)"),
    ('{"clock_mhz": 1e400}', r"AccelConfig.clock_mhz=inf: allowed range is \[1, 1000\]"),
    ('{"batch": true}', "AccelConfig.batch=True: must be an integer"),
    ('{"block_in": 16.0}', "AccelConfig.block_in=16.0: must be an integer"),
    ('{"dram_addr_width": -1}', r"AccelConfig.dram_addr_width=-1: allowed range is \[16, 48\]"),
    ('{"wgt_buff_bytes": 67108864, "uop_buff_bytes": 1024}',
     r"AccelConfig.wgt_buff_bytes=67108864: allowed range is \[256, 1048576\] bytes"),
    ('{"inp_buff_bytes": -16}', r"AccelConfig.inp_buff_bytes=-16: allowed range is \[16, 1048576\]"),
    ('[1, 2]', "cfg.json: expected a JSON object of config keys, got an array"),
    ('{"": 1, "7": 2}', r"unknown key\(s\) '', '7'"),
])
def test_config_file_fields_checked(tmp_path, text, match):
    p = tmp_path / "cfg.json"
    p.write_text(text)
    with pytest.raises(ConfigError, match=match):
        AccelConfig.load(p)


def test_config_total_onchip_bytes_bounded():
    big = MAX_BUFF_BYTES
    with pytest.raises(ConfigError, match=rf"AccelConfig.wgt_buff_bytes={big}: the five buffers total \d+ bytes, "
                                          rf"more than the {MAX_ONCHIP_BYTES}"):
        AccelConfig(uop_buff_bytes=1024, inp_buff_bytes=4096, wgt_buff_bytes=big, acc_buff_bytes=big,
                    out_buff_bytes=big // 4)
    # the largest buffer allowed on its own still validates
    AccelConfig(uop_buff_bytes=1024, inp_buff_bytes=4096, wgt_buff_bytes=big)


def test_config_huge_int_message_stays_short():
    with pytest.raises(ConfigError, match=r"AccelConfig.batch=<integer of 16610 bits>") as e:
        AccelConfig(batch=10 ** 5000)
    assert len(str(e.value)) < 200


def test_config_cli_refuses_bad_files_with_one_line(tmp_path, capsys):
    cases = {"utf": b'{"batch": 1, "x": "\xe9"}', "deep": b"[" * 5000 + b"]" * 5000, "null": b'{"block_in": null}',
             "big": b'{"wgt_buff_bytes": 67108864, "uop_buff_bytes": 1024}'}
    for name, data in cases.items():
        p = tmp_path / f"{name}.json"
        p.write_bytes(data)
        for argv in (["config", "validate", str(p)], ["config", "show", "--config", str(p)]):
            assert main(argv) == 2
            err = capsys.readouterr().err
            assert err.startswith("error: ") and err.count("\n") == 1, err
    assert "nested 5000 levels" in (main(["config", "validate", str(tmp_path / "deep.json")]) and
                                    capsys.readouterr().err)


def test_config_resolve_odd_names_fail_cleanly():
    for spec in ("a\0b", "x" * 5000):
        with pytest.raises(ConfigError, match="neither a preset"):
            resolve_config(spec)


# ---- program files ------------------------------------------------------------------------------
def _program():
    insns = [Load(mem_type=MemType.INP, y_size=1, x_size=2, x_stride=2, push_next=True),
             Gemm(uop_end=1, reset=True, pop_prev=True), Alu(alu_op=AluOp.ADD, use_imm=True, imm=-3, uop_end=1),
             Store(y_size=1, x_size=1, x_stride=1), Finish()]
    return Program(TINY, insns, insn_addr=0x100, dram_bytes=4096, segments=[(0x200, b"\x01\x02"), (0x300, b"\x03")],
                   symbols={"out": Symbol(0x400, (2, 4), "int8")})


def _file(header_changes=None, drop=(), tail=b"", hlen_delta=0, header_text=None):
    """A valid program file with its header edited."""
    prog = _program()
    header = prog.header()
    header.update(header_changes or {})
    for k in drop:
        del header[k]
    hj = header_text if header_text is not None else json.dumps(header).encode()
    body = prog.to_bytes()
    old_hlen = struct.unpack_from("<I", body, 12)[0]
    return b"ACCPROG\0" + struct.pack("<II", 1, len(hj) + hlen_delta) + hj + body[16 + old_hlen:] + tail


def test_program_header_roundtrip_is_valid():
    back = Program.from_bytes(_file())
    assert back.insns == _program().insns and back.symbols == _program().symbols


@pytest.mark.parametrize("changes, match", [
    ({"insn_count": None}, r"p.accp: header.insn_count=None: must be an integer in \[0, 1048576\]"),
    ({"insn_count": "5"}, r"header.insn_count='5': must be an integer"),
    ({"insn_count": 5.0}, r"header.insn_count=5.0: must be an integer"),
    ({"insn_count": -1}, r"header.insn_count=-1: must be an integer in \[0, "),
    ({"insn_count": MAX_INSNS + 1}, rf"header.insn_count={MAX_INSNS + 1}: must be an integer in \[0, {MAX_INSNS}\]"),
    ({"insn_addr": -16}, r"header.insn_addr=-16: must be an integer in \[0, 4096\]"),
    ({"insn_addr": 0x108}, "header.insn_addr=264: must be a multiple of 16"),
    ({"insn_addr": 4064}, "header.insn_addr=4064: the 5 instructions end at byte 0x1030, beyond dram_bytes=0x1000"),
    ({"dram_bytes": 1 << 40}, rf"header.dram_bytes=1099511627776: must be an integer in \[0, {MAX_DRAM_BYTES}\]"),
    ({"dram_bytes": None}, "header.dram_bytes=None"),
    ({"segments": {"addr": 1}}, "header.segments={'addr': 1}: must be an array"),
    ({"segments": [{"addr": -1, "size": 2}, {"addr": 0x300, "size": 1}]},
     r"header.segments\[0\].addr=-1: must be an integer in \[0, 4096\]"),
    ({"segments": [{"addr": 0x200, "size": 2}, {"addr": 4095, "size": 1}]}, None),   # valid (and moved)
    ({"segments": [{"addr": 0x200, "size": 2}, {"addr": 4095, "size": 2}]},
     r"header.segments\[1\].size=2: must be an integer in \[0, 1\]"),
    ({"segments": [{"addr": 0x200, "size": 2}, {"addr": 0x201, "size": 1}]},
     r"header: segments\[0\] \[0x200, 0x202\) overlaps segments\[1\] \[0x201, 0x202\)"),
    ({"segments": [{"addr": 0x200, "size": 2}, {"addr": 0x140, "size": 1}]},
     r"header: the instructions \[0x100, 0x150\) overlaps segments\[1\]"),
    ({"segments": [{"addr": 0x200, "size": 2}, {"addr": 0x300}]}, r"header.segments\[1\]: missing key\(s\) 'size'"),
    ({"segments": [{"addr": 0x200, "size": 2}, [0x300, 1]]}, r"header.segments\[1\]: expected a JSON object"),
    ({"symbols": {"out": {"addr": 0, "shape": [2], "dtype": "O"}}},
     r"header.symbols\['out'\].dtype='O': allowed values are bool, int8"),
    ({"symbols": {"out": {"addr": 0, "shape": [-2], "dtype": "int8"}}},
     r"header.symbols\['out'\].shape\[0\]=-2: must be an integer in \[0, 4096\]"),
    ({"symbols": {"out": {"addr": 4000, "shape": [100], "dtype": "int32"}}},
     r"header.symbols\['out'\].shape=\[100\]: 400 bytes of int32 at 0xfa0 end beyond dram_bytes=0x1000"),
    ({"symbols": {"out": {"addr": 0, "shape": [1] * 40, "dtype": "int8"}}}, "must be an array of at most 32 items"),
    ({"symbols": {"a\nfinish": {"addr": 0, "shape": [1], "dtype": "int8"}}}, "name 'a\\\\nfinish' must be 1 to 128"),
    ({"symbols": []}, "header.symbols=\\[\\]: must be an object"),
    ({"config": {"batch": 3}}, r"header.config: AccelConfig.batch=3: must be a power of two"),
    ({"config": None}, r"header.config: AccelConfig: expected a JSON object, got NoneType"),
    ({"extra": 1}, r"header: unknown key\(s\) 'extra'"),
])
def test_program_header_fields_checked(changes, match):
    data = _file(changes)
    if match is None:
        Program.from_bytes(data, source="p.accp")
        return
    with pytest.raises(ProgramFormatError, match=match) as e:
        Program.from_bytes(data, source="p.accp")
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("kw, match", [
    ({"drop": ["insn_count"]}, r"header: missing key\(s\) 'insn_count'"),
    ({"tail": b"\0"}, r"unexpected bytes after the last segment \(the header accounts for \d+ bytes\)"),
    ({"hlen_delta": (64 << 20) + 1}, r"p.accp: header of \d+ bytes, more than the 67108864 allowed"),
    ({"hlen_delta": 10_000}, r"truncated header \(\d+ bytes announced"),
    ({"hlen_delta": -1}, "invalid JSON"),
    ({"header_text": b'{"config": "\xff"}'}, r"p.accp: header: not UTF-8 text \(byte 0xff"),
    ({"header_text": b"[" * 3000 + b"]" * 3000}, "p.accp: header: JSON nested 3000 levels deep"),
    ({"header_text": b"[1]"}, "p.accp: header: expected a JSON object, got an array"),
])
def test_program_file_structure_checked(kw, match):
    with pytest.raises(ProgramFormatError, match=match):
        Program.from_bytes(_file(**kw), source="p.accp")


def test_program_truncated_and_bad_instruction():
    data = _file()
    with pytest.raises(ProgramFormatError, match="truncated"):
        Program.from_bytes(data[:-1])
    hlen = struct.unpack_from("<I", data, 12)[0]
    bad = bytearray(data)
    bad[16 + hlen + 16] = 7   # instruction 1: opcode 7
    with pytest.raises(ProgramFormatError, match="p.accp: instruction 1: unknown opcode 7"):
        Program.from_bytes(bytes(bad), source="p.accp")


def test_program_in_memory_validated_before_allocating_or_writing(tmp_path):
    prog = _program()
    prog.dram_bytes = 1 << 40
    with pytest.raises(ProgramFormatError, match=r"program: header.dram_bytes=1099511627776: must be an integer"):
        prog.dram_image()
    with pytest.raises(ProgramFormatError, match=r"p.accp: header.dram_bytes"):
        prog.save(tmp_path / "p.accp")
    assert not list(tmp_path.iterdir())
    prog = _program()
    prog.segments.append((-5, b"x"))
    with pytest.raises(ProgramFormatError, match=r"segments\[2\].addr=-5"):
        prog.to_bytes()


def test_program_cli_crafted_files_one_line(tmp_path, capsys):
    for i, changes in enumerate([{"insn_count": None}, {"insn_addr": -16}, {"dram_bytes": "x"}]):
        p = tmp_path / f"bad{i}.accp"
        p.write_bytes(_file(changes))
        for argv in (["disasm", str(p)], ["run", str(p)]):
            assert main(argv) == 2
            err = capsys.readouterr().err
            assert err.startswith(f"error: {p}: header.") and err.count("\n") == 1, err


def test_asm_cli_non_utf8_and_negative_address(tmp_path, capsys):
    src = tmp_path / "a.s"
    src.write_bytes(b"finish # caf\xe9\n")
    assert main(["asm", str(src), "-o", str(tmp_path / "a.accp")]) == 2
    assert capsys.readouterr().err == f"error: {src}: not UTF-8 text (byte 0xe9 at offset 12)\n"
    src.write_text("load inp dram_base=-1 y_size=1 x_size=1\nfinish\n")
    assert main(["asm", str(src), "-o", str(tmp_path / "a.accp"), "--config", "tiny"]) == 2
    assert "line 1: LOAD instruction: field dram_base=-1 outside the 32-bit range" in capsys.readouterr().err
    src.write_text("finish\n")
    assert main(["asm", str(src), "-o", str(tmp_path / "a.accp"), "--insn-addr", "-16"]) == 2
    assert "header.insn_addr=-16: must be an integer" in capsys.readouterr().err
    assert not (tmp_path / "a.accp").exists()


# ---- disassembly round-trip ---------------------------------------------------------------------
def test_disasm_store_memory_type_roundtrips(tmp_path, capsys):
    insns = [Store(mem_type=m, sram_base=3, dram_base=9, y_size=1, x_size=2, x_stride=2) for m in MemType]
    text = disassemble(insns)
    assert "store acc sram_base=3" in text and "store sram_base=3" in text   # OUT stays implicit
    assert assemble_text(text, TINY) == insns
    prog = Program(TINY, insns + [Finish()], insn_addr=0, dram_bytes=4096)
    p = tmp_path / "p.accp"
    prog.save(p)
    assert main(["disasm", "--plain", str(p)]) == 0
    src = tmp_path / "p.s"
    src.write_text(capsys.readouterr().out)
    assert main(["asm", str(src), "-o", str(tmp_path / "q.accp"), "--config", "tiny", "--insn-addr", "0",
                 "--dram-bytes", "4096"]) == 0
    assert Program.load(tmp_path / "q.accp").insns == prog.insns


def test_config_oversized_refused_before_elaborating(tmp_path, capsys):
    """The 64 MiB weight buffer that made `accel verilog` exhaust 3.9 GB fails at once, naming the file."""
    p = tmp_path / "big.json"
    p.write_text(json.dumps({"wgt_buff_bytes": 64 << 20, "uop_buff_bytes": 1024}))
    assert main(["verilog", "--config", str(p), "-o", str(tmp_path / "v")]) == 2
    assert capsys.readouterr().err == (f"error: {p}: AccelConfig.wgt_buff_bytes=67108864: allowed range is "
                                       f"[256, 1048576] bytes (one 256-byte entry to 1 MiB)\n")
    assert not (tmp_path / "v").exists()


def test_inputs_read_bounded_from_endless_files(tmp_path):
    """/dev/zero named as a config, program or assembly file: refused after a bounded read."""
    with pytest.raises(ConfigError, match="/dev/zero: more than 1048576 bytes"):
        AccelConfig.load("/dev/zero")
    with pytest.raises(AsmError, match="/dev/zero: more than 268435456 bytes"):
        assemble_file("/dev/zero")
    with pytest.raises(ProgramFormatError, match="/dev/zero: not a program file"):
        Program.load("/dev/zero")
    with pytest.raises(ProgramFormatError, match=f"cannot read {tmp_path}"):
        Program.load(tmp_path)
    with pytest.raises(ConfigError, match=f"cannot read {tmp_path}"):
        AccelConfig.load(tmp_path)


def test_asm_instruction_count_bounded(monkeypatch):
    monkeypatch.setattr(asm, "MAX_INSNS", 3)
    assert len(assemble_text("finish\n" * 3)) == 3
    with pytest.raises(AsmError, match="line 5: more than 3 instructions"):
        assemble_text("finish\n\nfinish\nfinish\nfinish\n")


def test_encoder_refuses_non_integer_fields():
    """Instructions and micro-ops are plain dataclasses: a None, float or string field is an
    EncodingError naming it (it was a TypeError, or silently truncated)."""
    with pytest.raises(EncodingError, match="LOAD instruction 1: field x_size=None is not an integer"):
        encode_program([Finish(), Load(x_size=None)], TINY)
    with pytest.raises(EncodingError, match="field x_size=2.0 is not an integer"):
        encode_insn(Load(x_size=2.0), TINY)
    with pytest.raises(EncodingError, match="ALU instruction: field imm='3' is not an integer"):
        encode_insn(Alu(imm="3"), TINY)
    assert encode_insn(Gemm(uop_end=np.int64(3)), TINY) == encode_insn(Gemm(uop_end=3), TINY)
    for bad in ([Uop(None, 0, 0)], [Uop(1.5, 0, 0)], [Uop(1 << 70, 0, 0)], np.zeros((2, 3))):
        with pytest.raises(EncodingError, match="micro-ops: micro-op fields must be integers"):
            encode_uops(bad, TINY)


def test_asm_cli_data_and_dram_bounded(tmp_path, capsys):
    src = tmp_path / "a.s"
    src.write_text("finish\n")
    out = str(tmp_path / "a.accp")
    cases = [(["--data", "0=/dev/zero", "--dram-bytes", "4096"],
              "error: --data '0=/dev/zero': /dev/zero: more than 4096 bytes"),
             ([f"--data=-64={src}"], "address -0x40 outside the DRAM"),
             (["--dram-bytes", str(1 << 40)], "--dram-bytes 1099511627776: allowed range is [1, 1073741824]"),
             (["--dram-bytes=-1"], "--dram-bytes -1: allowed range")]
    bad_npy = tmp_path / "x.npy"
    bad_npy.write_bytes(b"\x93NUMPY\x01\x00" + b"\xff" * 20)
    cases.append((["--data", f"0={bad_npy}"], "is not a valid .npy file"))
    for extra, want in cases:
        assert main(["asm", str(src), "-o", out, *extra]) == 2
        err = capsys.readouterr().err
        assert want in err and err.count("\n") == 1, err
    assert not (tmp_path / "a.accp").exists()
