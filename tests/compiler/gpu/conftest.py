from tests.compiler.gpu.gpu_helpers import rng  # noqa: F401  (fixture)
