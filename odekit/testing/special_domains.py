"""The accuracy domains of the special-function contract (issue: stable
logistic functions), shared by the ulp tests and the special benchmark."""
from __future__ import annotations

import numpy as np


def accuracy_grid(name: str, dtype, num_log: int, num_dense: int) -> np.ndarray:
    """Points where ``name`` must be accurate, in ``dtype`` (sorted, unique).

    logit: smallest normal to 0.1 (log-spaced), 0.01..0.99, and 1 - eps/2 to
    0.9 (log-spaced towards 1). The others: +-(smallest normal to
    0.9 * log(max float)) log-spaced, and a dense grid on [-5, 5]. The dense
    interval also gets ``num_dense`` seeded uniform points, whose mantissas
    are arbitrary (an even grid's are not).
    """
    info = np.finfo(dtype)
    rng = np.random.default_rng(0)
    if name == "logit":
        parts = [np.geomspace(info.tiny, 0.1, num_log), np.linspace(0.01, 0.99, num_dense),
                 rng.uniform(0.01, 0.99, num_dense),
                 1 - np.geomspace(float(info.eps) / 2, 0.1, num_log).astype(dtype)]
    else:
        mags = np.geomspace(info.tiny, 0.9 * np.log(float(info.max)), num_log)
        parts = [-mags, mags, np.linspace(-5, 5, num_dense), rng.uniform(-5, 5, num_dense)]
    return np.unique(np.concatenate([np.asarray(p, dtype) for p in parts]))
