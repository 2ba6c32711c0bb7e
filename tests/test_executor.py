"""``--executor serial|ray`` (acetools/executor.py; docs/performance.md §Executors): a search's candidates, a
benchmark's rows and a zoo's experts as Ray tasks on a local cluster, bit-identical to serial; a failing job is
named after the others finished; a resumed grid skips what is done; serial never imports Ray.

The two-node cluster is tests/test_executor_two_nodes.py (one Ray cluster per module).
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TypeVar

import numpy as np
import pytest
import torch

from acetools.benchmark import Benchmark, row_path
from acetools.errors import InputError
from acetools.executor import Executor, TaskFailed, as_executor, require_ray
from acetools.files.checkpoints import open_checkpoint
from acetools.files.search_merge import load_evaluation, search_merge
from acetools.search import LAMBDA_GRID

from .test_lineage import _world
from .test_zoo import FINETUNE, PRETRAIN, load_split, pretraining_pool

pytest.importorskip("transformers")
ROOT = Path(__file__).resolve().parents[1]
T = TypeVar("T")
KEY = "bert.encoder.layer.0.attention.self.query.weight"

#: The user's evaluation: minus the distance of the merged query weight to a target (task arithmetic at
#: LAMBDA_GRID[2]); a candidate at ``FAIL`` raises (read from the candidate's acetools_merge.json).
EVAL = '''
import json
import torch
from safetensors.torch import load_file

TARGET = torch.load({target!r})
FAIL = {fail!r}


def evaluate(model, task):
    lam = json.loads(open(f"{{model}}/acetools_merge.json").read())["hparams"]["lam"]
    if FAIL is not None and abs(lam - FAIL) < 1e-9:
        raise RuntimeError(f"the evaluation broke at lam={{lam:g}}")
    w = load_file(f"{{model}}/model.safetensors")[{key!r}]
    return -float((w - TARGET).norm()) + 0.01 * len(task)
'''


def micro_zoo(root: Path, seed: int = 0):
    """The zoo tests' 3-task micro world, built into (or loaded from) ``root``: a benchmark's ``source``."""
    from acetools.world.vision.zoo import Zoo

    return Zoo(["a", "b", "c"], size="micro", seed=seed, root=root, base="train", load_split=load_split,
               pretraining_pool=pretraining_pool, pretrain=PRETRAIN, finetune=FINETUNE, threads=1, mtl=False)


def built_micro_zoo(root: Path, seed: int = 0):
    return micro_zoo(root, seed).build(progress=False)


def files(root: Path, fail: float | None = None) -> tuple[Path, list[Path], str]:
    """The lineage tests' BERT base and three experts, and the user's evaluation (``fail``: a λ that raises)."""
    base, experts, _ = _world(root)
    W0 = open_checkpoint(base).get(KEY.removeprefix("bert."))
    taus = [open_checkpoint(e).get(KEY) - W0 for e in experts]
    torch.save(W0 + LAMBDA_GRID[2] * sum(taus), root / "target.pt")
    for name, f in (("eval.py", None), ("broken_eval.py", fail)):
        (root / name).write_text(EVAL.format(target=str(root / "target.pt"), key=KEY, fail=f))
    return base, experts, str(root / "eval.py")


def same_weights(a: Path, b: Path) -> None:
    ca, cb = open_checkpoint(a), open_checkpoint(b)
    assert sorted(ca.keys()) == sorted(cb.keys())
    for k in ca.keys():
        assert torch.equal(ca.get(k), cb.get(k)), k


@pytest.mark.slow
def test_serial_needs_no_ray(tmp_path):
    code = f"""
import sys
from pathlib import Path
import torch
from safetensors.torch import save_file
import acetools.cli
from acetools.files.search_merge import search_merge
root = Path({str(tmp_path)!r})
torch.manual_seed(0)
W0 = torch.randn(16, 16)
save_file({{"layer.weight": W0}}, str(root / "base.safetensors"))
experts = []
for t in range(3):
    save_file({{"layer.weight": W0 + 0.1 * torch.randn(16, 16)}}, str(root / f"e{{t}}.safetensors"))
    experts.append(root / f"e{{t}}.safetensors")
found = search_merge("task_arithmetic", root / "base.safetensors", experts, root / "m", lambda m, t: -len(t),
                     patience=1, force=True)
assert found.result.trace, "no candidate was evaluated"
assert "ray" not in sys.modules, "a serial search imported ray"
print("ok")
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


def test_missing_ray_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    with pytest.raises(InputError, match=r"pip install 'acetools\[scale\]'"):
        require_ray()
    with pytest.raises(InputError, match=r"acetools\[scale\]"):
        _ = Executor("ray").parallel


def test_executor_options_are_checked():
    assert as_executor(None).kind == "serial" and as_executor("serial").parallel == 1
    with pytest.raises(InputError, match="executor='dask'"):
        as_executor("dask")
    with pytest.raises(InputError, match="workers=0"):
        as_executor("ray", workers=0)
    with pytest.raises(InputError, match="--executor ray"):
        as_executor("serial", address="auto")


def test_a_serial_failure_is_named_after_the_others_ran():
    with pytest.raises(TaskFailed, match=r"1 of 3 jobs failed .*b: ZeroDivisionError") as err:
        Executor().map(lambda x: 1 / x, {"a": (1,), "b": (0,), "c": (2,)})
    assert err.value.results == {"a": 1.0, "c": 0.5}


# --------------------------------------------------------------------------- on a local Ray cluster

def started(start: Callable[[], T], tries: int = 5) -> T:
    """``start()``, tried again where a node timed out during startup: Ray waits 30 s (a constant in
    ray/_private/node.py) for a raylet whose agents a loaded 2-core machine may start more slowly."""
    for _ in range(tries - 1):
        try:
            return start()
        except Exception as e:  # noqa: BLE001 - Ray raises a bare Exception for this
            if "timed out during startup" not in str(e):
                raise
    return start()


@pytest.fixture(scope="module")
def ray_cluster():
    ray = pytest.importorskip("ray")
    if ray.is_initialized():
        ray.shutdown()
    started(lambda: ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False))
    yield ray
    ray.shutdown()


@pytest.fixture(scope="module")
def search_files(tmp_path_factory):
    return files(tmp_path_factory.mktemp("executor_search"), fail=LAMBDA_GRID[1])


@pytest.mark.slow
def test_grid_search_on_ray_is_bit_identical_to_serial(ray_cluster, search_files, tmp_path):
    base, experts, spec = search_files
    evaluate = load_evaluation(f"{spec}:evaluate")
    serial = search_merge("task_arithmetic", base, experts, tmp_path / "serial", evaluate, patience=2)
    on_ray = search_merge("task_arithmetic", base, experts, tmp_path / "ray", evaluate, patience=2,
                          executor=Executor("ray", workers=2))
    assert serial.value == on_ray.value == pytest.approx(LAMBDA_GRID[2])
    assert serial.record()["trace"] == on_ray.record()["trace"]  # the same candidates, the same scores
    assert serial.result.stopped_early and on_ray.result.stopped_early
    same_weights(tmp_path / "serial", tmp_path / "ray")
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # the candidates were removed


@pytest.mark.slow
def test_tpe_batches_on_ray_are_bit_identical_to_serial_batches(ray_cluster, search_files, tmp_path):
    pytest.importorskip("optuna")
    from acetools.files.tpe_merge import tpe_search_merge

    base, experts, spec = search_files
    evaluate = load_evaluation(f"{spec}:evaluate")
    runs = {kind: tpe_search_merge("task_arithmetic", base, experts, tmp_path / kind, evaluate, trials=4, seed=3,
                                   batch=2, executor=kind) for kind in ("serial", "ray")}
    serial, on_ray = runs["serial"].record(), runs["ray"].record()
    assert serial["batch"] == on_ray["batch"] == 2
    assert serial["trace"] == on_ray["trace"] and len(serial["trace"]) == 4
    same_weights(tmp_path / "serial", tmp_path / "ray")


def span(seconds: float) -> tuple[float, float]:
    """A job's start and end (wall clock) around ``seconds`` of sleep."""
    import time

    t0 = time.time()
    time.sleep(seconds)
    return t0, time.time()


@pytest.mark.slow
def test_workers_caps_the_jobs_in_flight(ray_cluster):
    one = sorted(Executor("ray", workers=1).map(span, {f"j{i}": (0.3,) for i in range(3)}).values())
    assert all(end <= nxt_start for (_, end), (nxt_start, _) in zip(one, one[1:]))  # one after another
    two = sorted(Executor("ray", workers=2).map(span, {f"j{i}": (4.0,) for i in range(2)}).values())
    assert two[1][0] < two[0][1]  # both at once on the 2-CPU cluster (4 s: longer than a worker's start)


@pytest.mark.slow
def test_merge_search_on_the_command_line_with_ray(ray_cluster, search_files, tmp_path, capsys):
    pytest.importorskip("optuna")
    from acetools.cli import main

    base, experts, spec = search_files
    common = ["merge", "--method", "task_arithmetic", "--base", str(base), "--experts", *map(str, experts),
              "--search", f"{spec}:evaluate", "-q"]
    for kind in ("serial", "ray"):
        assert main([*common, "--out", str(tmp_path / kind), "--executor", kind]) == 0
        assert f"chosen lam={LAMBDA_GRID[2]:g}" in capsys.readouterr().out
        tpe = [*common, "--out", str(tmp_path / f"tpe-{kind}"), "--executor", kind, "--searcher", "tpe",
               "--trials", "2", "--batch", "2"]
        assert main(tpe) == 0
    same_weights(tmp_path / "serial", tmp_path / "ray")
    same_weights(tmp_path / "tpe-serial", tmp_path / "tpe-ray")
    assert main([*common, "--out", str(tmp_path / "x"), "--batch", "2"]) == 2  # --batch is TPE's
    assert "--searcher tpe option" in capsys.readouterr().err


@pytest.mark.slow
def test_a_failing_candidate_is_named_and_the_others_finish(ray_cluster, search_files, tmp_path):
    pytest.importorskip("optuna")
    from acetools.files.search_merge import score_candidate

    base, experts, spec = search_files
    broken = load_evaluation(f"{spec.replace('eval.py', 'broken_eval.py')}:evaluate")
    with pytest.raises(TaskFailed, match=rf"lam={LAMBDA_GRID[1]:g}: RuntimeError: the evaluation broke"):
        search_merge("task_arithmetic", base, experts, tmp_path / "m", broken, executor="ray")
    assert not (tmp_path / "m").exists() or not list((tmp_path / "m").glob("*.safetensors"))
    # a batch of candidates: the failing one is named, the others' scores come back
    jobs = {f"lam={lam:g}": (tmp_path / f"c{i}", "task_arithmetic", base, experts, {"lam": lam}, {"force": True},
                             ["t"], broken, f"lam={lam:g}") for i, lam in enumerate(LAMBDA_GRID[:3])}
    with pytest.raises(TaskFailed, match=rf"1 of 3 jobs failed .*lam={LAMBDA_GRID[1]:g}") as err:
        Executor("ray").map(score_candidate, jobs)
    assert sorted(err.value.results) == [f"lam={LAMBDA_GRID[0]:g}", f"lam={LAMBDA_GRID[2]:g}"]


@pytest.fixture(scope="module")
def zoo_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("executor_zoo")
    built_micro_zoo(root)
    return root


def _bench(root: Path) -> Benchmark:
    return Benchmark(built_micro_zoo(root), n_val=60, n_proxy=8, n_gram=64, threads=1,
                     source=partial(built_micro_zoo, root))


@pytest.mark.slow
def test_bench_rows_on_ray_are_bit_identical_and_resume_either_way(ray_cluster, zoo_root, tmp_path):
    methods = ["weight_averaging", "task_arithmetic", "ties"]
    serial = _bench(zoo_root).run_all(methods, references=False, store=tmp_path / "serial")
    on_ray = _bench(zoo_root).run_all(methods, references=False, store=tmp_path / "ray", executor="ray")
    for a, b in zip(serial, on_ray):
        assert (a.name, a.coef, a.val, a.test) == (b.name, b.coef, b.val, b.test)
        assert a.test_correct is not None and b.test_correct is not None
        assert all(np.array_equal(a.test_correct[t], b.test_correct[t]) for t in a.test_correct)
    # a ray run resumes a serial one: the kept row is not recomputed, the rest is
    store = tmp_path / "mixed"
    _bench(zoo_root).run_all(methods[:1], references=False, store=store)
    kept = row_path(store, methods[0]).stat().st_mtime_ns
    rows = _bench(zoo_root).run_all(methods[:2], references=False, store=store, executor="ray")
    assert row_path(store, methods[0]).stat().st_mtime_ns == kept and row_path(store, methods[1]).is_file()
    assert [r.test for r in rows] == [r.test for r in serial[:2]]
    # and a serial run resumes a ray one
    kept2 = row_path(store, methods[1]).stat().st_mtime_ns
    _bench(zoo_root).run_all(methods, references=False, store=store)
    assert row_path(store, methods[1]).stat().st_mtime_ns == kept2 and row_path(store, methods[2]).is_file()


@pytest.mark.slow
def test_a_failing_bench_row_is_named_and_the_others_are_kept(ray_cluster, zoo_root, tmp_path):
    bench = _bench(zoo_root)
    extra = {"ties (broken)": {"method": "ties", "search": None, "no_such_option": 1}}
    with pytest.raises(TaskFailed, match=r"1 of 3 jobs failed .*ties \(broken\)"):
        bench.run_all(["weight_averaging", "task_arithmetic"], references=False, extra=extra,
                      store=tmp_path, executor="ray")
    assert row_path(tmp_path, "weight_averaging").is_file() and row_path(tmp_path, "task_arithmetic").is_file()
    with pytest.raises(InputError, match="source="):
        Benchmark(bench.world, threads=1).run_all(["weight_averaging"], executor="ray")


@pytest.mark.slow
def test_zoo_build_on_ray_is_bit_identical_and_resumes(ray_cluster, tmp_path):
    from acetools.world.vision.zoo import build_zoos

    (serial,) = build_zoos([micro_zoo(tmp_path / "serial")])
    on_ray = build_zoos([micro_zoo(tmp_path / "ray", seed) for seed in (0, 1)], executor="ray")
    assert ("expert", "a") in on_ray[0].loaded and ("expert", "a") not in on_ray[0].built  # built by a worker
    for t in serial.tasks:
        a, b = serial.expert_state(t), on_ray[0].expert_state(t)
        assert all(torch.equal(a[k], b[k]) for k in a), t
    again = build_zoos([micro_zoo(tmp_path / "ray", seed) for seed in (0, 1)], executor="ray")
    assert all(not z.built for z in again)  # everything came from the cache


def test_the_cli_takes_the_executor_options(tmp_path, capsys):
    from acetools.cli import main

    assert main(["merge", "--method", "task_arithmetic", "--base", "b", "--experts", "e", "--out",
                 str(tmp_path / "o"), "--executor", "ray"]) == 2
    assert "add --search" in capsys.readouterr().err
    assert main(["bench", "--workers", "2", "--methods", "ties"]) == 2
    assert "add --executor ray" in capsys.readouterr().err


def test_text_world_build_on_ray_is_bit_identical_and_resumes(ray_cluster, tmp_path):
    from acetools.world.text.world import FIXTURE_TASKS, TextWorld, build_experts

    tasks = sorted(FIXTURE_TASKS)[:2]

    def world(root: Path, seed: int = 0) -> TextWorld:
        return TextWorld(tasks, seed=seed, profile="quick", root=root, threads=1)

    serial = world(tmp_path / "serial")
    assert all(build_experts([serial]).values())
    built = build_experts([world(tmp_path / "ray", seed) for seed in (0, 1)], executor="ray")
    assert sorted(built) == sorted(f"seed {s} {t}" for s in (0, 1) for t in tasks) and all(built.values())
    fresh = world(tmp_path / "ray")
    for t in tasks:
        a, b = serial.expert_state(t), fresh.expert_state(t)
        assert all(torch.equal(a[k], b[k]) for k in a), t
    assert not fresh.built  # read from what the workers wrote
    assert not any(build_experts([world(tmp_path / "ray", seed) for seed in (0, 1)], executor="ray").values())


def test_build_experts_refuses_a_world_it_would_build_wrongly(tmp_path):
    from acetools.world.text.lora import TextLoraWorld
    from acetools.world.text.world import FIXTURE_TASKS, build_experts

    lora = TextLoraWorld(sorted(FIXTURE_TASKS)[:1], profile="quick", root=tmp_path, threads=1)
    with pytest.raises(InputError, match="TextLoraWorld"):
        build_experts([lora])
