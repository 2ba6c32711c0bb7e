"""The registry is the one place that knows a method (issue 22).

A toy method registered once, in this file, is found by ``acetools merge --help``, the
benchmark harness (its searched coefficient and its data input), the streamed file merge (its
scope and its per-key input) and the docs' methods table; docs/methods.md carries the table
generated from the built-in registrations.
"""

from __future__ import annotations

import importlib
import inspect
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

import acetools
from acetools.merging import _registry
from acetools.merging._registry import REQUIRED, Param, Search, register
from tests.scripts import load_script

TABLE = load_script("methods_table")
TABLE_BEGIN, TABLE_END, methods_table = TABLE.TABLE_BEGIN, TABLE.TABLE_END, TABLE.methods_table

ROOT = Path(__file__).resolve().parents[1]
KEYS = {"blocks.0.mlp.weight": (4, 3), "blocks.0.mlp.bias": (4,)}


def _toy(base, task_vectors, *, is_matrix, c=1.0, grams=None):
    """c * (1/T) sum_t tau_t G_t on matrices with a Gram, the mean elsewhere."""
    T = len(task_vectors)
    out = {}
    for k, w in base.items():
        if is_matrix(k, w) and all(k in g for g in grams):
            out[k] = c * sum(tv[k] @ g[k].to(w.dtype) for tv, g in zip(task_vectors, grams)) / T
        else:
            out[k] = c * sum(tv[k] for tv in task_vectors) / T
    return out


@pytest.fixture
def toy():
    """Register ``toy`` (one place: this decorator) and remove it afterwards."""
    register("toy", "a toy: c times the Gram-weighted mean task vector", key_scope="key", per_key=("grams",),
             data_inputs=("grams",), search=Search("c", "grid", (0.5, 1.0, 1.5)), needs_layout=True,
             c=Param("coefficient", low=0.0), grams=Param("one {key: G_t} dict per expert"))(_toy)
    yield acetools.METHODS["toy"]
    _registry._REGISTRY.pop("toy")


class _World:
    """The smallest world: one matrix and one bias, scored by closeness to each expert."""

    kind, tasks, seed, size, layout, device, name = "toy", ["a", "b"], 0, "toy", None, "cpu", "toy"

    def __init__(self):
        g = torch.Generator().manual_seed(0)
        self._base = {k: torch.randn(*s, generator=g) for k, s in KEYS.items()}
        self._experts = {t: {k: v + 0.1 * torch.randn(v.shape, generator=g) for k, v in self._base.items()}
                         for t in self.tasks}
        self.gram_calls = 0

    def describe(self):
        return "toy world"

    def base_state(self):
        return dict(self._base)

    def expert_state(self, task):
        return dict(self._experts[task])

    def evaluate(self, state, task, split="test", n=None):
        d = sum(float((state[k] - self._experts[task][k]).pow(2).sum()) for k in KEYS)
        return 1.0 / (1.0 + d)

    def matrix_keys(self):
        return ["blocks.0.mlp.weight"]

    def proxy_inputs(self, task, n, seed=0):
        raise AssertionError("the toy declares no activations")

    def layer_inputs(self, state, inputs, keys):
        raise AssertionError("the toy declares no activations")

    def gram_examples(self, task, n):
        return task

    def gram_inputs(self, state, inputs, keys):
        self.gram_calls += 1
        return {k: torch.eye(3) * (2.0 if inputs == "a" else 1.0) for k in keys}

    def records(self):
        return []


def test_toy_method_is_everywhere_from_one_registration(toy, tmp_path, capsys):
    from acetools.benchmark import Benchmark
    from acetools.cli import main
    from acetools.files.merge_files import merge_files

    # the command line lists it (and accepts it as --method)
    assert main(["merge", "--help"]) == 0
    help_text = capsys.readouterr().out
    assert "toy (streamed): a toy: c times the Gram-weighted mean task vector" in help_text

    # the benchmark harness searches its coefficient on its grid and collects its data input
    world = _World()
    bench = Benchmark(world)
    assert set(bench.method_inputs("toy")) == {"grams"} and world.gram_calls == 2
    run = bench.run("toy")
    assert run.coef_name == "c" and run.coef in (0.5, 1.0, 1.5) and len(run.search) == 3

    # the streamed file merge cuts its per-key input to each key and equals the in-memory merge
    base, experts = world.base_state(), [world.expert_state(t) for t in world.tasks]
    save_file(base, str(tmp_path / "base.safetensors"))
    for t, e in zip(world.tasks, experts):
        save_file(e, str(tmp_path / f"{t}.safetensors"))
    grams = bench.grams()
    res = merge_files("toy", tmp_path / "base.safetensors", [tmp_path / f"{t}.safetensors" for t in world.tasks],
                      tmp_path / "out", hparams={"c": 0.7, "grams": grams}, layout="generic", progress=False)
    assert res.plan.mode == "stream" and res.plan.scope == "key"
    from safetensors.torch import load_file

    got = load_file(str(next((tmp_path / "out").glob("*.safetensors"))))
    want = acetools.merge("toy", base, experts, layout="generic", c=0.7, grams=grams)
    for k in KEYS:
        torch.testing.assert_close(got[k], want[k], rtol=0, atol=0)

    # the docs' methods table
    assert "| `toy` | key | `grams` | `grams` | `c` on a grid of 3 (0.5 … 1.5) | yes |" in methods_table()


def test_docs_methods_table_is_the_registry():
    text = (ROOT / "docs" / "methods.md").read_text(encoding="utf-8")
    block = text.split(TABLE_BEGIN, 1)[1].split(TABLE_END, 1)[0].strip()
    assert block == methods_table(), ("docs/methods.md's methods table is out of date: run "
                                      "python3 scripts/methods_table.py")


def test_methods_table_script_rewrites_only_the_block(tmp_path):
    update = TABLE.update_methods_table
    doc = tmp_path / "methods.md"
    doc.write_text(f"intro\n{TABLE_BEGIN}\n| stale |\n{TABLE_END}\noutro\n", encoding="utf-8")
    assert update(doc) is True
    assert doc.read_text(encoding="utf-8") == f"intro\n{TABLE_BEGIN}\n{methods_table()}\n{TABLE_END}\noutro\n"
    assert update(doc) is False
    doc.write_text("no block", encoding="utf-8")
    with pytest.raises(ValueError, match="no .* block"):
        update(doc)


def test_a_declaration_names_real_parameters_and_reads_defaults_from_the_signature():
    def fn(base, task_vectors, *, is_matrix, c=1.0):
        return {}

    with pytest.raises(TypeError, match="has no keyword parameter 'lam'"):
        register("bad_param", "x", lam=Param("lam"))(fn)
    with pytest.raises(TypeError, match="first argument is the one-line doc"):
        register("bad_param", "x", c=Param(1.0, "c"))(fn)  # the old Param(default, doc)
    with pytest.raises(ValueError, match=r"bad_range: hyperparameter c=1.0 is out of range: must be >= 2"):
        register("bad_range", "x", c=Param("c", low=2.0))(fn)
    with pytest.raises(ValueError, match="per_key names 'grams'"):
        register("bad_per_key", "x", per_key=("grams",))(fn)
    with pytest.raises(ValueError, match="search names 'lam'"):
        register("bad_search", "x", search=Search("lam", "grid", (1.0,)))(fn)
    assert not {"bad_param", "bad_range", "bad_per_key", "bad_search"} & set(acetools.METHODS)
    try:
        assert register("good", "x", c=Param("c"))(fn) is fn  # the function itself, its signature untouched
        assert acetools.METHODS["good"].params["c"].default == 1.0
    finally:
        _registry._REGISTRY.pop("good", None)


def test_unregistered_scope_is_in_memory():
    register("toy_model", "no scope declared")(lambda base, task_vectors, *, is_matrix: {})
    try:
        scope, why = acetools.METHODS["toy_model"].key_scope()
        assert scope == "model" and "key_scope" in why
    finally:
        _registry._REGISTRY.pop("toy_model")


def _signature_defaults(fn) -> dict:
    return {n: (REQUIRED if q.default is inspect.Parameter.empty else q.default)
            for n, q in inspect.signature(fn).parameters.items() if q.kind is inspect.Parameter.KEYWORD_ONLY}


@pytest.mark.parametrize("method", sorted(acetools.METHODS))
def test_each_method_writes_its_defaults_in_its_signature(method):
    """The registry's defaults are the registered function's signature (docs/methods.md's tables are checked
    against them in tests/test_docs.py), and every public function of the method's module that takes a
    hyperparameter by the same name (the per-matrix functions the lessons call) has the same default, or the
    value its preset gives a ``None``."""
    info = acetools.METHODS[method]
    sig = _signature_defaults(info.func)
    assert {n: sig[n] for n in info.params} == info.hparams
    module = importlib.import_module(info.func.__module__)
    registered = {i.func for i in acetools.METHODS.values()}  # each checked against its own registration
    preset = info.effective(info.hparams)  # a stage may take the value a None stands for (ACE's numerator)
    differ = {}
    for name in getattr(module, "__all__", []):
        fn = getattr(module, name)
        if inspect.isfunction(fn) and fn not in registered and fn.__module__ == module.__name__:
            differ.update({f"{name}({n})": (d, info.hparams[n]) for n, d in _signature_defaults(fn).items()
                           if n in info.params and d is not REQUIRED and d not in (info.hparams[n], preset[n])})
    assert not differ, f"defaults that differ from {method}'s signature: {differ}"


def test_ace_matrix_shows_its_defaults():
    from acetools.merging.ace import ace_matrix

    sig = inspect.signature(ace_matrix).parameters
    assert sig["eps"].default == 1e-2 and sig["tau"].default == 0.3 and sig["estimator"].default == "ace"
    d = [torch.randn(5, 4, generator=torch.Generator().manual_seed(t)) for t in range(3)]
    _, diag = ace_matrix(d)
    assert diag.gate == "auto" and diag.estimator == "ace"
    W1, _ = ace_matrix(d, tau=acetools.METHODS["ace"].params["tau"].default)
    torch.testing.assert_close(W1, ace_matrix(d)[0], rtol=0, atol=0)
