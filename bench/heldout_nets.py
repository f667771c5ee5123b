"""Held-out network campaign: the random-network generator of tests/e2e/test_random_networks.py
(imported, not forked) run for many more examples over several configs, plus the onnx wheel's
classic models and the zoo nets on the accel target, recording failures instead of stopping.

Per random example (the test's checks, recorded): cpu target vs onnxruntime (1e-4), every accel
step bit-equal to the int8 reference on its recorded inputs, accel output cosine vs the reference
(0.999) and vs onnxruntime (0.9); also no duplicate node names, and the same input run again in
the same executor (resident weights) gives the same output bits. A failing example's model is saved next to the JSON so it can be
replayed. Fixed nets (--fixed): compile must succeed or decline with a clear reason (an AccelError
or CompileError), steps bit-exact, output cosine vs the cpu target recorded (floor 0.9).

    nice -n 10 python bench/heldout_nets.py --examples 100 --configs tiny,default,odd,batch2,b2in
    python bench/heldout_nets.py --examples 0 --fixed zoo,light:squeezenet --configs odd,bus128
Not in the test suite: minutes to hours. Writes bench/results/heldout_nets.json (--out).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import onnx  # noqa: E402
import onnxruntime as ort  # noqa: E402
from hypothesis import HealthCheck, Phase, given, seed, settings  # noqa: E402

import compiler  # noqa: E402
from accel.isa import PRESETS, AccelConfig  # noqa: E402
from accel.isa.files import write_atomic  # noqa: E402
from compiler.frontend import zoo  # noqa: E402
from compiler.graph import run as reference_run  # noqa: E402
from compiler.graph.errors import GraphPassError  # noqa: E402
from compiler.graph.ops import get_op  # noqa: E402
from host_runtime.executor import Executor  # noqa: E402
from tests.e2e.test_random_networks import ODD, cosine, networks  # noqa: E402

DEFAULT_OUT = ROOT / "bench" / "results" / "heldout_nets.json"
#: configs beyond the presets: the test's odd one, a batch-2 core, a 128-bit bus, small buffers
CONFIGS = {
    "tiny": PRESETS["tiny"], "default": PRESETS["default"], "odd": ODD,
    "batch2": AccelConfig(batch=2),
    "bus128": AccelConfig(bus_width=128),
    "small": AccelConfig(uop_buff_bytes=2048, inp_buff_bytes=2048, wgt_buff_bytes=8192, acc_buff_bytes=8192,
                         out_buff_bytes=2048),
}
#: pseudo-configs: (config, input batch, force_target): the batch-2 core fed a batch-2 input (the
#: generator's input is batch 1); every conv forced onto the core (the cost rule keeps thin ones on the
#: CPU, so their emitter paths go unexercised otherwise)
VARIANTS = {"b2in": ("batch2", 2, None), "tiny_forced": ("tiny", 1, {"Conv": "accel"}),
            "odd_forced": ("odd", 1, {"Conv": "accel"})}
LIGHT = ("bvlc_alexnet", "densenet121", "inception_v1", "inception_v2", "resnet50", "shufflenet", "squeezenet",
         "vgg19", "zfnet512")


def with_batch(model, n: int):
    """The model with its input's batch set to n (the random nets end in Flatten + Gemm: batch-generic)."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    m.graph.input[0].type.tensor_type.shape.dim[0].dim_value = n
    del m.graph.value_info[:]
    for o in m.graph.output:
        o.type.tensor_type.shape.dim[0].dim_value = n
    return m


def ort_session(model):
    so = ort.SessionOptions()   # basic optimizations only, as the test (NCHWc rewrite and 1x1 padded images)
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    so.intra_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def accel_steps(mod, ex) -> list[str]:
    """Names of the accel steps whose output differs from the reference op on the same inputs."""
    bad = []
    for n in mod.graph.nodes:
        if getattr(n, "target", None) != "accel":
            continue
        args = [i.value if i.is_const else ex.values[i.name] for i in n.inputs]
        want = get_op(n.op).impl(n.attrs, *args)
        got = ex.values[n.name]
        if got.shape != want.shape or not np.array_equal(got, want):
            diff = int(np.count_nonzero(got != want)) if got.shape == want.shape else -1
            bad.append(f"{n.name} ({n.op}): {diff} of {want.size} differ")
    return bad


def duplicate_names(mod) -> list[str]:
    """Node names used twice in the compiled graph (kept values, memory plans, profiles go by name)."""
    names = [n.name for n in mod.graph.nodes]
    return sorted({x for x in names if names.count(x) > 1})


def check_random(model, cfg, force=None) -> dict:
    """The test's checks on one model, recorded: {'ok': bool, 'fail': [...], figures}."""
    r: dict = {"fail": []}
    feeds = zoo.sample_inputs(model, 4, seed=3)
    want = ort_session(model).run(None, feeds[3])[0]
    cpu = compiler.build(model, target="cpu")
    got_cpu = next(iter(cpu.run(feeds[3])[0].values()))
    err = float(np.abs(got_cpu - want).max())
    r["cpu_max_err"] = err
    if not np.allclose(got_cpu, want, rtol=1e-4, atol=1e-4 * float(np.abs(want).max())):
        r["fail"].append(f"cpu vs onnxruntime: max err {err:.3g}")
    try:
        mod = compiler.build_model(model, target="accel", config=cfg, calibration=feeds, force_target=force)
    except GraphPassError as e:
        if not force or "cannot force" not in str(e):
            raise
        r["declined"] = str(e)   # a forced op the core cannot run: a clear one-line refusal is right
        return r
    r["accel_nodes"] = sum(getattr(n, "target", None) == "accel" for n in mod.graph.nodes)
    if duplicate_names(mod):
        r["fail"].append(f"duplicate node names: {duplicate_names(mod)[:4]}")
    with Executor(mod, driver="fsim") as ex:
        got = next(iter(ex.run(feeds[3], keep=True).values()))
        bad = accel_steps(mod, ex)
        ex.run(feeds[2])   # a later inference (weights resident from the first) gives the same answer
        again = next(iter(ex.run(feeds[3]).values()))
    if bad:
        r["fail"].append("steps not bit-exact: " + "; ".join(bad[:4]))
    if not np.array_equal(again, got):
        r["fail"].append("a repeated inference in one executor differs from the first")
    ref = reference_run(mod.graph, feeds[3])[0]
    r["cos_ref"], r["cos_ort"] = cosine(got, ref), cosine(got, want)
    r["cos_ref_float"] = cosine(ref, want)   # the int8 reference itself vs onnxruntime: int8 sensitivity
    if r["cos_ref"] < 0.999:
        r["fail"].append(f"cosine vs int8 reference {r['cos_ref']:.4f} < 0.999")
    if r["cos_ort"] < 0.9:
        r["fail"].append(f"cosine vs onnxruntime {r['cos_ort']:.4f} < 0.9")
    return r


def run_random(cname: str, examples: int, seed_: int, save_dir: Path, log) -> dict:
    """examples random nets on one config through hypothesis (generation only, nothing raised)."""
    base, batch, force = VARIANTS.get(cname, (cname, 1, None))
    cfg = CONFIGS[base]
    rows, t0 = [], time.perf_counter()

    @seed(seed_)
    @settings(max_examples=examples, deadline=None, database=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(net=networks())
    def one(net):
        k = len(rows)
        model = with_batch(net, batch) if batch != 1 else net
        try:
            r = check_random(model, cfg, force)
        except Exception as e:  # noqa: BLE001 - the campaign records a crash and goes on
            r = {"fail": [f"crash: {type(e).__name__}: {e}"], "trace": traceback.format_exc(limit=6)}
        r["ops"] = [n.op_type for n in model.graph.node]
        if r["fail"]:
            path = save_dir / f"{cname}_{seed_}_{k}.onnx"
            path.write_bytes(model.SerializeToString())
            r["model"] = str(path)
            log(f"{cname} #{k}: FAIL {r['fail']} -> {r['model']}")
        rows.append(r)

    one()
    fails = [r for r in rows if r["fail"]]
    cos = [r["cos_ort"] for r in rows if "cos_ort" in r]
    out = {"config": cname, "examples": len(rows), "failures": len(fails), "seconds": time.perf_counter() - t0,
           "min_cos_ort": min(cos) if cos else None, "min_cos_ref": min((r["cos_ref"] for r in rows if "cos_ref" in r),
                                                                        default=None),
           "declined": sum("declined" in r for r in rows),
           "with_accel_steps": sum(r.get("accel_nodes", 0) > 0 for r in rows),
           "accel_steps": sum(r.get("accel_nodes", 0) for r in rows),
           "failed": fails}
    log(f"{cname}: {len(rows)} examples, {len(fails)} failures, {out['seconds']:.0f} s")
    return out


def randomize_weights(model, seed_: int = 0):
    """The model with its constant weights (the light models' ConstantOfShape fills, float initializers)
    replaced by seeded random ones of the same shape: He-scaled conv/gemm weights, BN scale and
    variance in [0.5, 1.5], small biases. Constant weights make every output equal, so a cosine near
    1 would say nothing."""
    rng = np.random.default_rng(seed_)
    m = onnx.ModelProto()
    m.CopyFrom(model)
    g = m.graph
    inits = {t.name: t for t in g.initializer}
    role = {}
    for n in g.node:
        for k, i in enumerate(n.input):
            role.setdefault(i, (n, k))

    def value(name, shape):
        n, k = role.get(name, (None, 0))
        while n is not None and n.op_type in ("Unsqueeze", "Reshape") and k == 0:   # a per-channel scale's path
            n, k = role.get(n.output[0], (None, 0))
        op = n.op_type if n is not None else ""
        if op in ("Conv", "Gemm", "MatMul") and k == 1 and len(shape) >= 2:
            trans = op == "Gemm" and any(a.name == "transB" and a.i for a in n.attribute)
            fan = int(np.prod(shape[1:])) if op == "Conv" or trans else int(shape[0])
            return rng.standard_normal(shape) * np.sqrt(2.0 / max(1, fan))
        if (op == "BatchNormalization" and k in (1, 4)) or op == "Mul":
            return rng.uniform(0.5, 1.5, shape)
        return rng.standard_normal(shape) * 0.1

    keep = []
    for n in g.node:
        if n.op_type == "ConstantOfShape" and n.input and n.input[0] in inits:
            shape = [int(d) for d in onnx.numpy_helper.to_array(inits[n.input[0]])]
            g.initializer.append(onnx.numpy_helper.from_array(value(n.output[0], shape).astype(np.float32),
                                                              n.output[0]))
        else:
            keep.append(n)
    del g.node[:]
    g.node.extend(keep)
    for t in g.initializer:
        if t.data_type == onnx.TensorProto.FLOAT and t.name in role and role[t.name][0].op_type in (
                "Conv", "Gemm", "MatMul", "BatchNormalization"):
            t.CopyFrom(onnx.numpy_helper.from_array(value(t.name, list(t.dims)).astype(np.float32), t.name))
    used = {i for n in g.node for i in n.input}
    live = [t for t in g.initializer if t.name in used]
    del g.initializer[:]
    g.initializer.extend(live)
    m.ir_version = max(m.ir_version, 4)   # initializers need not be graph inputs
    names = {t.name for t in g.initializer}
    graph_inputs = [i for i in g.input if i.name not in names]
    del g.input[:]
    g.input.extend(graph_inputs)
    return m


def without_softmax(model):
    """The model ending at its logits: a final Softmax over 1000 classes turns a small logit error into
    a large probability one when the logits are peaked, or hides any error when they are flat."""
    g = model.graph
    last = g.node[-1]
    if last.op_type != "Softmax" or [o.name for o in g.output] != list(last.output):
        return model
    m = onnx.ModelProto()
    m.CopyFrom(model)
    del m.graph.node[-1]
    del m.graph.output[:]
    m.graph.output.extend([onnx.helper.make_tensor_value_info(last.input[0], onnx.TensorProto.FLOAT, None)])
    return m


def load_fixed(name: str):
    if name.startswith("light:"):
        path = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light" / f"light_{name[6:]}.onnx"
        return without_softmax(randomize_weights(onnx.load(str(path))))
    if name.startswith("e2e:"):   # bench/e2e.py's resnet18 / mobilenetv2, at 64 x 64 to keep fsim short
        sys.path.insert(0, str(ROOT / "bench"))
        import e2e  # noqa: PLC0415 - a sibling script, importable only from here
        return e2e.NETS[name[4:]](size=64)
    return zoo.MODELS[name]()


def check_fixed(name: str, cname: str) -> dict:
    """One fixed net on one config: compiles or declines clearly; steps bit-exact; cosine vs cpu."""
    from accel.isa.errors import AccelError  # noqa: PLC0415 - only the fixed-net part needs it
    cfg = CONFIGS[cname]
    model = load_fixed(name)
    feeds = zoo.sample_inputs(model, 2, seed=5)
    r: dict = {"net": name, "config": cname, "fail": []}
    t0 = time.perf_counter()
    try:
        mod = compiler.build_model(model, target="accel", config=cfg, calibration=feeds[:1])
    except AccelError as e:
        r["declined"] = f"{type(e).__name__}: {e}"
        if len(str(e).splitlines()) > 1 or not str(e):
            r["fail"].append("decline message not one line")
        return r
    r["compile_s"] = time.perf_counter() - t0
    r["accel_nodes"] = sum(getattr(n, "target", None) == "accel" for n in mod.graph.nodes)
    r["offload"] = mod.meta["macs"]["accel"] / max(1, mod.meta["macs"]["accel"] + mod.meta["macs"]["cpu"])
    if duplicate_names(mod):
        r["fail"].append(f"duplicate node names: {duplicate_names(mod)[:4]}")
    cpu = compiler.build(model, target="cpu")
    want = next(iter(cpu.run(feeds[1])[0].values()))
    with Executor(mod, driver="fsim") as ex:
        got = next(iter(ex.run(feeds[1], keep=True).values()))
        bad = accel_steps(mod, ex)
    if bad:
        r["fail"].append("steps not bit-exact: " + "; ".join(bad[:4]))
    r["cos_cpu"] = cosine(got, want)
    r["same_top1"] = bool(np.argmax(got) == np.argmax(want))
    if r["cos_cpu"] < 0.9:
        r["fail"].append(f"cosine vs cpu target {r['cos_cpu']:.4f} < 0.9")
    r["seconds"] = time.perf_counter() - t0
    return r


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--examples", type=int, default=50, help="random nets per config (0: none)")
    p.add_argument("--configs", default="tiny,default,odd,batch2,b2in,bus128,small",
                   help=f"comma list of {', '.join([*CONFIGS, *VARIANTS])}")
    p.add_argument("--seed", type=int, default=0, help="hypothesis seed (a new seed, new nets)")
    p.add_argument("--fixed", default="", help="comma list: zoo (all zoo nets), light (all), light:<model>, <zoo net>, "
                   "e2e:resnet18, e2e:mobilenetv2 (at 64 x 64)")
    p.add_argument("--fixed-configs", default=None, help="configs for --fixed (default: --configs)")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = p.parse_args(argv)
    configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    for c in configs:
        if c not in CONFIGS and c not in VARIANTS:
            p.error(f"--configs {c}: unknown; configs are {', '.join([*CONFIGS, *VARIANTS])}")
    save_dir = args.out.resolve().parent / "heldout"
    save_dir.mkdir(parents=True, exist_ok=True)

    def log(msg):
        print(msg, flush=True)

    result = {"seed": args.seed, "random": [], "fixed": []}

    def dump():
        write_atomic(args.out, (json.dumps(result, indent=1, default=str) + "\n").encode())

    if args.examples:
        for c in configs:
            result["random"].append(run_random(c, args.examples, args.seed, save_dir, log))
            dump()
    fixed = []
    for f in (s.strip() for s in args.fixed.split(",") if s.strip()):
        fixed += list(zoo.MODELS) if f == "zoo" else [f"light:{m}" for m in LIGHT] if f == "light" else [f]
    fcfgs = [c for c in (args.fixed_configs or args.configs).split(",") if c in CONFIGS]
    for name in fixed:
        for c in fcfgs:
            try:
                r = check_fixed(name, c)
            except Exception as e:  # noqa: BLE001 - recorded, the campaign goes on
                r = {"net": name, "config": c, "fail": [f"crash: {type(e).__name__}: {e}"],
                     "trace": traceback.format_exc(limit=6)}
            log(f"{name} on {c}: {'FAIL ' + str(r['fail']) if r['fail'] else 'ok'} "
                f"{r.get('declined', '')}{'cos %.4f' % r['cos_cpu'] if 'cos_cpu' in r else ''}")
            result["fixed"].append(r)
            dump()
    dump()
    return 1 if any(r["failures"] for r in result["random"]) or any(r["fail"] for r in result["fixed"]) else 0


if __name__ == "__main__":
    sys.exit(main())
