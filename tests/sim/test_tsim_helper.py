"""The tsim driver's timing model in a helper process (sim/tsim/helper.py): the same cycles,
counters, timelines, DRAM bytes and errors as in-process, and a fall-back when the helper fails."""
import logging
import os
import signal
import time

import numpy as np
import pytest
from randprog import random_program

from accel.isa import PRESETS, Finish, Load, MemType, encode_program
from host_runtime import get_driver
from host_runtime.errors import DriverError
from sim.dram import DramModel
from sim.errors import CycleLimitError, ExecError, SimError
from sim.tsim import helper

TINY = PRESETS["tiny"]


@pytest.fixture
def ready_helper():
    """A fresh, started helper (skips where this machine runs none: one core, not POSIX)."""
    helper.reset()
    if not helper.enabled():
        pytest.skip("no tsim helper on this machine (one core or not POSIX)")
    assert helper.start(wait=60), "the helper did not start within 60 s"
    yield
    helper.reset()


def _run(drv, image, addr, count):
    dram = image.copy()
    res = drv.run(dram, addr, count)
    return res, dram


def _same(a, b):
    (ra, da), (rb, db) = a, b
    assert ra.cycles == rb.cycles
    assert ra.stats == rb.stats
    assert np.array_equal(da, db)
    if ra.raw.timeline is not None:
        assert ra.raw.timeline.slices == rb.raw.timeline.slices
        assert ra.raw.timeline.bursts == rb.raw.timeline.bursts


@pytest.mark.parametrize("cfg", [TINY, PRESETS["default"]], ids=["tiny", "default"])
@pytest.mark.parametrize("dram", [None, {"read_latency": 7, "bytes_per_cycle": 3}], ids=["dram", "throttled"])
def test_helper_gives_the_in_process_results(ready_helper, cfg, dram):
    """Random programs, traced and not: every run in the helper matches the in-process model exactly."""
    for trace in (False, True):
        here = get_driver("tsim", cfg, dram=dram, trace=trace, helper=False)
        there = get_driver("tsim", cfg, dram=dram, trace=trace)
        for seed in range(6):
            prog, _ = random_program(cfg, seed)
            image, addr, count = prog.dram_image(), prog.insn_addr, len(prog.insns)
            a, b = _run(here, image, addr, count), _run(there, image, addr, count)
            assert not a[0].raw.model_in_helper and b[0].raw.model_in_helper
            _same(a, b)


def test_helper_raises_the_model_errors(ready_helper):
    """A cycle limit the model hits comes back as the same error, message included; the helper
    goes on serving runs after it."""
    prog, _ = random_program(TINY, 3)
    image, addr, count = prog.dram_image(), prog.insn_addr, len(prog.insns)
    msgs = []
    for use in (False, True):
        drv = get_driver("tsim", TINY, max_cycles=50, helper=use)
        with pytest.raises(CycleLimitError) as e:
            drv.run(image.copy(), addr, count)
        msgs.append(str(e.value))
    assert msgs[0] == msgs[1]
    res, _ = _run(get_driver("tsim", TINY), image, addr, count)
    assert res.raw.model_in_helper


def test_helper_reply_is_drained_when_fsim_fails(ready_helper):
    """fsim rejects the program (a load past the buffer) after the model run was sent: the model's
    reply is read and dropped, so the next run gets its own reply."""
    bad = [Load(mem_type=MemType.INP, sram_base=TINY.inp_depth - 1, dram_base=0, y_size=1, x_size=4, x_stride=4),
           Finish()]
    dram = np.zeros(1 << 16, np.uint8)
    code = encode_program(bad, TINY).reshape(-1)
    dram[0x1000:0x1000 + code.size] = code
    drv = get_driver("tsim", TINY)
    with pytest.raises(ExecError, match="exceeds the INP buffer depth"):
        drv.run(dram, 0x1000, len(bad))
    prog, _ = random_program(TINY, 4)
    image, addr, count = prog.dram_image(), prog.insn_addr, len(prog.insns)
    a = _run(get_driver("tsim", TINY, helper=False), image, addr, count)
    b = _run(drv, image, addr, count)
    assert b[0].raw.model_in_helper
    _same(a, b)


def test_dead_helper_falls_back_in_process(ready_helper, caplog):
    """A helper killed under the driver: the run still returns the model's results (computed here),
    with one warning; helper runs are off until reset()."""
    prog, _ = random_program(TINY, 5)
    image, addr, count = prog.dram_image(), prog.insn_addr, len(prog.insns)
    ref = _run(get_driver("tsim", TINY, helper=False), image, addr, count)
    drv = get_driver("tsim", TINY)
    helper._helper.proc.kill()
    helper._helper.proc.wait()
    with caplog.at_level(logging.WARNING, logger="sim.tsim.helper"):
        res = _run(drv, image, addr, count)
    assert not res[0].raw.model_in_helper
    _same(ref, res)
    assert "in-process from now on" in caplog.text
    assert not helper.enabled()
    assert not _run(drv, image, addr, count)[0].raw.model_in_helper
    helper.reset()
    assert helper.start(wait=60)
    assert _run(drv, image, addr, count)[0].raw.model_in_helper


def test_helper_switch_rejects_bad_values(monkeypatch):
    """A misspelt ACCEL_TSIM_HELPER or a non-bool helper option is an error naming it, not a guess."""
    with pytest.raises(DriverError, match="helper='no' must be True or False"):
        get_driver("tsim", TINY, helper="no")
    monkeypatch.setenv("ACCEL_TSIM_HELPER", "maybe")
    with pytest.raises(SimError, match="ACCEL_TSIM_HELPER='maybe': expected one of"):
        helper.enabled()
    prog, _ = random_program(TINY, 1)
    with pytest.raises(SimError, match="ACCEL_TSIM_HELPER"):
        get_driver("tsim", TINY).run(prog.dram_image(), prog.insn_addr, len(prog.insns))


def test_helper_off_by_environment(monkeypatch):
    monkeypatch.setenv("ACCEL_TSIM_HELPER", "0")
    assert not helper.enabled() and not helper.start()
    prog, _ = random_program(TINY, 1)
    res, _ = _run(get_driver("tsim", TINY), prog.dram_image(), prog.insn_addr, len(prog.insns))
    assert not res.raw.model_in_helper and res.cycles > 0


def test_interrupted_run_stops_the_helper_without_giving_up(ready_helper):
    """cancel(wait=False), what an interrupt during fsim does: the helper is killed (its reply would
    be out of step), but the next submit starts a new one."""
    prog, _ = random_program(TINY, 2)
    program = prog.dram_image()[prog.insn_addr:prog.insn_addr + 16 * len(prog.insns)].tobytes()
    job = helper.submit(TINY, DramModel(), program, prog.insn_addr, 1 << 40, False)
    assert job is not None
    old = helper._helper
    job.cancel(wait=False)
    assert helper._helper is None and old.proc.wait(timeout=10) is not None
    assert helper.enabled()
    assert helper.start(wait=60) and helper._helper is not old


def test_helper_ignores_ctrl_c(ready_helper):
    """Ctrl-C in a terminal signals the whole process group: the helper leaves it to its parent."""
    os.kill(helper._helper.proc.pid, signal.SIGINT)
    time.sleep(0.3)
    prog, _ = random_program(TINY, 6)
    res, _ = _run(get_driver("tsim", TINY), prog.dram_image(), prog.insn_addr, len(prog.insns))
    assert res.raw.model_in_helper
