"""A learned cost model that ranks schedule candidates, as AutoTVM's: features of (workload,
configuration) -> predicted log time, fit by ridge regression over the features and their pairwise
products on every measurement so far (this workload's and, from the log, other workloads' on the
same ISA). NumPy only; refit after every batch, so it needs no more than a few dozen points.
"""
from __future__ import annotations

import math

import numpy as np

from .space import FAMILIES, Workload, tile_regs

_FAMILY_LIST = sorted(set(FAMILIES.values()))
#: numeric knobs (log2 of the value) and switches (0/1) in a fixed feature order
_NUM_KNOBS = ("oc_bn", "ic_bn", "reg_n", "pw_oc", "pw_vecs", "dw_vecs", "mi", "bn", "nj", "k_unroll")
_SWITCHES = (("order", "kernel_outer"), ("unroll_kw", True), ("dw_unroll", True), ("parallel", False),
             ("parallel", True))


def features(wl: Workload, cfg: dict, registers: int = 32) -> np.ndarray:
    """The feature vector: the kernel family, the work, each knob, the register tile against
    the register file and the trip count of the outer loop the tile leaves."""
    f = [1.0 if wl.family == fam else 0.0 for fam in _FAMILY_LIST]
    f.append(math.log2(1 + wl.macs))
    f.append(math.log2(1 + math.prod(wl.out_shape)) if wl.out_shape else 0.0)
    for k in _NUM_KNOBS:
        v = cfg.get(k)
        f.append(math.log2(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 else 0.0)
    for k, on in _SWITCHES:
        f.append(1.0 if cfg.get(k) == on else 0.0)
    regs = tile_regs(wl, cfg)
    f.append(regs / registers)
    f.append(max(0.0, regs - (registers - 2)) / registers)   # spills
    f.append(math.log2(1 + regs))
    return np.asarray(f, dtype=np.float64)


class CostModel:
    """Ridge regression on standardized features and their pairwise products."""

    def __init__(self, alpha: float = 1.0):
        self.alpha = alpha
        self.w = None
        self.mu = self.sd = None

    @staticmethod
    def _expand(X: np.ndarray) -> np.ndarray:
        n, d = X.shape
        iu = np.triu_indices(d)
        quad = (X[:, :, None] * X[:, None, :])[:, iu[0], iu[1]]
        return np.hstack([X, quad])

    def fit(self, X, y) -> CostModel:
        X = self._expand(np.asarray(X, dtype=np.float64))
        y = np.asarray(y, dtype=np.float64)
        self.mu, self.sd = X.mean(0), X.std(0)
        self.sd[self.sd < 1e-12] = 1.0
        Z = (X - self.mu) / self.sd
        self.y0 = y.mean()
        A = Z.T @ Z + self.alpha * np.eye(Z.shape[1])
        self.w = np.linalg.solve(A, Z.T @ (y - self.y0))
        return self

    @property
    def fitted(self) -> bool:
        return self.w is not None

    def predict(self, X) -> np.ndarray:
        if self.w is None:
            raise RuntimeError("CostModel.predict before fit")
        Z = (self._expand(np.asarray(X, dtype=np.float64)) - self.mu) / self.sd
        return Z @ self.w + self.y0
