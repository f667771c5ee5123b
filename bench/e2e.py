"""End-to-end benchmark: ResNet-18 (224x224) and a MobileNetV2-like network, built from plain ONNX ops
with seeded random weights, compiled with compiler.build_model for "cpu" and "accel".

Reports, as JSON (bench/results/e2e.json) and on stdout:
  compile time per target;
  CPU-target latency against onnxruntime in the same run (bar: at most 2x);
  accelerator cycles from tsim per offloaded layer and the latency they imply at the config's
  clock, against the ideal (offloaded MACs / peak MACs per cycle; bar: at most 1.15x overall);
  fraction of MACs offloaded; peak activation memory with and without planning; and per layer the
  lower bounds of the chosen mapping (compute-stage micro-ops, GEMM plus ALU, one per cycle; bus
  beats each way), which say how much of the gap to the ideal the architecture leaves, and a floor
  no layer-by-layer mapping can beat (the ideal, or the layer's activations read and its result
  written once over the bus, whichever is slower).
The accelerator module also runs once on fsim and its output is compared with onnxruntime. Each net
is also quantized by onnxruntime's tools with their defaults (asymmetric int8 activations) and that
QDQ model compiled and compared with onnxruntime's int8 result in output units (bench_qdq).

    python bench/e2e.py [--config default] [--nets resnet18,mobilenetv2] [--repeat 10] [--no-tsim] [--no-qdq]
                        [--tune [LOG]]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from compiler.frontend.zoo import ModelBuilder  # noqa: E402
from accel.isa.files import write_atomic  # noqa: E402

CPU_BAR = 2.0
ACCEL_BAR = 1.15


# ---- the networks -------------------------------------------------------------------------------
def resnet18(seed: int = 0, size: int = 224):
    b = ModelBuilder("resnet18", seed)
    x = b.input("image", (1, 3, size, size))

    def cbr(x, cin, cout, k, s, relu=True, name=None):
        y = b.bn(b.conv(x, cin, cout, k=k, stride=s, bias=False, name=name), cout)
        return b.op("Relu", [y]) if relu else y
    y = cbr(x, 3, 64, 7, 2, name="conv1")
    y = b.op("MaxPool", [y], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], name="pool1")
    cin = 64
    for stage, cout in enumerate((64, 128, 256, 512)):
        for blk in range(2):
            s = 2 if stage > 0 and blk == 0 else 1
            name = f"layer{stage + 1}.{blk}"
            z = cbr(y, cin, cout, 3, s, name=f"{name}.conv1")
            z = cbr(z, cout, cout, 3, 1, relu=False, name=f"{name}.conv2")
            sc = y if (s == 1 and cin == cout) else cbr(y, cin, cout, 1, s, relu=False, name=f"{name}.down")
            y = b.op("Relu", [b.op("Add", [z, sc], name=f"{name}.add")])
            cin = cout
    y = b.op("GlobalAveragePool", [y], name="gap")
    y = b.op("Flatten", [y], axis=1, name="flatten")
    y = b.op("Gemm", [y, b.weight((1000, 512)), b.init(np.zeros(1000, np.float32))], transB=1, name="fc")
    return b.build([y])


def mobilenetv2(seed: int = 0, size: int = 224, width: float = 1.0):
    """MobileNetV2's inverted residual blocks (expand 1x1 - depthwise 3x3 - project 1x1, ReLU6,
    residual when shapes match), the standard stage table."""
    b = ModelBuilder("mobilenetv2", seed)
    x = b.input("image", (1, 3, size, size))

    def ch(c):
        return max(8, int(c * width + 4) // 8 * 8)

    def cbr(x, cin, cout, k, s, group=1, relu6=True, name=None):
        y = b.bn(b.conv(x, cin, cout, k=k, stride=s, group=group, bias=False, name=name), cout)
        return b.op("Clip", [y, b.init(np.float32(0.0)), b.init(np.float32(6.0))]) if relu6 else y
    cin = ch(32)
    y = cbr(x, 3, cin, 3, 2, name="stem")
    table = [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1)]
    for i, (t, c, n, s) in enumerate(table):
        cout = ch(c)
        for j in range(n):
            stride = s if j == 0 else 1
            name = f"block{i}.{j}"
            hid = cin * t
            z = cbr(y, cin, hid, 1, 1, name=f"{name}.expand") if t != 1 else y
            z = cbr(z, hid, hid, 3, stride, group=hid, name=f"{name}.dw")
            z = cbr(z, hid, cout, 1, 1, relu6=False, name=f"{name}.project")
            y = b.op("Add", [z, y], name=f"{name}.add") if stride == 1 and cin == cout else z
            cin = cout
    y = cbr(y, cin, 1280, 1, 1, name="head")
    y = b.op("GlobalAveragePool", [y], name="gap")
    y = b.op("Flatten", [y], axis=1, name="flatten")
    y = b.op("Gemm", [y, b.weight((1000, 1280)), b.init(np.zeros(1000, np.float32))], transB=1, name="fc")
    return b.build([y])


NETS = {"resnet18": resnet18, "mobilenetv2": mobilenetv2}


# ---- measurements -------------------------------------------------------------------------------
def timeit_pair(fa, fb, repeat: int, rounds: int = 3) -> tuple[float, float]:
    """Median seconds of fa and fb, measured in alternating blocks (so load from other processes
    hits both alike), each block after a pause and one untimed call: onnxruntime's pool spin-waits
    after a run, and timing the other side right after it would charge that spinning to it."""
    ta, tb = [], []
    per = max(1, -(-repeat // rounds))
    for _ in range(rounds):
        for f, ts in ((fa, ta), (fb, tb)):
            time.sleep(0.1)
            f()
            for _ in range(per):
                t0 = time.perf_counter()
                f()
                ts.append(time.perf_counter() - t0)
    return float(np.median(ta)), float(np.median(tb))


def cosine(a, b) -> float:
    a, b = np.ravel(a).astype(np.float64), np.ravel(b).astype(np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def tsim_cycles(mod, step) -> tuple[int, str]:
    """Cycles of one accelerator step from the timing model: through the tsim driver when one is
    registered, else sim.tsim directly on the step's instructions decoded from the DRAM image."""
    from host_runtime import available_drivers
    if "tsim" in available_drivers():
        return None, "driver"
    from accel.isa import INSN_BYTES, decode_program
    from sim.tsim import Tsim
    image = dict(mod.segments)
    code = None
    for addr, data in mod.segments:
        if addr <= step.insn_addr < addr + len(data):
            off = step.insn_addr - addr
            code = data[off:off + step.insn_count * INSN_BYTES]
    insns = decode_program(code, mod.config)
    _ = image
    return Tsim(mod.config).run_insns(insns, step.insn_addr).cycles, "sim.tsim"


def bench_qdq(model, feeds, cfg, log, name: str) -> dict:
    """The network as onnxruntime's quantizer exports it by default (pre-processing, static QDQ,
    asymmetric int8 activations with zero points, int8 weights; calibrated on feeds[:-1]), compiled
    for the accelerator with its own scales and zero points and run on fsim: the output's distance
    from onnxruntime's own int8 result in output units (its unfused QDQ arithmetic, and its fused
    kernels), the cosine to the float model, the MACs offloaded and the CPU steps holding the zero-point
    pads (the accelerator's LOAD pads with 0)."""
    import onnxruntime as ort
    from onnx import numpy_helper

    from compiler import build_model
    from compiler.frontend.zoo import ort_quantize
    qm = ort_quantize(model, feeds[:-1])
    feed = feeds[-1]
    t0 = time.perf_counter()
    mod = build_model(qm, target="accel", config=cfg)
    r = {"compile_s": time.perf_counter() - t0}
    got = next(iter(mod.run(feed)[0].values()))
    inits = {t.name: numpy_helper.to_array(t) for t in qm.graph.initializer}
    dq = [n for n in qm.graph.node if n.op_type == "DequantizeLinear" and n.output[0] == qm.graph.output[0].name]
    unit = float(inits[dq[0].input[1]]) if dq else None
    for key, level in (("unfused", ort.GraphOptimizationLevel.ORT_DISABLE_ALL),
                       ("fused", ort.GraphOptimizationLevel.ORT_ENABLE_ALL)):
        so = ort.SessionOptions()
        so.graph_optimization_level = level
        want = ort.InferenceSession(qm.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, feed)[0]
        r[f"max_units_vs_ort_{key}"] = float(np.abs(got - want).max() / unit) if unit else None
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feed)[0]
    r["cosine_vs_float"] = cosine(got, ref)
    macs = mod.meta["macs"]
    r["offload_fraction"] = macs["accel"] / (macs["accel"] + macs["cpu"])
    r["zero_point_pad_steps"] = sum(1 for s in mod.steps if "pad_zero_point" in s.name)
    log(f"{name}: onnxruntime's default QDQ export (asymmetric int8): {r['max_units_vs_ort_unfused']:.2f} output "
        f"units from its unfused int8 result, {r['max_units_vs_ort_fused']:.2f} from its fused kernels; cosine vs "
        f"float {r['cosine_vs_float']:.4f}; {r['offload_fraction']:.1%} of MACs offloaded; "
        f"{r['zero_point_pad_steps']} CPU steps holding zero-point pads")
    return r


def bench_net(name: str, cfg_name: str, repeat: int, use_tsim: bool, log, tune=None, qdq: bool = True) -> dict:
    import onnxruntime as ort

    from accel.isa import resolve_config
    from compiler import build_model
    from compiler.frontend import from_onnx
    from compiler.frontend.zoo import sample_inputs
    from host_runtime import available_drivers
    from host_runtime.executor import Executor, profile_summary
    cfg = resolve_config(cfg_name)
    model = NETS[name]()
    feeds = sample_inputs(model, 3, seed=5)
    feed = feeds[2]
    r = {"net": name, "onnx_nodes": len(model.graph.node)}
    so = ort.SessionOptions()
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    ref = sess.run(None, feed)[0]
    graph = from_onnx(model)

    # CPU target
    t0 = time.perf_counter()
    cpu = build_model(graph, target="cpu")
    r["cpu_compile_s"] = time.perf_counter() - t0
    log(f"{name}: cpu compile {r['cpu_compile_s']:.1f} s ({cpu.count('llvm')} kernels calls, "
        f"{cpu.count('numpy')} numpy)")
    with Executor(cpu) as ex:
        got = next(iter(ex.run(feed).values()))
        r["cpu_max_rel_err"] = float(np.abs(got - ref).max() / np.abs(ref).max())
        r["cpu_latency_s"], r["ort_latency_s"] = timeit_pair(lambda: ex.run(feed), lambda: sess.run(None, feed), repeat)
    r["ort_threads"] = "default (all cores)"
    r["cpu_vs_ort"] = r["cpu_latency_s"] / r["ort_latency_s"]
    r["cpu_bar"] = CPU_BAR
    r["cpu_meets_bar"] = r["cpu_vs_ort"] <= CPU_BAR
    r["cpu_numpy_fallbacks"] = cpu.meta["fallbacks"]
    log(f"{name}: cpu {r['cpu_latency_s'] * 1e3:.2f} ms vs onnxruntime {r['ort_latency_s'] * 1e3:.2f} ms "
        f"= {r['cpu_vs_ort']:.2f}x (bar {CPU_BAR}x)")

    # accelerator target
    t0 = time.perf_counter()
    acc = build_model(graph, target="accel", config=cfg, calibration=feeds[:2], tune=tune)
    r["accel_compile_s"] = time.perf_counter() - t0
    mem = acc.meta["memory"]
    r["memory"] = {"activation_planned_bytes": mem["planned_bytes"], "activation_naive_bytes": mem["naive_bytes"],
                   "activation_peak_live_bytes": mem["peak_live_bytes"], "weight_bytes": mem["constant_bytes"],
                   "scratch_bytes": mem["scratch_bytes"], "dram_image_bytes": acc.dram_bytes,
                   "planned_vs_naive": mem["planned_bytes"] / mem["naive_bytes"]}
    cpu_mem = cpu.meta["memory"]
    r["memory_cpu_target"] = {"activation_planned_bytes": cpu_mem["planned_bytes"],
                              "activation_naive_bytes": cpu_mem["naive_bytes"]}
    macs = acc.meta["macs"]
    r["macs_total"] = macs["accel"] + macs["cpu"]
    r["macs_offloaded"] = macs["accel"]
    r["offload_fraction"] = macs["accel"] / r["macs_total"]
    r["accel_fallbacks"] = acc.meta["fallbacks"]
    log(f"{name}: accel compile {r['accel_compile_s']:.1f} s; {r['offload_fraction']:.1%} of MACs offloaded; "
        f"activations planned {mem['planned_bytes']} B vs naive {mem['naive_bytes']} B")
    t0 = time.perf_counter()
    with Executor(acc, driver="fsim") as ex:
        got = next(iter(ex.run(feed).values()))
        prof = ex.profile
    r["fsim_run_s"] = time.perf_counter() - t0
    r["accel_cosine_vs_ort"] = cosine(got, ref)
    r["accel_same_top1"] = bool(np.argmax(got) == np.argmax(ref))
    log(f"{name}: fsim run {r['fsim_run_s']:.1f} s, cosine vs onnxruntime {r['accel_cosine_vs_ort']:.4f}")
    r["cpu_part_time_s"] = profile_summary(prof)["cpu_time_s"]
    if qdq:
        r["qdq"] = bench_qdq(model, feeds, cfg, log, name)

    if use_tsim:
        layers = []
        t0 = time.perf_counter()
        if "tsim" in available_drivers():
            with Executor(acc, driver="tsim") as ex:
                ex.run(feed)
                rows = [x for x in ex.profile if x["target"] == "accel"]
            src = "tsim driver"
            for row in rows:
                layers.append({k: row[k] for k in ("name", "op", "macs", "cycles", "gemm_uops", "alu_uops",
                                                    "bytes_read", "bytes_written")})
        else:
            src = "sim.tsim on the decoded programs (no tsim driver registered)"
            for s in acc.steps:
                if s.kind == "accel":
                    cyc, _ = tsim_cycles(acc, s)
                    layers.append({"name": s.name, "op": s.op, "macs": s.macs, "cycles": cyc})
        r["tsim_s"] = time.perf_counter() - t0
        steps = {s.name: s for s in acc.steps if s.kind == "accel"}
        for L in layers:
            L["ideal_cycles"] = L["macs"] / cfg.macs_per_cycle
            st = steps.get(L["name"])
            if st is not None:
                # what any mapping of this layer must move: its activations in once (read channel)
                # and its result out once (write channel), one bus beat per cycle each (weights not counted)
                L["dram_floor_cycles"] = max(L["ideal_cycles"],
                                             sum(acc.tensors[t].nbytes for t in st.inputs) / cfg.bus_bytes,
                                             acc.tensors[st.output].nbytes / cfg.bus_bytes)
            L["vs_ideal"] = L["cycles"] / L["ideal_cycles"] if L["ideal_cycles"] else None
            if "gemm_uops" in L:
                # lower bounds of this mapping: the compute stage issues one GEMM or ALU micro-op per
                # cycle, the read and the write channel move one bus beat per cycle each
                L["compute_bound_cycles"] = L["gemm_uops"] + L["alu_uops"]
                L["memory_bound_cycles"] = max(L["bytes_read"], L["bytes_written"]) / cfg.bus_bytes
                L["bound_cycles"] = max(L["compute_bound_cycles"], L["memory_bound_cycles"])
        gemm = [L for L in layers if L["macs"]]
        cycles = sum(L["cycles"] for L in layers)
        ideal = sum(L["ideal_cycles"] for L in layers)
        r["accel"] = {"cycles_source": src, "cycles": cycles, "gemm_layer_cycles": sum(L["cycles"] for L in gemm),
                      "ideal_cycles": ideal, "vs_ideal": cycles / ideal if ideal else None,
                      "gemm_layers_vs_ideal": sum(L["cycles"] for L in gemm) / ideal if ideal else None,
                      "latency_s": cycles / (cfg.clock_mhz * 1e6), "ideal_latency_s": ideal / (cfg.clock_mhz * 1e6),
                      "bar": ACCEL_BAR, "meets_bar": bool(ideal and cycles / ideal <= ACCEL_BAR), "layers": layers}
        if all("dram_floor_cycles" in L for L in layers) and ideal:
            floor = sum(L["dram_floor_cycles"] for L in layers)
            r["accel"].update(dram_floor_cycles=floor, dram_floor_vs_ideal=floor / ideal)
            log(f"{name}: floor of any layer-by-layer mapping (max of the ideal and the layer's activations in "
                f"and out once on the {cfg.bus_bytes}-byte bus): {floor / ideal:.3f}x ideal")
        if all("bound_cycles" in L for L in layers):
            bound = sum(L["bound_cycles"] for L in layers)
            r["accel"].update(
                bound_cycles=bound, bound_vs_ideal=bound / ideal if ideal else None, cycles_vs_bound=cycles / bound,
                compute_bound_vs_ideal=sum(L["compute_bound_cycles"] for L in layers) / ideal if ideal else None,
                gemm_uop_vs_ideal=sum(L["gemm_uops"] for L in layers) / ideal if ideal else None)
            log(f"{name}: per-layer lower bounds of this mapping (max of compute-stage micro-ops and bus beats): "
                f"{bound:.0f} cycles = {r['accel']['bound_vs_ideal']:.3f}x ideal (GEMM micro-ops alone "
                f"{r['accel']['gemm_uop_vs_ideal']:.3f}x, GEMM+ALU {r['accel']['compute_bound_vs_ideal']:.3f}x); "
                f"tsim reaches {r['accel']['cycles_vs_bound']:.3f}x the bound")
        log(f"{name}: tsim {cycles} cycles = {r['accel']['latency_s'] * 1e3:.2f} ms at {cfg.clock_mhz:g} MHz; ideal "
            f"{ideal:.0f} -> {r['accel']['vs_ideal']:.3f}x (bar {ACCEL_BAR}x) [{r['tsim_s']:.0f} s]")
    return r


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--config", default="default")
    p.add_argument("--nets", default="resnet18,mobilenetv2")
    p.add_argument("--repeat", type=int, default=10)
    p.add_argument("--no-tsim", action="store_true", help="skip the timing model (slow on whole networks)")
    p.add_argument("--tune", nargs="?", const=True, default=None, metavar="LOG",
                   help="tilings measured on tsim (build_model(tune=...)); with LOG, a tuning log")
    p.add_argument("--no-qdq", action="store_true", help="skip onnxruntime's quantized export of each net")
    p.add_argument("-o", "--output", default=str(Path(__file__).parent / "results" / "e2e.json"))
    args = p.parse_args(argv)
    from accel.isa import resolve_config

    def log(msg):
        print(msg, file=sys.stderr, flush=True)
    results = {"config": args.config, "config_digest": resolve_config(args.config).digest(),
               "clock_mhz": resolve_config(args.config).clock_mhz,
               "peak_macs_per_cycle": resolve_config(args.config).macs_per_cycle,
               "machine": platform.machine(), "cpus": len(os.sched_getaffinity(0)),
               "python": platform.python_version(), "nets": []}
    for name in args.nets.split(","):
        results["nets"].append(bench_net(name, args.config, args.repeat, not args.no_tsim, log, args.tune,
                                         not args.no_qdq))
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(out, json.dumps(results, indent=2, default=str))
    summary = [{k: n.get(k) for k in ("net", "cpu_compile_s", "accel_compile_s", "cpu_vs_ort", "offload_fraction",
                                      "accel_cosine_vs_ort")} | {"accel_vs_ideal": (n.get("accel") or {}).get("vs_ideal"),
                                                                 "planned_vs_naive": n["memory"]["planned_vs_naive"]}
               for n in results["nets"]]
    print(json.dumps(summary, indent=2))
    log(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
