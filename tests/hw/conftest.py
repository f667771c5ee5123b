"""Shared set-up of the RTL tests: simulator availability and the configs they run on.

RTL tests run on the `tiny` preset (1x4x4) so that CI stays fast; each Verilator/Icarus model is
built once per source hash and cached under .cache/rtl (see sim/rtl/runner.py).
"""
import pytest

from accel.isa import preset
from sim.rtl import simulators_available

AVAILABLE = simulators_available()


def require(simulator: str) -> None:
    why = AVAILABLE.get(simulator, f"unknown simulator {simulator}")
    if why:
        pytest.skip(f"{simulator}: {why}")


@pytest.fixture(scope="session")
def tiny():
    return preset("tiny")
