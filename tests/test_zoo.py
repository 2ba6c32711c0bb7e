"""acetools.world.vision.zoo: hash-keyed safetensors cache of base, heads, experts and MTL; resume; corruption."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

import acetools.world.vision.finetune as ft
from acetools.files.checkpoints import CheckpointError, config_hash, load_checkpoint, save_checkpoint, state_hash
from acetools.merging import task_vectors
from acetools.world.vision.finetune import num_threads
from acetools.world.vision.zoo import Zoo, data_hash

THREADS = 1
PRETRAIN = dict(epochs=4, batch_size=64, lr=3e-3)
FINETUNE = dict(lr=3e-3, epochs=6, batch_size=32)
SEEDS = {"a": 0, "b": 10, "c": 20}


def corner_task(n, seed, n_classes, name, split):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, 120, (n, 3, 32, 32), generator=g, dtype=torch.uint8)
    y = torch.arange(n) % n_classes
    corners = [(4, 4), (4, 22), (22, 4), (22, 22)]
    jit = torch.randint(-2, 3, (n, 2), generator=g)
    for i in range(n):
        oy, ox = corners[int(y[i])]
        x[i, :, oy + int(jit[i, 0]) : oy + int(jit[i, 0]) + 10, ox + int(jit[i, 1]) : ox + int(jit[i, 1]) + 10] = 250
    return SimpleNamespace(x=x, y=y, name=name, split=split, class_names=[f"c{i}" for i in range(n_classes)])


def load_split(name, split):
    """Three tiny tasks: 'a' corners, 'b' the same generator with reversed labels, 'c' 4 corners."""
    seed = SEEDS[name] + {"train": 0, "val": 1, "test": 2}[split]
    n = 240 if split == "train" else 90
    t = corner_task(n, seed, 4 if name == "c" else 3, name, split)
    if name == "b":
        t.y = t.y.max() - t.y
    return t


def pretraining_pool(seed=0):
    t = corner_task(384, 100 + seed, 4, "pool", "train")
    colour = torch.arange(384) % 3
    x = t.x.clone()
    for c in range(3):
        x[colour == c, c] //= 3
    pos = t.y.clone()
    pos[::3] = -1
    return SimpleNamespace(x=x, labels={"pos": pos, "colour": colour}, head_classes={"pos": 4, "colour": 3})


class Counter:
    """Counts calls of the training functions the zoo uses (no timing involved)."""

    def __init__(self, monkeypatch):
        self.calls = []
        for name in ("pretrain_base", "finetune_expert", "train_multitask"):
            real = getattr(ft, name)

            def wrapped(*a, _real=real, _name=name, **k):
                self.calls.append((_name, getattr(a[2], "name", None) if _name == "finetune_expert" else None))
                return _real(*a, **k)

            monkeypatch.setattr(ft, name, wrapped)

    def count(self, name):
        return sum(1 for n, _ in self.calls if n == name)

    def reset(self):
        self.calls.clear()


def make_zoo(root, **kw):
    args = dict(size="micro", seed=0, root=root, base="train", load_split=load_split,
                pretraining_pool=pretraining_pool, pretrain=PRETRAIN, finetune=FINETUNE, threads=THREADS)
    args.update(kw)
    tasks = args.pop("tasks", ["a", "b", "c"])
    return Zoo(tasks, **args)


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    with num_threads(THREADS):
        yield


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """A 3-task micro world built once; later tests copy its cache."""
    root = tmp_path_factory.mktemp("zoo")
    import acetools.world.vision.models

    acetools.world.vision.models.register_model_configs()
    return root, make_zoo(root).build(progress=False)


def _copy(src, dst):
    import shutil

    shutil.copytree(src, dst, dirs_exist_ok=True)
    return dst


def _equal(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_micro_world_builds_every_part(built):
    root, zoo = built
    assert zoo.built == [("base", None), ("head", "a"), ("head", "b"), ("head", "c"),
                         ("expert", "a"), ("expert", "b"), ("expert", "c"), ("mtl", None)]
    # the experts are real: each beats the base's head on validation data
    for t in zoo.tasks:
        side = zoo.sidecar("expert", t)
        assert side["metrics"]["val_acc"] >= 0.85, (t, side["metrics"])
        assert side["metrics"]["val_acc"] > zoo.sidecar("head", t)["metrics"]["base_val_acc"] + 0.2
    assert set(zoo.sidecar("mtl")["metrics"]["val_acc"]) == {"a", "b", "c"}


def test_second_build_trains_nothing(built, tmp_path, monkeypatch):
    root, first = built
    counter = Counter(monkeypatch)
    zoo = make_zoo(_copy(root, tmp_path / "c")).build(progress=False)
    assert counter.calls == [] and zoo.built == []
    assert len(zoo.loaded) == 8
    assert _equal(zoo.base_state(), first.base_state())
    for t in zoo.tasks:
        assert _equal(zoo.expert_state(t), first.expert_state(t))
        assert torch.equal(zoo.head(t).weight, first.head(t).weight)
    assert _equal(zoo.mtl_state(), first.mtl_state())


def test_resume_after_deleting_one_expert_rebuilds_only_it(built, tmp_path, monkeypatch):
    root, first = built
    root2 = _copy(root, tmp_path / "c")
    victim = next((root2 / "micro" / "experts").glob("b-seed0-*.safetensors"))
    victim.unlink()  # an interrupted build: tensors gone (sidecar left behind)
    counter = Counter(monkeypatch)
    zoo = make_zoo(root2).build(progress=False)
    assert counter.calls == [("finetune_expert", "b")]
    assert zoo.built == [("expert", "b")]
    assert _equal(zoo.expert_state("b"), first.expert_state("b"))  # deterministic rebuild


def test_missing_lists_what_build_would_compute_and_builds_nothing(built, tmp_path, monkeypatch):
    root, first = built
    counter = Counter(monkeypatch)
    assert make_zoo(tmp_path / "empty").missing() == [("base", None), ("head", "a"), ("head", "b"), ("head", "c"),
                                                      ("expert", "a"), ("expert", "b"), ("expert", "c"), ("mtl", None)]
    assert make_zoo(tmp_path / "empty").missing(mtl=False)[-1] == ("expert", "c")
    assert not any((tmp_path / "empty").rglob("*.safetensors"))
    root2 = _copy(root, tmp_path / "c")
    assert make_zoo(root2).missing() == []
    next((root2 / "micro" / "experts").glob("b-seed0-*.safetensors")).unlink()
    zoo = make_zoo(root2)
    assert zoo.missing() == [("expert", "b")]  # the MTL model starts from the base and heads only
    assert counter.calls == [] and zoo.built == []
    zoo.build(progress=False)  # the dry run leaves the zoo usable
    assert zoo.built == [("expert", "b")] and zoo.missing() == []


def test_corrupt_or_truncated_files_are_detected_and_rebuilt(built, tmp_path, monkeypatch):
    root, first = built
    root2 = _copy(root, tmp_path / "c")
    a = next((root2 / "micro" / "experts").glob("a-seed0-*.safetensors"))
    raw = bytearray(a.read_bytes())
    raw[-8:] = b"\x00" * 8  # still a valid safetensors file, different weights
    a.write_bytes(bytes(raw))
    with pytest.raises(CheckpointError, match="content hash"):
        load_checkpoint(a)
    c = next((root2 / "micro" / "experts").glob("c-seed0-*.safetensors"))
    c.write_bytes(c.read_bytes()[:100])  # truncated mid-write
    with pytest.raises(CheckpointError, match="unreadable"):
        load_checkpoint(c)
    counter = Counter(monkeypatch)
    zoo = make_zoo(root2).build(progress=False)
    assert sorted(counter.calls) == [("finetune_expert", "a"), ("finetune_expert", "c")]
    assert _equal(zoo.expert_state("a"), first.expert_state("a"))
    load_checkpoint(a)  # repaired


def test_sidecar_keys_and_hashes(built):
    root, zoo = built
    path = zoo.path("expert", "a")
    side = json.loads(path.with_suffix(".json").read_text())
    state, _ = load_checkpoint(path)
    assert side["content_sha256"] == state_hash(state)
    assert side["key"] == config_hash(side["key_fields"]) and side["key"][:16] in path.name
    kf = side["key_fields"]
    assert kf["base"] == zoo.base_hash() and kf["head"] == zoo.sidecar("head", "a")["content_sha256"]
    assert kf["data"] == data_hash(load_split("a", "train")) and kf["seed"] == 0
    assert kf["finetune"]["lr"] == FINETUNE["lr"] and "model_version" in kf
    assert side["recipe"]["config"]["epochs"] == FINETUNE["epochs"] and side["seconds"] > 0
    assert all(k.startswith("visual.") for k in state)
    head_side = zoo.sidecar("head", "c")
    assert head_side["recipe"]["class_names"] == ["c0", "c1", "c2", "c3"]
    assert zoo.head("c").class_names == ["c0", "c1", "c2", "c3"]
    rows = zoo.records()
    assert {r["kind"] for r in rows} == {"base", "head", "expert", "mtl"} and len(rows) == 8


def test_changed_recipe_gets_new_experts_but_reuses_base_and_heads(built, tmp_path, monkeypatch):
    root, first = built
    counter = Counter(monkeypatch)
    zoo = make_zoo(_copy(root, tmp_path / "c"), tasks=["a"], finetune=FINETUNE | {"lr": 1e-3, "epochs": 1}, mtl=False)
    zoo.build(progress=False)
    assert counter.calls == [("finetune_expert", "a")]
    assert zoo.base_hash() == first.base_hash()
    counter.reset()
    make_zoo(_copy(root, tmp_path / "d"), tasks=["a"], seed=1, mtl=False,
             finetune=FINETUNE | {"epochs": 1}).build(progress=False)
    assert counter.calls == [("finetune_expert", "a")]  # another seed: another expert


def test_task_vectors_and_accessors(built):
    _, zoo = built
    taus = dict(zip(zoo.tasks, task_vectors(zoo.base_state(), list(zoo.experts().values()))))
    assert list(taus) == ["a", "b", "c"]
    base, ex = zoo.base_state(), zoo.expert_state("b")
    for k in base:
        torch.testing.assert_close(taus["b"][k], ex[k] - base[k])
    rel = (sum(float(v.norm() ** 2) for v in taus["a"].values()) ** 0.5
           / sum(float(v.norm() ** 2) for v in base.values()) ** 0.5)
    assert 0 < rel < 1
    with pytest.raises(KeyError):
        zoo.expert_state("zzz")
    enc = zoo.encoder(ex)
    assert _equal(enc.state_dict(), ex)


def test_a_benchmark_scores_the_zoo_with_its_own_batch_size_and_threads(built, monkeypatch):
    """The zoo is the vision world; a benchmark's view of it evaluates with the benchmark's settings."""
    from acetools.benchmark import Benchmark
    from acetools.world.base import check_world

    _, zoo = built
    check_world(zoo)
    seen, real = [], ft.correctness

    def correctness(*a, **k):
        seen.append((k["batch_size"], k["threads"]))
        return real(*a, **k)

    monkeypatch.setattr(ft, "correctness", correctness)
    bench = Benchmark(zoo, n_test=20, batch_size=7, threads=2)
    assert bench.world is not zoo and bench.world._states is zoo._states  # one cache
    assert (zoo.eval_batch_size, zoo.eval_threads, zoo.threads) == (512, None, THREADS)  # the zoo's own unchanged
    bench.evaluate(zoo.base_state(), "test")
    assert seen == [(7, 2)] * len(zoo.tasks)
    assert zoo.describe() == "vision mini-world 'custom': 3 tasks, ViT size micro, expert seed 0"


def test_shipped_base_is_used_and_verified(built, tmp_path, monkeypatch):
    _, zoo = built
    path = zoo.export_base(tmp_path / "assets")
    side = json.loads(path.with_suffix(".json").read_text())
    assert path.name == "base_micro.safetensors" and "command" in side and side["recipe"]["kind"] == "base"
    counter = Counter(monkeypatch)
    z2 = make_zoo(tmp_path / "fresh", tasks=["a"], base=path, mtl=False, finetune=FINETUNE | {"epochs": 1})
    assert _equal(z2.base_state(), zoo.base_state()) and z2.base_hash() == zoo.base_hash()
    assert counter.count("pretrain_base") == 0
    raw = bytearray(path.read_bytes())
    raw[-4:] = b"\x00" * 4
    path.write_bytes(bytes(raw))
    with pytest.raises(CheckpointError, match="base='train'"):
        make_zoo(tmp_path / "fresh2", tasks=["a"], base=path).base_state()


def test_a_user_base_without_sidecar_is_accepted_and_its_hash_recorded(built, tmp_path):
    """The Zoo docstring calls the sidecar optional; before, such a file was refused ("restore it from git")."""
    _, zoo = built
    path = zoo.export_base(tmp_path / "mine")
    path.with_suffix(".json").unlink()
    from safetensors.torch import load_file, save_file

    save_file(load_file(str(path)), str(path))  # no content_sha256 in the metadata either
    z2 = make_zoo(tmp_path / "fresh", tasks=["a"], base=path, mtl=False, finetune=FINETUNE | {"epochs": 1})
    assert _equal(z2.base_state(), zoo.base_state()) and z2.base_hash() == zoo.base_hash()
    book = json.loads((z2.folder / "base" / "user_bases.json").read_text())
    assert book == {str(path.resolve()): zoo.base_hash()}


def test_save_and_load_checkpoint_roundtrip(tmp_path):
    state = {"visual.proj": torch.randn(4, 3), "visual.class_embedding": torch.randn(4)}
    side = save_checkpoint(tmp_path / "x.safetensors", state, {"recipe": {"lr": 1e-3}})
    loaded, side2 = load_checkpoint(tmp_path / "x.safetensors")
    assert _equal(loaded, state) and side == side2 and side["recipe"] == {"lr": 1e-3}
    assert not list(tmp_path.glob(".*.tmp"))  # atomic writes leave no temporaries
    with pytest.raises(CheckpointError, match="no checkpoint"):
        load_checkpoint(tmp_path / "missing.safetensors")
    assert state_hash(state) != state_hash({**state, "visual.proj": state["visual.proj"] + 1e-7})


def test_zoo_validates_arguments(tmp_path):
    with pytest.raises(ValueError):
        make_zoo(tmp_path, tasks=["a", "a"])
    with pytest.raises(ValueError, match="unknown model size"):
        make_zoo(tmp_path, size="huge")


def test_cli_zoo_build_check_lists_missing_entries_and_builds_nothing(tmp_path, capsys):
    from acetools.cli import main

    args = ["zoo", "build", "--suite", "tiny", "--size", "micro", "--root", str(tmp_path), "--no-mtl", "--check"]
    assert main(args) == 1
    out = capsys.readouterr().out
    assert "seed=0: 7 to build (base, head/" in out and "expert/" in out
    assert not any(tmp_path.rglob("*.safetensors"))


def test_shipped_world_recipe_is_applied_under_explicit_overrides(tmp_path):
    from dataclasses import asdict

    from acetools.world.vision.finetune import FinetuneConfig
    from acetools.world.vision.zoo import WORLD_FINETUNE

    world = WORLD_FINETUNE["small"]
    small = Zoo(["a"], size="small", root=tmp_path, mtl=False)
    assert {k: asdict(small.finetune_config)[k] for k in world} == world
    # a dict overrides field by field, over the world's recipe
    mine = Zoo(["a"], size="small", root=tmp_path, finetune={"lr": 4e-4, "epochs": 1})
    assert (mine.finetune_config.lr, mine.finetune_config.epochs) == (4e-4, 1)
    assert mine.finetune_config.precision == world["precision"]
    # a config object is taken as it is; sizes without a world recipe keep the class defaults
    assert Zoo(["a"], size="small", root=tmp_path, finetune=FinetuneConfig()).finetune_config == FinetuneConfig()
    assert Zoo(["a"], size="micro", root=tmp_path).finetune_config == FinetuneConfig()
    with pytest.raises(TypeError, match=r"FinetuneConfig has no field\(s\) \['learning_rate'\]"):
        Zoo(["a"], size="small", root=tmp_path, finetune={"learning_rate": 1e-4})
