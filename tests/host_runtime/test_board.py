"""The board driver (host_runtime/drivers/board.py): relocation, its register protocol against an
in-process fake board (fsim behind the register map), the Linux back end's plumbing on fake
sysfs/dev files, and the virtual board (the same driver against the Verilated shell) against fsim
and the rtl driver on random programs and a compiled model (tiny config)."""
import sys
import types
from contextlib import closing
from pathlib import Path

import numpy as np
import pytest

import compiler
from accel.hw.params import ErrorCode
from accel.isa import PRESETS, Finish, Load, MemType, Store, decode_program, encode_program
from accel.isa.isa import elem_bytes
from compiler.accel.conv2d import Requant, run_dense
from compiler.frontend import zoo
from host_runtime import Device, get_driver
from host_runtime.drivers.board import (
    BoardBackend,
    BoardDriver,
    BoardError,
    BoardFault,
    DmaBuffer,
    LinuxBackend,
    relocate,
)
from host_runtime.executor import Executor
from sim.errors import ProgramFault
from sim.verilator.build import tools_available

sys.path.insert(1, str(Path(__file__).resolve().parents[1]))
from randprog import random_program  # noqa: E402

TINY = PRESETS["tiny"]
R = {"CTRL": 0x00, "STATUS": 0x04, "INSN_ADDR_LO": 0x08, "INSN_ADDR_HI": 0x0C, "INSN_COUNT": 0x10, "CONFIG_ID": 0x14}


# ---- relocation --------------------------------------------------------------------------------------
def test_relocate_moves_every_dram_address_by_the_base():
    prog, _ = random_program(TINY, 3)
    base = 0x40000
    moved = decode_program(relocate(TINY, prog.insns, base).reshape(-1), TINY)
    n = 0
    for a, b in zip(prog.insns, moved):
        if isinstance(a, (Load, Store)):
            eb = elem_bytes(TINY, a.mem_type if isinstance(a, Load) else MemType.OUT)
            assert b.dram_base * eb == a.dram_base * eb + base
            n += 1
        else:
            assert a == b
    assert n > 0
    assert np.array_equal(relocate(TINY, prog.insns, 0).reshape(-1), prog.dram_image()[
        prog.insn_addr:prog.insn_addr + 16 * len(prog.insns)])


def test_relocate_past_the_address_width_names_the_instruction():
    prog, _ = random_program(TINY, 3)
    with pytest.raises(BoardError, match=r"instruction \d+ \((LOAD|STORE)\).*dram_addr_width"):
        relocate(TINY, prog.insns, (1 << TINY.dram_addr_width) - 4096)


# ---- the driver's protocol against a fake board ---------------------------------------------------------
class _Buf(DmaBuffer):
    def __init__(self, mem, base, n):
        self.array = mem[base:base + n]
        self.phys_addr = base
        self.flushes = self.invalidates = 0

    def flush(self):
        self.flushes += 1

    def invalidate(self):
        self.invalidates += 1


class FakeBoard(BoardBackend):
    """fsim behind the register map: a start runs the program at INSN_ADDR over the whole physical
    memory (so relocation must be right). mode: "ok", "error" (bus error), "hang" (never done)."""
    name = "fake"

    def __init__(self, cfg, base=0x20000, mode="ok", config_id=None):
        self.cfg, self.base, self.mode = cfg, base, mode
        self.mem = np.zeros(base + (4 << 20), np.uint8)
        self.regs = {R["CONFIG_ID"]: int(cfg.digest()[:8], 16) if config_id is None else config_id}
        self.status = 0
        self.writes = []
        self.fsim = get_driver("fsim", cfg)

    def read32(self, off):
        if off == R["STATUS"]:
            return self.status
        return self.regs.get(off, 0)

    def write32(self, off, v):
        self.writes.append((off, v))
        if off == R["CTRL"] and v & 1:
            if self.mode == "ok":
                addr = self.regs[R["INSN_ADDR_LO"]] | self.regs[R["INSN_ADDR_HI"]] << 32
                self.fsim.run(self.mem, addr, self.regs[R["INSN_COUNT"]])
                self.status = 2
            elif self.mode == "bus":
                self.status = 2 | 4
            elif self.mode == "fault":
                self.status = 2 | 8
                self.regs[0x18], self.regs[0x1C] = 3, 1          # ERROR = SRAM_RANGE, ERROR_INSN = 1
            else:
                self.status = 1
        elif off == R["STATUS"]:
            self.status &= ~v & ~8
        elif off == 0x24 and v & 1:                              # SOFT_RESET
            self.status = 0
            self.resets = getattr(self, "resets", 0) + 1
        else:
            self.regs[off] = v

    def alloc(self, n):
        if self.base + n > self.mem.size:
            raise BoardError("too big")
        return _Buf(self.mem, self.base, n)


def test_board_driver_relocates_and_leaves_fsims_dram():
    board = FakeBoard(TINY)
    ref = get_driver("fsim", TINY)    # on-chip buffers persist between runs, on both sides
    with closing(BoardDriver(TINY, backend=board)) as drv:
        for seed in (0, 5):
            prog, _ = random_program(TINY, seed)
            want, got = prog.dram_image(), prog.dram_image()
            ref.run(want, prog.insn_addr, len(prog.insns))
            res = drv.run(got, prog.insn_addr, len(prog.insns))
            assert np.array_equal(got, want)
            assert res.driver == "board" and res.insn_count == len(prog.insns)
        assert drv._buf.flushes == 2 and drv._buf.invalidates == 2
        # the device saw relocated addresses: INSN_ADDR is the buffer's base plus the program's offset
        assert (R["INSN_ADDR_LO"], board.base + prog.insn_addr) in board.writes


def test_board_driver_refuses_another_bitstreams_config():
    with pytest.raises(BoardError, match="CONFIG_ID is 0x12345678.*accel build --config"):
        BoardDriver(TINY, backend=FakeBoard(TINY, config_id=0x12345678))


def test_board_driver_reports_faults_and_bus_errors_and_resets():
    prog, _ = random_program(TINY, 0)
    board = FakeBoard(TINY, mode="fault")
    with closing(BoardDriver(TINY, backend=board)) as drv:
        assert board.regs[0x20] == 1 << 20                       # WATCHDOG set at open
        with pytest.raises(BoardFault, match=r"instruction 1: SRAM_RANGE .*STATUS=0xa.*reset") as e:
            drv.run(prog.dram_image(), prog.insn_addr, len(prog.insns))
        assert isinstance(e.value, ProgramFault) and e.value.code == ErrorCode.SRAM_RANGE and e.value.index == 1
        assert board.status == 0 and board.resets == 1
    board = FakeBoard(TINY, mode="bus")
    with closing(BoardDriver(TINY, backend=board, watchdog=0)) as drv:
        assert board.regs[0x20] == 0
        with pytest.raises(BoardError, match=r"AXI error response.*STATUS=0x6"):
            drv.run(prog.dram_image(), prog.insn_addr, len(prog.insns))
        assert board.status == 0 and board.resets == 1


def test_board_driver_times_out_and_resets():
    board = FakeBoard(TINY, mode="hang")
    prog, _ = random_program(TINY, 0)
    with closing(BoardDriver(TINY, backend=board, timeout_s=0.2)) as drv:
        with pytest.raises(BoardError, match="did not raise done within 0.2 s"):
            drv.run(prog.dram_image(), prog.insn_addr, len(prog.insns))


def test_board_driver_refuses_transfers_outside_the_dram():
    """The accelerator reaches all physical memory: a STORE (or LOAD) past the Device's DRAM never
    reaches the board, and the board is not started."""
    board = FakeBoard(TINY)
    for insn in (Store(dram_base=8192 // 4, y_size=1, x_size=1, x_stride=1),
                 Load(mem_type=MemType.WGT, dram_base=0, y_size=3, x_size=1, x_stride=300)):
        dram = np.zeros(8192, np.uint8)
        dram[:32] = encode_program([insn, Finish()], TINY).reshape(-1)
        with closing(BoardDriver(TINY, backend=board)) as drv:
            with pytest.raises(BoardError, match=r"instruction 0 \((STORE|LOAD)\).*beyond the 0x2000-byte DRAM"):
                drv.run(dram, 0, 2)
    assert not any(off == R["CTRL"] for off, _ in board.writes)


def test_board_driver_misaligned_buffer_is_refused():
    board = FakeBoard(TINY, base=0x20008)
    prog, _ = random_program(TINY, 0)
    with closing(BoardDriver(TINY, backend=board)) as drv:
        for _ in range(2):          # the refused buffer is not kept for the next run
            with pytest.raises(BoardError, match="not aligned"):
                drv.run(prog.dram_image(), prog.insn_addr, len(prog.insns))
    assert not any(off == R["CTRL"] for off, _ in board.writes)


def test_unknown_backend_and_missing_pynq():
    with pytest.raises(BoardError, match="unknown board backend 'xyz'"):
        BoardDriver(TINY, backend="xyz")
    try:
        import pynq  # noqa: PLC0415, F401 - optional dep pynq (on the board)
    except ImportError:
        with pytest.raises(BoardError, match="needs the pynq package"):
            BoardDriver(TINY, backend="pynq")


# ---- the Linux back end's plumbing (fake /sys and /dev) ----------------------------------------------
def _fake_linux(root: Path, dma_size=1 << 16):
    (root / "sys/class/uio/uio3/maps/map0").mkdir(parents=True)
    (root / "sys/class/uio/uio3/name").write_text("accel\n")
    (root / "sys/class/uio/uio3/maps/map0/size").write_text("0x10000\n")
    (root / "dev").mkdir()
    regs = np.zeros(0x10000 // 4, np.uint32)
    regs[R["CONFIG_ID"] // 4] = int(TINY.digest()[:8], 16)
    (root / "dev/uio3").write_bytes(regs.tobytes())
    d = root / "sys/class/u-dma-buf/udmabuf0"
    d.mkdir(parents=True)
    (d / "phys_addr").write_text("0x1f000000\n")
    (d / "size").write_text(f"{dma_size}\n")
    (root / "dev/udmabuf0").write_bytes(bytes(dma_size))
    return d


def test_linux_backend_maps_uio_by_name_and_syncs_udmabuf(tmp_path):
    d = _fake_linux(tmp_path)
    b = LinuxBackend(TINY, uio="accel", root=str(tmp_path))
    try:
        assert b.read32(R["CONFIG_ID"]) == int(TINY.digest()[:8], 16)
        b.write32(R["INSN_COUNT"], 1234)
        assert b.read32(R["INSN_COUNT"]) == 1234
        buf = b.alloc(4096)
        assert buf.phys_addr == 0x1F000000 and buf.array.size == 4096
        buf.array[:4] = [1, 2, 3, 4]
        buf.flush()
        assert (d / "sync_for_device").read_text() == "1" and (d / "sync_size").read_text() == "4096"
        buf.invalidate()
        assert (d / "sync_direction").read_text() == "2"
        with pytest.raises(BoardError, match="holds 65536"):
            b.alloc(1 << 20)
    finally:
        b.close()
    assert np.frombuffer((tmp_path / "dev/uio3").read_bytes(), np.uint32)[R["INSN_COUNT"] // 4] == 1234


def test_linux_backend_errors_name_the_missing_device(tmp_path):
    _fake_linux(tmp_path)
    with pytest.raises(BoardError, match="no UIO device 'other'"):
        LinuxBackend(TINY, uio="other", root=str(tmp_path))
    with pytest.raises(BoardError, match="no u-dma-buf device 'udmabuf7'"):
        LinuxBackend(TINY, uio="uio3", udmabuf="udmabuf7", root=str(tmp_path))


# ---- the virtual board --------------------------------------------------------------------------------
rtl = pytest.mark.skipif(tools_available() is not None, reason=f"vboard: {tools_available()}")


@pytest.fixture(scope="module")
def boards():
    """fsim, rtl and vboard drivers shared by the module (the Verilator builds are cached)."""
    drivers = {"fsim": get_driver("fsim", TINY), "rtl": get_driver("rtl", TINY), "vboard": get_driver("vboard", TINY)}
    yield drivers
    for d in drivers.values():
        d.close()


@pytest.mark.rtl
@rtl
@pytest.mark.parametrize("seed", range(6))
def test_vboard_random_programs_equal_fsim_and_rtl_counters(boards, seed):
    prog, _ = random_program(TINY, 40 + seed)
    images, res = {}, {}
    for name, drv in boards.items():
        images[name] = prog.dram_image()
        res[name] = drv.run(images[name], prog.insn_addr, len(prog.insns))
    for name in ("rtl", "vboard"):
        bad = np.flatnonzero(images[name] != images["fsim"])
        assert bad.size == 0, f"{name}: DRAM differs from fsim at {bad.size} bytes, first {bad[:1]}"
    assert res["vboard"].cycles == res["rtl"].cycles > 0
    assert res["vboard"].stats == res["rtl"].stats


@pytest.mark.rtl
@rtl
def test_vboard_runs_a_compiled_model_like_fsim_and_rtl():
    """A compiled residual block (tiny config) through the executor: vboard's outputs equal fsim's,
    and per accelerator step its cycles equal the rtl driver's."""
    m = zoo.residual_block()
    feeds = zoo.sample_inputs(m, 3, seed=4)
    mod = compiler.build_model(m, target="accel", config="tiny", calibration=feeds[:2])
    outs, prof = {}, {}
    for drv in ("fsim", "rtl", "vboard"):
        with Executor(mod, driver=drv) as ex:
            outs[drv] = ex.run(feeds[2])
            prof[drv] = [r for r in ex.profile if r["target"] == "accel"]
    for k in outs["fsim"]:
        np.testing.assert_array_equal(outs["vboard"][k], outs["fsim"][k], err_msg=f"vboard: output {k}")
    assert len(prof["vboard"]) >= 2
    assert [r["cycles"] for r in prof["vboard"]] == [r["cycles"] for r in prof["rtl"]]
    assert all(r["cycles"] > 0 for r in prof["vboard"])


@pytest.mark.rtl
@rtl
def test_vboard_fault_matches_fsim_and_the_core_recovers(boards):
    """A STORE with padding faults (BAD_FIELD): vboard raises the code and instruction index fsim
    raises, soft-resets the core, and the next program runs as on fsim."""
    bad = [Load(mem_type=MemType.INP, dram_base=0, y_size=1, x_size=1, x_stride=1),
           Store(dram_base=64, y_size=1, x_size=1, x_stride=1, y_pad0=1), Finish()]
    codes = {}
    for name in ("fsim", "vboard"):
        dram = np.zeros(8192, np.uint8)
        dram[4096:4096 + 48] = encode_program(bad, TINY).reshape(-1)
        with pytest.raises(ProgramFault) as e:
            boards[name].run(dram, 4096, len(bad))
        codes[name] = (e.value.code, e.value.index)
    assert codes["vboard"] == codes["fsim"]
    rng = np.random.default_rng(1)
    x, w = rng.integers(-128, 128, (6, 40), dtype=np.int8), rng.integers(-128, 128, (24, 40), dtype=np.int8)
    y, res, _ = run_dense(Device(TINY, driver=boards["vboard"], dram_bytes=1 << 20), x, w, None, Requant(6))
    with Device(TINY, driver="fsim", dram_bytes=1 << 20) as local:
        want, _, _ = run_dense(local, x, w, None, Requant(6))
    assert np.array_equal(y, want) and res.cycles > 0


@pytest.mark.rtl
@rtl
def test_vboard_hang_ends_in_watchdog_fault_or_timeout_and_recovers():
    """A LOAD popping a token nobody pushes hangs the core: with the watchdog the run ends in a
    WATCHDOG fault, without it in the driver's timeout; both soft-reset the core and the next
    program runs. Also: another DRAM timing and phys_base 0, cycles equal to rtl's."""
    hang = [Load(mem_type=MemType.INP, dram_base=0, y_size=1, x_size=1, x_stride=1, pop_next=True), Finish()]
    dram_model = {"read_latency": 12, "write_latency": 5, "bytes_per_cycle": 3}
    prog, _ = random_program(TINY, 11)
    with closing(get_driver("rtl", TINY, dram=dram_model)) as rtl_drv:
        want = prog.dram_image()
        want_res = rtl_drv.run(want, prog.insn_addr, len(prog.insns))
    for options in ({"watchdog": 2000}, {"watchdog": 0, "timeout_s": 1.0}):
        with closing(get_driver("vboard", TINY, dram=dram_model, phys_base=0, **options)) as drv:
            dram = np.zeros(8192, np.uint8)
            dram[4096:4096 + 32] = encode_program(hang, TINY).reshape(-1)
            if options["watchdog"]:
                with pytest.raises(BoardFault) as e:
                    drv.run(dram, 4096, 2)
                assert e.value.code == ErrorCode.WATCHDOG
            else:
                with pytest.raises(BoardError, match="did not raise done within 1 s.*reset"):
                    drv.run(dram, 4096, 2)
            got = prog.dram_image()
            res = drv.run(got, prog.insn_addr, len(prog.insns))
            assert np.array_equal(got, want) and res.cycles == want_res.cycles


def test_pynq_backend_with_a_stand_in_pynq_module(tmp_path, monkeypatch):
    """The PYNQ back end's plumbing against a stand-in `pynq` (Overlay, MMIO, allocate): it picks the
    accel IP, maps its registers, allocates, flushes before and invalidates after each run, and
    the driver's run leaves fsim's DRAM bytes (fsim behind the fake registers)."""
    fake = FakeBoard(TINY, base=0x30000)
    calls = []

    class MMIO:
        def __init__(self, addr, size):
            calls.append(("mmio", addr, size))

        def read(self, off):
            return fake.read32(off)

        def write(self, off, v):
            fake.write32(off, v)

    class Buf(np.ndarray):
        def flush(self):
            calls.append("flush")

        def invalidate(self):
            calls.append("invalidate")

        def freebuffer(self):
            calls.append("free")

    def allocate(shape, dtype):
        b = fake.mem[fake.base:fake.base + shape[0]].view(Buf)
        b.physical_address = fake.base
        return b

    class Overlay:
        def __init__(self, path):
            calls.append(("overlay", path))
            self.ip_dict = {"accel_0": {"phys_addr": 0x43C00000, "addr_range": 0x10000}, "axi_intc": {}}

    monkeypatch.setitem(sys.modules, "pynq", types.SimpleNamespace(Overlay=Overlay, MMIO=MMIO, allocate=allocate))
    bit = tmp_path / "accel.bit"
    bit.write_bytes(b"bit")
    with pytest.raises(BoardError, match="give the bitstream"):
        BoardDriver(TINY, backend="pynq")
    ref = get_driver("fsim", TINY)
    with closing(get_driver("board", TINY, bitstream=str(bit))) as drv:     # pynq is "installed": picked
        assert drv.backend.name == "pynq"
        prog, _ = random_program(TINY, 2)
        want, got = prog.dram_image(), prog.dram_image()
        ref.run(want, prog.insn_addr, len(prog.insns))
        drv.run(got, prog.insn_addr, len(prog.insns))
        assert np.array_equal(got, want)
    assert ("overlay", str(bit)) in calls and ("mmio", 0x43C00000, 0x10000) in calls
    assert calls.index("flush") < calls.index("invalidate") and calls[-1] == "free"
