"""host_runtime.device: the driver registry, the fsim driver, Device."""
import numpy as np
import pytest

from accel.isa import PRESETS, Finish, Gemm, Stage, encode_program
from host_runtime import Device, Driver, DriverError, RunResult, available_drivers, get_driver, register_driver
from host_runtime.device import _DRIVERS
from sim.errors import ExecError

TINY = PRESETS["tiny"]


def test_driver_lookup_failure_lists_registered_names():
    with pytest.raises(DriverError) as e:
        get_driver("no-such-driver", TINY)
    assert "no-such-driver" in str(e.value) and "fsim" in str(e.value)


def test_driver_registry_takes_new_drivers_and_rejects_name_clashes():
    @register_driver("test-null")
    class NullDriver(Driver):
        def run(self, dram, insn_addr, insn_count):
            return RunResult(self.name, insn_count, 0.0, {"insns": {}})
    try:
        assert "test-null" in available_drivers()
        d = get_driver("test-null", TINY)
        assert d.run(np.zeros(16, np.uint8), 0, 3).insn_count == 3
        with pytest.raises(DriverError, match="already registered"):
            register_driver("test-null")(type("Other", (NullDriver,), {}))
        with pytest.raises(DriverError, match="takes no options"):
            get_driver("test-null", TINY, speed=3)
    finally:
        _DRIVERS.pop("test-null", None)


def test_fsim_driver_runs_a_program_in_dram():
    drv = get_driver("fsim", TINY)
    dram = np.zeros(4096, np.uint8)
    code = encode_program([Gemm(), Finish()], TINY).reshape(-1)
    dram[256:256 + code.size] = code
    r = drv.run(dram, 256, 2)
    assert r.driver == "fsim" and r.insn_count == 2 and r.cycles is None
    assert r.stats["insns"] == {"GEMM": 1, "FINISH": 1} and r.wall_s >= 0
    assert set(r.to_dict()) == {"driver", "insn_count", "wall_s", "stats", "cycles"}


def test_fsim_driver_passes_simulator_errors_through():
    drv = get_driver("fsim", TINY)
    with pytest.raises(ExecError, match="outside"):
        drv.run(np.zeros(64, np.uint8), 0, 10)


def test_device_without_driver_builds_but_does_not_run():
    dev = Device(TINY, driver=None, dram_bytes=1 << 16)
    s = dev.stream()
    s.dep_push(Stage.COMPUTE, Stage.STORE)
    s.dep_pop(Stage.COMPUTE, Stage.STORE)
    prog = s.program()
    assert isinstance(prog.insns[-1], Finish)
    with pytest.raises(DriverError, match="driver=None"):
        dev.stream().synchronize()


def test_device_rejects_dram_beyond_address_width():
    with pytest.raises(DriverError, match="dram_addr_width"):
        Device(TINY.replace(dram_addr_width=16), dram_bytes=1 << 17)
