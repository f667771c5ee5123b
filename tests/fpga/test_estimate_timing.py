"""The yosys path estimate (accel.hw.fpga.estimate_timing): the report parser, and a live run on a
small registered design whose worst path is known (a 32-bit add between flip-flops)."""
from __future__ import annotations

import pytest
from conftest import needs_yosys

from accel.hw.fpga import FpgaError
from accel.hw.fpga.estimate_timing import FF_TIMING, parse_sta, path_estimate

REPORT = """
8. Executing STA pass (static timing analysis).
Latest arrival time in 't2' is 2446:
    2446 _429_ (FDRE.D)
           \\_131_
    2421 _236_ (LUT2.I0->O)
           \\sum [0]
    1165 _295_ (CARRY4.S->CO)
           \\_093_
     399 _369_ (FDRE.C->Q)
           \\_162_
      96 _303_ (BUFG.I->O)
       0   \\clk (<primary input>)

Arrival histogram:
"""


def test_parse_sta_reads_the_worst_path_and_its_nets():
    est = parse_sta(REPORT)
    assert est.path_ns == 2.446 and est.fmax_mhz == 408.8
    assert est.steps[0] == (2446, "_429_", "FDRE.D", "\\_131_")
    assert [s[2] for s in est.steps] == ["FDRE.D", "LUT2.I0->O", "CARRY4.S->CO", "FDRE.C->Q", "BUFG.I->O",
                                         "<primary input>"]
    assert est.steps[1][3] == "\\sum [0]"


def test_parse_sta_refuses_a_path_that_ends_nowhere():
    """Without FF timing, sta's worst path ends at '<unknown>': that is no estimate."""
    with pytest.raises(FpgaError, match="not at a register"):
        parse_sta("Latest arrival time in 't' is 96:\n      96 (<unknown>)\n           \\x\n")
    with pytest.raises(FpgaError, match="no latest arrival"):
        parse_sta("4. Executing STA pass\nWarning: nothing\n")


def test_ff_models_cover_every_7series_flip_flop():
    for name in ("FDRE", "FDSE", "FDCE", "FDPE"):
        assert f"module {name} " in FF_TIMING
    assert FF_TIMING.count("(posedge C => (Q : D)) = 303;") == 4


@needs_yosys
def test_path_estimate_of_a_registered_adder(tmp_path):
    """A 32-bit add and a LUT between flip-flops: about a carry chain of 8 CARRY4s plus LUTs, ending
    at a flip-flop's D input (cell delays only: a few ns)."""
    (tmp_path / "t.v").write_text("""module t(input clk, input [31:0] a, b, output reg [31:0] y);
reg [31:0] ra, rb;
always @(posedge clk) begin ra <= a; rb <= b; y <= (ra + rb) ^ (ra - rb); end
endmodule
""")
    est = path_estimate(tmp_path / "t.v", "t", tmp_path)
    assert est.steps[0][2].startswith("FD") and est.steps[0][2].endswith(".D")
    assert any(s[2].startswith("CARRY4") for s in est.steps)
    assert 1.0 < est.path_ns < 5.0
    assert (tmp_path / "path.json").exists()
