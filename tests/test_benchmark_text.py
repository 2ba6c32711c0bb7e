"""The text world's bench rows under the papers' language protocol (docs/text-world.md §Benchmark):
the variant rows, the head protocol in every record and file name."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tests.conftest import load_script


@pytest.fixture(scope="module")
def text_world():
    return load_script("text_world")


@pytest.fixture(scope="module")
def fixture_world(tmp_path_factory):
    from acetools.world.text.world import TextWorld

    root = tmp_path_factory.mktemp("cache") / "text"
    return TextWorld("fixture", seed=0, profile="quick", root=root, threads=1).build(progress_bar=False)


def test_trained_heads_get_their_own_files_and_the_build_recipe(text_world, tmp_path, monkeypatch):
    """``bench`` builds its world as ``build`` does (PROTOCOLS), and the trained tables are text8_trained_*."""
    from acetools.world.text.finetune import PROTOCOLS

    monkeypatch.setenv("ACETOOLS_CACHE", str(tmp_path))
    args = {h: SimpleNamespace(suite="text8", heads=h, profile="full", threads=1, device="cpu") for h in PROTOCOLS}
    assert text_world._tag(args["zeroshot"]) == "text8" and text_world._tag(args["trained"]) == "text8_trained"
    for heads, recipe in PROTOCOLS.items():
        w = text_world._world(args[heads], 0)
        assert all(getattr(w.config, k) == v for k, v in recipe.items()) and w.config.heads == heads
    assert not text_world._world(args["trained"], 0).config.bf16  # the trained world trains in float32


def test_the_language_rows_are_variants_of_the_registered_methods(text_world):
    from acetools.merging.esm import ROBERTA, ROBERTA_ALPHA_GRID

    rows = text_world.TEXT_VARIANTS
    esm = dict(rows["esm (roberta)"])
    assert esm.pop("method") == "esm" and esm.pop("search").grid == ROBERTA_ALPHA_GRID and esm == ROBERTA
    ace = rows["ace (scale searched)"]
    assert ace["method"] == "ace" and ace["search"].param == "scaling" and len(ace) == 2  # the paper's ACE, scaled
    assert ace["search"].grid[0] == 0.1 and ace["search"].grid[-1] == 5.0
    assert rows["cart (block matrices)"]["targets"] == "blocks"
    assert {"wudi (lr 1e-4)", "wudi (lr 1e-3)"} <= set(rows)


def test_roberta_esm_and_scaled_ace_rows_run_on_the_text_world(text_world, fixture_world):
    import acetools
    from acetools.benchmark import Benchmark
    from acetools.merging.esm import ROBERTA, ROBERTA_ALPHA_GRID

    b = Benchmark(fixture_world, n_val=8, n_test=12, n_proxy=8, threads=1)
    esm, ace = (b.run(**{**text_world.TEXT_VARIANTS[k], "label": k}) for k in ("esm (roberta)", "ace (scale searched)"))
    assert esm.name == "esm (roberta)" and esm.coef_name == "alpha" and esm.coef in ROBERTA_ALPHA_GRID
    direct = acetools.merge("esm", b.base, b.experts, activations=b.esm_activations(), layout="bert",
                            alpha=esm.coef, **ROBERTA)
    assert b.evaluate(direct, "test") == pytest.approx(esm.test)
    assert ace.method == "ace" and ace.coef_name == "scaling" and ace.coef is not None
    assert b.record([esm, ace])["heads"] == "zeroshot"


def test_the_bench_adds_wudi_at_its_validation_step_size_and_names_the_heads(text_world, fixture_world, tmp_path,
                                                                            monkeypatch):
    import json

    import pandas as pd

    monkeypatch.setenv("ACETOOLS_CACHE", str(fixture_world.root.parent))
    text_world.main(["bench", "--suite", "fixture", "--profile", "quick", "--threads", "1", "--n-val", "8",
                     "--n-test", "12", "--methods", "wudi", "--variants", "wudi (lr 1e-4)", "wudi (lr 1e-3)",
                     "--out", str(tmp_path / "t"), "--results", str(tmp_path / "r")])
    stem = "fixture_minilm-1layer_seed0"
    s = pd.read_csv(tmp_path / "t" / f"{stem}_summary.csv").set_index("method")
    members = s.loc[["wudi", "wudi (lr 1e-4)", "wudi (lr 1e-3)"]]
    best = members["val_normalized"].idxmax()
    assert s.loc["wudi (lr on val)", "test_normalized"] == s.loc[best, "test_normalized"]
    assert s.loc["wudi (lr on val)", "coef"] == {"wudi": 1e-5, "wudi (lr 1e-4)": 1e-4, "wudi (lr 1e-3)": 1e-3}[best]
    assert json.loads((tmp_path / "t" / f"{stem}.json").read_text())["heads"] == "zeroshot"
    assert json.loads((tmp_path / "r" / f"bench_{stem}.json").read_text())["heads"] == "zeroshot"


def test_best_on_val_picks_the_member_with_the_best_validation_not_test():
    from acetools.benchmark import MethodRun, best_on_val, picked_rows

    def row(label, lr, val, test, secs):
        hp = {} if lr is None else {"lr": lr}
        return MethodRun("wudi", hp, None, None, {"a": val}, {"a": test}, {"a": val}, {"a": test}, secs, label=label)

    runs = [row(None, None, 0.5, 0.9, 1.0), row("wudi (lr 1e-4)", 1e-4, 0.8, 0.6, 2.0),
            row("wudi (lr 1e-3)", 1e-3, 0.7, 0.95, 3.0)]
    picked = best_on_val(runs, ["wudi", "wudi (lr 1e-4)", "wudi (lr 1e-3)"], "wudi (lr on val)", "lr")
    assert picked.name == "wudi (lr on val)" and picked.coef_name == "lr" and picked.coef == 1e-4
    assert picked.test == {"a": 0.6} and picked.merge_seconds == 6.0  # test at the val choice; every merge paid
    runs[0].val_normalized["a"] = 0.9  # the plain row (the registered default lr) wins
    assert best_on_val(runs, ["wudi", "wudi (lr 1e-4)"], "x", "lr").coef == 1e-5
    with pytest.raises(ValueError, match="no run named 'wudi .lr 1e-2.'"):
        best_on_val(runs, ["wudi (lr 1e-2)"], "x", "lr")
    # the drivers add every PICKED row whose members all ran, and none otherwise
    assert [r.name for r in picked_rows(runs)] == ["wudi (lr on val)"] and picked_rows(runs[:2]) == []
