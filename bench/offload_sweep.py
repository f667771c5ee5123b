"""Fraction of MACs the accel target offloads, per network and accelerator configuration: the
partition's decisions only (graph passes up to the partition, no build, no run), so a sweep over
configs takes seconds. Nets: the zoo's tiny CNN, MLP and transformer encoder, ResNet-18 and a
MobileNetV2-like net at small inputs (bench/e2e.py's builders). Configs: the tiny and default
presets, batch 2, blocks of 32 and of 8 (buffers halved so the instruction fields fit), a 128-bit
bus. Per cell also the kinds of the CPU GEMM layers' declines; --why prints their sentences.
The host the GEMM rule weighs is $ACCEL_HOST_MODEL's (compiler.accel.depthwise_cost). No timing.

    python bench/offload_sweep.py [--nets mlp,resnet18] [--configs tiny,batch2] [--why] [-o PATH]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
import e2e  # noqa: E402

from accel.isa.config import AccelConfig, resolve_config  # noqa: E402
from accel.isa.files import write_atomic  # noqa: E402
from compiler.accel.depthwise_cost import host_model  # noqa: E402
from compiler.frontend import from_onnx, zoo  # noqa: E402
from compiler.graph.passes import GraphOptions, optimize  # noqa: E402
from compiler.targets.base import node_macs  # noqa: E402

CONFIGS = {
    "tiny": lambda: resolve_config("tiny"),
    "default": lambda: resolve_config("default"),
    "batch2": lambda: AccelConfig(batch=2),
    "block32": lambda: AccelConfig(block_in=32, block_out=32),
    "block8": lambda: AccelConfig(block_in=8, block_out=8, inp_buff_bytes=16384, wgt_buff_bytes=131072,
                                  acc_buff_bytes=65536, out_buff_bytes=16384, uop_buff_bytes=16384),
    "bus128": lambda: AccelConfig(bus_width=128),
}
NETS = {
    "tiny_cnn": zoo.conv_bn_relu_pool,
    "mlp": zoo.mlp,
    "transformer_encoder": zoo.transformer_encoder,
    "resnet18": lambda: e2e.resnet18(size=64),
    "mobilenetv2": lambda: e2e.mobilenetv2(size=96),
}


def offload(model, cfg: AccelConfig) -> dict:
    """The partition of `model` for `cfg`: offloaded MACs, total, and the CPU GEMM layers' declines."""
    g = optimize(from_onnx(model), GraphOptions(quantize=True, calibration_samples=zoo.sample_inputs(model, 2, seed=1),
                                                accel=cfg, disabled=("pack_layout", "fuse_ops", "plan_memory")))
    why = {d.name: d for d in g.meta["partition"]}
    acc = total = 0
    cpu = []
    for n in g.ops:
        m = node_macs(n)
        total += m
        if n.target == "accel":
            acc += m
        elif m:
            d = why.get(n.name)
            cpu.append({"name": n.name, "macs": m, "kind": d.kind if d else "", "reason": d.reason if d else ""})
    return {"macs_offloaded": acc, "macs_total": total, "offload_fraction": acc / total if total else 0.0,
            "cpu_gemms": cpu}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nets", default=",".join(NETS))
    p.add_argument("--configs", default=",".join(CONFIGS))
    p.add_argument("--why", action="store_true", help="print each CPU GEMM layer's reason")
    p.add_argument("-o", "--output", default=str(ROOT / "bench" / "results" / "offload_sweep.json"))
    args = p.parse_args(argv)
    nets, cfgs = args.nets.split(","), args.configs.split(",")
    for what, names, known in (("--nets", nets, NETS), ("--configs", cfgs, CONFIGS)):
        bad = [n for n in names if n not in known]
        if bad:
            raise SystemExit(f"{what} {','.join(bad)}: unknown; choose from {', '.join(known)}")
    host = host_model().name
    print(f"fraction of MACs offloaded (GEMM layers weighed against the {host} host)")
    print(f"{'net':20}" + "".join(f"{c:>10}" for c in cfgs))
    results = {}
    for net in nets:
        model = NETS[net]()
        row = results[net] = {c: offload(model, CONFIGS[c]()) for c in cfgs}
        print(f"{net:20}" + "".join(f"{row[c]['offload_fraction']:>10.1%}" for c in cfgs))
        for c in cfgs:
            for r in row[c]["cpu_gemms"] if args.why else []:
                print(f"    {c:8} {r['kind']:9} {r['reason']}")
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(out, json.dumps({"host": host, "results": results}, indent=1).encode())
    return 0


if __name__ == "__main__":
    sys.exit(main())
