"""acetools.utils.cpu_threads, the one CPU-thread helper of the worlds, and its two call sites."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

from acetools.errors import InputError
from acetools.utils import cpu_threads
from acetools.world.vision.finetune import num_threads

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def torch_threads():
    """torch's thread count, given back after the test; a count the test can move to."""
    old = torch.get_num_threads()
    other = 1 if old != 1 else 2
    yield old, other
    torch.set_num_threads(old)


def test_sets_and_restores(torch_threads):
    old, other = torch_threads
    with cpu_threads(other) as got:
        assert got == other == torch.get_num_threads()
    assert torch.get_num_threads() == old


def test_restores_after_an_error(torch_threads):
    old, other = torch_threads
    with pytest.raises(RuntimeError, match="boom"), cpu_threads(other):
        raise RuntimeError("boom")
    assert torch.get_num_threads() == old


@pytest.mark.parametrize("n", [None, 0, -3])
def test_none_or_non_positive_leaves_torch_alone(torch_threads, monkeypatch, n):
    old, other = torch_threads
    monkeypatch.setenv("ACETOOLS_NUM_THREADS", str(other))
    with cpu_threads(n) as got:  # env_default=False: the variable is not read
        assert got == old == torch.get_num_threads()


def test_env_default_reads_the_variable_only_for_none(torch_threads, monkeypatch):
    old, other = torch_threads
    monkeypatch.setenv("ACETOOLS_NUM_THREADS", str(other))
    with cpu_threads(None, env_default=True) as got:
        assert got == other
    with cpu_threads(old, env_default=True) as got:  # an explicit n wins over the variable
        assert got == old
    monkeypatch.setenv("ACETOOLS_NUM_THREADS", "")
    with cpu_threads(None, env_default=True) as got:  # empty: torch's setting
        assert got == old
    monkeypatch.setenv("ACETOOLS_NUM_THREADS", "two")
    with pytest.raises(InputError, match="ACETOOLS_NUM_THREADS='two'"), cpu_threads(None, env_default=True):
        pass
    assert torch.get_num_threads() == old


def test_vision_num_threads_reads_the_variable(torch_threads, monkeypatch):
    old, other = torch_threads
    monkeypatch.setenv("ACETOOLS_NUM_THREADS", str(other))
    with num_threads() as got:
        assert got == other
    monkeypatch.delenv("ACETOOLS_NUM_THREADS")
    with num_threads() as got:
        assert got == old
    assert torch.get_num_threads() == old


def test_text_world_uses_the_helper_without_the_variable():
    """The text world's blocks go through cpu_threads with env_default=False (its ``threads``
    comes from its profile), and it keeps no thread helper of its own."""
    tree = ast.parse((ROOT / "acetools/world/text/world.py").read_text())
    methods = {f.name: f for f in ast.walk(tree) if isinstance(f, ast.FunctionDef)}

    def threaded(name: str) -> bool:  # the method runs its work inside `with cpu_threads(...)`
        return any(isinstance(w, ast.With) and "cpu_threads(" in ast.unparse(w.items[0].context_expr)
                   for w in ast.walk(methods[name]))

    # every method that runs the encoder: training, scoring, and the layer captures (WorldBase's
    # layer_inputs and gram_inputs both run through the world's _capture, which the text world holds)
    assert [m for m in ("expert_state", "correctness", "_capture") if not threaded(m)] == []
    assert "layer_inputs" not in methods and "gram_inputs" not in methods
    base = {f.name: f for f in ast.walk(ast.parse((ROOT / "acetools/world/base.py").read_text()))
            if isinstance(f, ast.FunctionDef)}
    assert all("self._capture(" in ast.unparse(base[m]) for m in ("layer_inputs", "gram_inputs"))
    calls = [c for c in ast.walk(tree) if isinstance(c, ast.Call) and getattr(c.func, "id", None) == "cpu_threads"]
    for c in calls:
        kw = {k.arg: k.value for k in c.keywords}
        assert isinstance(kw.get("env_default"), ast.Constant) and kw["env_default"].value is False
    assert not any("set_num_threads" in ast.unparse(n) for n in ast.walk(tree) if isinstance(n, ast.Call))


def test_part_loops_run_on_one_thread_and_give_torchs_threads_back(torch_threads, monkeypatch):
    """Streamed task arithmetic's chunks, TIES' parts and diagnose's small keys run on one CPU thread
    (docs/performance.md §Checkpoints on disk) and leave torch's thread count as it was."""
    import acetools.merging.ties as ties_module
    from acetools.files.diagnose import diagnose
    from acetools.merging import merge
    from acetools.merging.driver import Source
    from tests.conftest import make_world

    old, _ = torch_threads
    torch.set_num_threads(2)
    seen: list[int] = []
    real = ties_module.disjoint_merge
    monkeypatch.setattr(ties_module, "disjoint_merge", lambda *a: seen.append(torch.get_num_threads()) or real(*a))
    base, experts = make_world(n_tasks=3)
    merge("ties", base, experts, k=20)
    assert seen and set(seen) == {1} and torch.get_num_threads() == 2
    src = Source(base, experts)
    monkeypatch.setattr(torch.Tensor, "mul_", lambda t, s: seen.append(-torch.get_num_threads()) or t.mul(s))
    src.summed("visual.proj", 0.3, torch.device("cpu"))
    assert -1 in seen and -2 not in seen and torch.get_num_threads() == 2
    monkeypatch.undo()
    diagnose(base, experts, layout="open_clip")
    assert torch.get_num_threads() == 2
    torch.set_num_threads(old)
