"""acetools_course.lesson01_theorem1: the verdicts of ace.theorem1, ace.theorem1_vit and ace.unified."""

from __future__ import annotations

import pandas as pd
import pytest

from acetools_course import lesson01_theorem1 as TV
from acetools_course import lesson01_theorem1 as th


def _frame(cos, **cols):
    return pd.DataFrame({"cosine": cos, "cosine_sq": cos, "subspace_overlap": 1.0, "identity_cosine": 0.4, **cols})


def test_verdict_theorem1_thresholds():
    curves = pd.concat([_frame([0.6, 0.6], model=m, steps=s) for m in ("linear layer, SGD", "2-layer ReLU")
                        for s in (3, 300)], ignore_index=True)
    adam = _frame([0.5, 0.5])
    # the paper's "∝" is cosine 1: reproduced
    assert TV.verdict_theorem1(_frame([1.0, 1.0]), curves, adam, steps=50).verdict == "reproduced"
    assert TV.verdict_theorem1(_frame([0.9, 0.95]), curves, adam, steps=50).verdict == "reproduced"
    v = TV.verdict_theorem1(_frame([0.7, 0.8]), curves, adam, steps=50)
    assert v.verdict == "partly" and "after 300 steps 0.600" in v.measured and v.numbers["cosine_adam"] == 0.5
    assert TV.verdict_theorem1(_frame([0.2, 0.3]), curves, adam, steps=50).verdict == "not reproduced"
    with pytest.raises(ValueError, match="no rows"):
        TV.median_cosine(curves, model="nope")


def test_verdict_theorem1_vit_rules():
    def vit(cos, ident, cross=0.0):
        return pd.DataFrame({"layer_type": ["a", "a", "b", "b"], "cosine": cos, "identity_cosine": ident,
                             "cross_task_cosine": cross})

    kw = dict(vit_base=vit([0.5] * 4, 0.1), vit_gram=vit([0.5] * 4, 0.1), n_images=8, suite="s", size="micro")
    assert TV.verdict_theorem1_vit(vit([0.95, 0.99, 0.92, 0.9], 0.2), **kw).verdict == "reproduced"
    v = TV.verdict_theorem1_vit(vit([0.6, 0.5, 0.3, 0.1], [0.2, 0.2, 0.2, 0.2]), **kw)  # beats I in 3 of 4 cells
    assert v.verdict == "partly" and v.numbers["beats_identity"] == 0.75 and "a 0.55" in v.measured
    assert TV.verdict_theorem1_vit(vit([0.1] * 4, 0.2), **kw).verdict == "not reproduced"


def test_verdict_unified_and_synthetic_checks():
    exact = th.unified_linear(eps=0.0, n_tasks=2, d_in=6, d_out=12, n_train=200, steps=10)
    checks = th.synthetic_checks(exact)
    assert checks["identity_synthetic"] <= TV.TOLERANCES["identity_synthetic"]
    assert checks["given_jls"] <= TV.TOLERANCES["given_jls"]
    assert checks["wudi_gradient"] <= TV.TOLERANCES["wudi_gradient"]
    acc = pd.DataFrame({"method": ["identity", "wudi", "ace", "given", "given_gram", "ace_full"],
                        "test_normalized": [70.0, 71, 72, 73, 74, 75]})
    gains = pd.Series({"ace": 90.0, "given": 99.0})
    ok = TV.verdict_unified({**checks, "identity_vit": 1e-8, "identity_route": 2e-8}, acc, gains, gains, eps=1e-4)
    assert ok.verdict == "reproduced" and "to 2.0e-08 (mini-world)" in ok.measured
    bad = TV.verdict_unified({**checks, "identity_vit": 1e-3, "identity_route": 0.0}, acc, gains, gains, eps=1e-4)
    assert bad.verdict == "not reproduced" and "identity_vit" in bad.reason
