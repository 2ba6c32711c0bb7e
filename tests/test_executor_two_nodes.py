"""The multi-node path on one machine: a Ray cluster of two nodes (``ray.cluster_utils.Cluster``: a head and one
worker node, one CPU each) runs a small ``merge --search``, a small benchmark grid and a world build across both,
with the results of the serial run (acetools/executor.py; docs/performance.md §Executors).
"""

from __future__ import annotations

from functools import partial

import pytest
import torch

from acetools.benchmark import Benchmark
from acetools.executor import Executor
from acetools.files.search_merge import load_evaluation, search_merge

from .test_executor import built_micro_zoo, files, micro_zoo, same_weights, started

pytest.importorskip("transformers")
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def two_nodes():
    ray = pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    if ray.is_initialized():
        ray.shutdown()
    cluster = started(lambda: Cluster(initialize_head=True, head_node_args={"num_cpus": 1,
                                                                           "include_dashboard": False}))
    started(lambda: cluster.add_node(num_cpus=1))
    ray.init(address=cluster.address, log_to_driver=False)
    cluster.wait_for_nodes()
    yield ray
    ray.shutdown()
    cluster.shutdown()


def node_of_a_job(folder: str, name: str, other: str) -> str:
    """The node a job ran on, once the ``other`` job has started too (a file each in ``folder``): the two
    run at once, which one CPU on each node allows only on two nodes (a job that waits in vain fails)."""
    import time
    from pathlib import Path

    import ray

    (Path(folder) / name).touch()
    deadline = time.monotonic() + 120
    while not (Path(folder) / other).exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"job {name!r} ran alone: job {other!r} never started beside it")
        time.sleep(0.05)
    return ray.get_runtime_context().get_node_id()


def test_a_search_a_grid_and_a_build_across_two_nodes_match_serial(two_nodes, tmp_path):
    assert len([n for n in two_nodes.nodes() if n["Alive"]]) == 2
    ex = Executor("ray")
    assert ex.parallel == 2  # one CPU on each node
    base, experts, spec = files(tmp_path / "files")
    evaluate = load_evaluation(f"{spec}:evaluate")
    serial = search_merge("task_arithmetic", base, experts, tmp_path / "serial", evaluate, patience=2)
    on_ray = search_merge("task_arithmetic", base, experts, tmp_path / "ray", evaluate, patience=2, executor=ex)
    assert serial.record()["trace"] == on_ray.record()["trace"] and serial.value == on_ray.value
    same_weights(tmp_path / "serial", tmp_path / "ray")

    root = tmp_path / "zoo"
    built_micro_zoo(root)
    methods = ["weight_averaging", "task_arithmetic", "ties"]
    rows = {kind: Benchmark(built_micro_zoo(root), n_val=60, n_proxy=8, n_gram=64, threads=1,
                            source=partial(built_micro_zoo, root)).run_all(methods, references=False, executor=kind)
            for kind in ("serial", ex)}
    for a, b in zip(*rows.values()):
        assert (a.name, a.coef, a.val, a.test) == (b.name, b.coef, b.val, b.test)
    # a world build: the experts of two seeds as jobs on both nodes, each expert the serial one
    from acetools.world.vision.zoo import build_zoos

    (alone,) = build_zoos([micro_zoo(tmp_path / "serial_zoo", 1)])
    spread = build_zoos([micro_zoo(tmp_path / "ray_zoo", seed) for seed in (0, 1)], executor=ex)
    for t in alone.tasks:
        a, b = alone.expert_state(t), spread[1].expert_state(t)
        assert all(torch.equal(a[k], b[k]) for k in a), t
    # two jobs that wait for each other run at once, one on each node's CPU
    jobs = {"a": (str(tmp_path), "a", "b"), "b": (str(tmp_path), "b", "a")}
    assert len(set(ex.map(node_of_a_job, jobs).values())) == 2
