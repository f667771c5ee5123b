"""cocotb test module: runs the job that runner.py wrote (ACCEL_RTL_JOB = job directory).

job.json: {"dram_bytes": N, "stall_seed": seed | null, "dram": DramModel dict | null, "programs": [{"name", "dram" (file),
"insn_addr", "insn_count", "max_cycles", "watchdog", "soft_reset"}]}. For each program, in order, on one
DUT (buffers persist across programs, as in a Fsim instance): load DRAM, run, write <name>.out.bin
(the whole DRAM after the run) and append to result.json. A hang stops the job (the DUT is stuck
busy) unless the program asks for a soft reset after it.
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

import cocotb

from sim.rtl.bench import TB


@cocotb.test()
async def run_job(dut):
    job_dir = Path(os.environ["ACCEL_RTL_JOB"])
    job = json.loads((job_dir / "job.json").read_text())
    tb = TB(dut, job["dram_bytes"], stall_seed=job.get("stall_seed"), dram=job.get("dram"))
    await tb.reset()
    results = []
    t_job = time.perf_counter()
    for p in job["programs"]:
        dram = (job_dir / p["dram"]).read_bytes()
        r = await tb.run(dram, p["insn_addr"], p["insn_count"], p["max_cycles"], p.get("watchdog", 0),
                         p.get("soft_reset", False))
        r["name"] = p["name"]
        if r["status"] in ("done", "fault"):
            (job_dir / f"{p['name']}.out.bin").write_bytes(tb.dram(len(dram)))
        results.append(r)
        (job_dir / "result.json").write_text(json.dumps({"programs": results,
                                                         "wall_s": time.perf_counter() - t_job}))
        if r["status"] == "hang":
            break
