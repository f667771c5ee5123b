"""Named conv2d workloads: the ResNet-18 layers VTA benchmarks with (`resnet18_conv.json` beside
this file). `accel compile-op --layer`, the tests and the benchmarks read them from here so that a
fresh clone needs no file outside the repository."""
import json
from pathlib import Path

RESNET18_CONV = Path(__file__).with_name("resnet18_conv.json")


def load_layers(path: str | Path | None = None) -> dict[str, list[int]]:
    """{layer name: [h, w, c, o, kh, kw, pad_h, pad_w, sh, sw]} from a workload JSON file."""
    return json.loads(Path(path or RESNET18_CONV).read_text())["layers"]
