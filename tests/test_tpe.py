"""The TPE searcher (acetools/tpe.py, acetools/files/tpe_merge.py; docs/your-models.md §Several hyperparameters
at once: TPE): one seed gives the same trials, ``--method auto`` finds the method a known evaluation favours,
the record holds each method's best, and a missing optuna is one line saying how to install it.
"""

from __future__ import annotations

import json
import sys

import pytest

from acetools.cli import main
from acetools.merging import METHODS
from acetools.tpe import SPACES, auto_methods, tpe_search

from .test_lineage import _world

pytest.importorskip("optuna")

#: A toy evaluation whose answer is known: each method's ceiling, reached at its first coefficient = 0.7.
CEILING = {"task_arithmetic": 0.5, "ties": 0.6, "dare": 0.4, "tsv_m": 0.9, "iso_c": 0.7, "iso_cts": 0.65,
           "cart": 0.55, "ace": 0.75}


def _toy(method: str, hp: dict[str, float]) -> dict[str, float]:
    first = next(iter(SPACES[method]))
    peak = CEILING[method] - (hp[first] - 0.7) ** 2
    return {"a": peak + 0.01, "b": peak - 0.01}


def test_the_space_names_registered_hyperparameters_and_auto_leaves_out_data_inputs():
    for method, space in SPACES.items():
        assert set(space) <= set(METHODS[method].params), method
        for name, d in space.items():  # every corner of the space is a valid hyperparameter
            for v in (d.low, d.high):
                METHODS[method].resolve({name: int(v) if d.integer else v})
    assert "regmean" not in auto_methods() and "esm" not in auto_methods() and "tsv_m" in auto_methods()


def test_one_seed_gives_the_same_trials_another_seed_others():
    runs = [tpe_search(_toy, ["ties", "tsv_m"], 12, seed=s) for s in (3, 3, 4)]
    key = [[(t.method, t.hparams) for t in r.trials] for r in runs]
    assert key[0] == key[1] and key[0] != key[2]
    assert all(len(r.trials) == 12 for r in runs)


def test_auto_finds_the_method_the_evaluation_favours_with_fewer_trials_than_one_grid():
    res = tpe_search(_toy, "auto", 24, seed=0)
    assert res.methods == auto_methods()
    assert res.best.method == "tsv_m" and res.best.mean > CEILING["tsv_m"] - 0.05
    per = res.per_method()
    for m, row in per.items():
        assert row["best_mean"] == max(t.mean for t in res.trials if t.method == m)
        assert row["trials"] == sum(t.method == m for t in res.trials)
    assert max(per, key=lambda m: per[m]["best_mean"]) == "tsv_m"


def test_bad_arguments_are_one_line_errors():
    with pytest.raises(ValueError, match="weight_averaging has no TPE search space"):
        tpe_search(_toy, "weight_averaging", 3)
    with pytest.raises(ValueError, match="trials=0 must be a positive int"):
        tpe_search(_toy, "ties", 0)
    with pytest.raises(ValueError, match="do not also give -p alpha"):
        tpe_search(_toy, "tsv_m", 3, fixed={"alpha": 1.0})
    with pytest.raises(ValueError, match="gave nan for task 'a'"):
        tpe_search(lambda m, hp: {"a": float("nan")}, "ties", 2)


def test_missing_optuna_is_one_line_saying_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "optuna", None)  # import optuna raises ImportError
    with pytest.raises(ValueError, match=r"needs optuna: pip install 'acetools\[search\]'"):
        tpe_search(_toy, "ties", 3)


EVAL = '''
import json


def evaluate(model, task):
    """Known answer: the method written in the candidate's record, and its first coefficient near 0.7."""
    info = json.load(open(f"{{model}}/acetools_merge.json"))
    ceiling = {ceiling!r}[info["method"]]
    first = {{"tsv_m": "alpha", "iso_c": "alpha", "iso_cts": "alpha", "ace": "scaling"}}.get(info["method"], "lam")
    return ceiling - (info["hparams"][first] - 0.7) ** 2 + (0.01 if task == "task2" else 0.0)
'''


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:cart:RuntimeWarning")  # CART's name rule on BERT's keys
def test_merge_method_auto_writes_the_best_method_and_each_methods_best(tmp_path, capsys):
    base, experts, _ = _world(tmp_path)
    (tmp_path / "user_eval.py").write_text(EVAL.format(ceiling=CEILING))
    out = tmp_path / "merged"
    argv = ["merge", "--method", "auto", "--base", str(base), "--experts", *map(str, experts), "--out", str(out),
            "--search", f"{tmp_path / 'user_eval.py'}:evaluate", "--searcher", "tpe", "--trials", "16", "-q"]
    assert main(argv) == 0
    text = capsys.readouterr().out
    info = json.loads((out / "acetools_merge.json").read_text())
    s = info["search"]
    assert s["searcher"] == "tpe" and s["trials"] == len(s["trace"]) == 16 and s["seed"] == 0
    assert info["method"] == s["method"] == "tsv_m" and info["hparams"]["alpha"] == pytest.approx(s["hparams"]["alpha"])
    for m, row in s["per_method"].items():
        assert row["best_mean"] == pytest.approx(max(t["mean"] for t in s["trace"] if t["method"] == m))
    assert set(s["methods"]) | set(s["skipped"]) == set(auto_methods())
    assert "chosen tsv_m alpha=" in text and text.count("<- chosen") == 1
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # candidates removed
    # the same seed, the same trials
    assert main([*argv[:-1], "--out", str(tmp_path / "again"), "-q"]) == 0
    again = json.loads((tmp_path / "again" / "acetools_merge.json").read_text())["search"]
    assert [(t["method"], t["hparams"]) for t in again["trace"]] == [(t["method"], t["hparams"]) for t in s["trace"]]


def test_merge_cli_refuses_auto_without_the_tpe_searcher(tmp_path, capsys):
    base, experts, _ = _world(tmp_path)
    common = ["--base", str(base), "--experts", *map(str, experts), "--out", str(tmp_path / "m")]
    assert main(["merge", "--method", "auto", *common]) == 2
    assert "--method auto is chosen by your evaluation" in capsys.readouterr().err
    assert main(["merge", "--method", "ties", *common, "--searcher", "tpe"]) == 2
    assert "--searcher and --trials choose how --search searches" in capsys.readouterr().err
    assert not (tmp_path / "m").exists()
