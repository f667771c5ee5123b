"""Shared test set-up: make the kit's packages win over same-named test folders, and let tests
import the helpers in this folder (randprog, conv_cases) by plain name.

pytest puts tests/ on sys.path; tests/host_runtime and tests/sim (folders without __init__.py)
would then be found as namespace packages shadowing the real host_runtime and sim when the
repository root is not on sys.path first (e.g. under a bare `pytest`).
"""
import sys
from pathlib import Path

_TESTS = Path(__file__).resolve().parent
_ROOT = _TESTS.parent
for _p in (str(_TESTS), str(_ROOT)):  # root ends up first
    if _p in sys.path:
        sys.path.remove(_p)
    sys.path.insert(0, _p)

# CI runs the property tests derandomized (a fixed seed per test), so a green run stays green;
# locally they explore new examples each run.
import os  # noqa: E402

from hypothesis import settings  # noqa: E402

settings.register_profile("ci", derandomize=True, print_blob=True)
settings.register_profile("dev", print_blob=True)   # a failure prints the blob that reproduces it
settings.load_profile("ci" if os.environ.get("CI") else "dev")

# fsim checks every program the tests run for races between its stages (sim.races): a missing
# dependency token fails a test even where the timing hides it
os.environ.setdefault("ACCEL_CHECK_RACES", "1")
