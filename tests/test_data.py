"""acetools.world.vision.data: registry, determinism, splits, sources, errors, online path, pool, fixtures."""

from __future__ import annotations

import gzip
import io
import math
import pickle

import numpy as np
import pytest
import torch

import acetools.world.vision.data as D
from acetools.world.vision.data import (
    SUITES,
    TASKS,
    DataSourceError,
    get_task,
    glyphs,
    load_split,
    online,
    registry,
    sources,
)
from acetools.world.vision.data._core import SampleStream, TaskData, balanced_labels, row_hashes


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    """One data folder for the module (the sources' partitions are cached per folder)."""
    return tmp_path_factory.mktemp("acetools-data")


def tiny_task(n_classes: int = 3, n: int = 60, seed: int = 0, split: str = "train", size: int = 32) -> TaskData:
    """``n`` gratings whose class is their orientation (``n_classes`` evenly spaced in 180°), random phase
    and contrast, a little noise; balanced classes. The same arguments always give the same bytes."""
    rng = np.random.default_rng([seed, {"train": 0, "val": 1, "test": 2}.get(split, 3), n_classes, size])
    y = np.arange(n) % n_classes
    rng.shuffle(y)
    c = np.arange(size) + 0.5 - size / 2
    xx, yy = np.meshgrid(c, c)
    theta = y * math.pi / n_classes + rng.uniform(-0.1, 0.1, n)
    phase = rng.uniform(0, 2 * math.pi, n)
    proj = xx[None] * np.cos(theta)[:, None, None] + yy[None] * np.sin(theta)[:, None, None]
    g = 0.5 + 0.4 * np.sin(2 * math.pi * proj / 6.0 + phase[:, None, None])
    img = g[:, None] * rng.uniform(0.5, 1.0, (n, 3, 1, 1)) + rng.normal(0, 0.03, (n, 3, size, size))
    x = np.clip(np.rint(img * 255), 0, 255).astype(np.uint8)
    return TaskData(x=torch.from_numpy(x), y=torch.from_numpy(y.astype(np.int64)),
                    class_names=tuple(f"{180 * k / n_classes:g} deg" for k in range(n_classes)),
                    name=f"tiny_task{n_classes}", split=split)


def _hashes(x) -> set[bytes]:
    return set(row_hashes(x))


def _require_offline_sources(root):
    """Skip where Fashion-MNIST or Animal-MNIST is missing — except in CI, whose setup must
    install them (apt-get install dataset-fashion-mnist; pip install --no-deps animal-mnist==0.4)."""
    import os

    try:
        sources.fashion_mnist(root)
        sources.animal_mnist(root)
    except DataSourceError as e:
        if os.environ.get("CI"):
            raise
        pytest.skip(str(e))


# ---------------------------------------------------------------- registry and suites
def test_registry_has_twenty_valid_tasks():
    assert len(TASKS) >= 20
    domains = {info.domain for info in TASKS.values()}
    assert len(domains) >= 6
    for name, info in TASKS.items():
        assert info.name == name
        assert info.n_classes == len(info.class_names) >= 2
        assert len(set(info.class_names)) == info.n_classes
        assert not info.online
        assert {"train", "val", "test"} <= set(info.sizes)
        assert info.sizes["val"] == 500 and info.sizes["test"] == 1000
        assert 3000 <= info.sizes["train"] <= 5000
        for other in info.conflicts_with:  # conflicts are symmetric and share the generator
            assert other in TASKS, (name, other)
            assert name in TASKS[other].conflicts_with
            assert TASKS[other].generator == info.generator


def test_suites_are_nested_prefixes():
    t8, t14, t20 = SUITES["tasks8"], SUITES["tasks14"], SUITES["tasks20"]
    assert (len(t8), len(t14), len(t20)) == (8, 14, 20)
    assert t14[:8] == t8 and t20[:14] == t14
    assert len(set(t20)) == 20 and set(t20) <= set(TASKS)
    o8, o14, o20 = SUITES["online8"], SUITES["online14"], SUITES["online20"]
    assert o14[:8] == o8 and o20[:14] == o14 and len(set(o20)) == 20
    assert all(get_task(n).online for n in o20)


def test_tasks8_has_no_conflicts_and_conflicts_grow():
    def n_conflicting(suite):
        names = set(SUITES[suite])
        return sum(any(o in names for o in TASKS[n].conflicts_with) for n in names)

    assert n_conflicting("tasks8") == 0
    assert len({TASKS[n].generator for n in SUITES["tasks8"]}) == 8
    assert 0 < n_conflicting("tasks14") < n_conflicting("tasks20")


def test_unknown_task_and_split_name_the_fix(root):
    with pytest.raises(ValueError, match="did you mean 'fashion'"):
        get_task("fasion")
    with pytest.raises(ValueError, match="unknown split 'valid'.*'train', 'val', 'test'"):
        load_split("tiny_count", "valid", root=root)
    with pytest.raises(ValueError, match="n=999"):
        load_split("tiny_count", "val", root=root, n=999)


# ---------------------------------------------------------------- fixtures
def test_tiny_suite_is_generated_balanced_and_never_cached(root):
    assert SUITES["tiny"] == ["tiny_shapes", "tiny_orient", "tiny_count"]
    for name in SUITES["tiny"]:
        splits = {s: load_split(name, s, root=root) for s in D.SPLITS}
        for s, d in splits.items():
            assert d.x.dtype == torch.uint8 and d.x.shape == (get_task(name).sizes[s], 3, 32, 32)
            assert d.y.dtype == torch.int64
            assert torch.bincount(d.y).tolist() == [len(d) // 3] * 3
        assert not (root / "cache").exists() or not list((root / "cache").glob(f"{name}-*"))  # never cached


def test_tiny_task_fixture():
    a, b = tiny_task(n_classes=4, n=40, seed=1), tiny_task(n_classes=4, n=40, seed=1)
    assert a.x.shape == (40, 3, 32, 32) and a.x.dtype == torch.uint8
    assert torch.equal(a.x, b.x) and torch.equal(a.y, b.y)
    assert torch.bincount(a.y).tolist() == [10] * 4
    assert not torch.equal(a.x, tiny_task(n_classes=4, n=40, seed=2).x)
    # numpy-only rendering: the bytes are pinned (a change here changes every test world)
    assert a.digest()[:16] == "e857cdba2765046b"


# ---------------------------------------------------------------- determinism and prefixes
def test_rng_streams_are_counter_based():
    a = SampleStream(7).rng(3).random(4)
    assert np.array_equal(a, SampleStream(7).rng(3).random(4))
    assert not np.array_equal(a, SampleStream(7).rng(4).random(4))
    assert not np.array_equal(a, SampleStream(8).rng(3).random(4))
    lab = balanced_labels(5, 23, 4)
    assert np.array_equal(lab[:10], balanced_labels(5, 10, 4))
    assert np.bincount(lab[:20]).tolist() == [5] * 4


@pytest.mark.parametrize("name", ["shapes", "letters", "digits", "parity", "fashion", "animals", "texture",
                                  "rotation", "count"])
def test_prefix_builds_are_deterministic_and_stable(name, root):
    if name in ("fashion", "animals"):
        _require_offline_sources(root)
    a = load_split(name, "val", root=root, n=12)
    b = load_split(name, "val", root=root, n=12)
    c = load_split(name, "val", root=root, n=20)
    assert a.digest() == b.digest()
    assert torch.equal(c.x[:12], a.x) and torch.equal(c.y[:12], a.y)
    n_classes = get_task(name).n_classes
    assert a.x.shape == (12, 3, 32, 32) and a.x.dtype == torch.uint8 and a.y.dtype == torch.int64
    assert int(a.y.min()) >= 0 and int(a.y.max()) < n_classes
    counts = torch.bincount(c.y, minlength=n_classes)
    assert int(counts.max()) - int(counts.min()) <= 1  # balanced to within one block


def test_every_task_loads_a_small_balanced_prefix(root):
    _require_offline_sources(root)
    for name, info in TASKS.items():
        n = 2 * info.n_classes
        d = load_split(name, "test", root=root, n=n)
        assert d.x.shape == (n, 3, 32, 32) and d.class_names == info.class_names
        assert torch.bincount(d.y, minlength=info.n_classes).tolist() == [2] * info.n_classes, name


def test_full_build_caches_checks_and_matches_prefix(root):
    name = "freq"  # the cheapest full task (gratings)
    full = {s: load_split(name, s, root=root) for s in D.SPLITS}
    cached = list((root / "cache").glob(f"{name}-*.npz"))
    assert len(cached) == 1
    again = load_split(name, "train", root=root)  # from the cache
    assert again.digest() == full["train"].digest()
    prefix = registry.SPECS[name].build("train", 50, root, False)
    assert np.array_equal(np.transpose(prefix[0], (0, 3, 1, 2)), full["train"].x[:50].numpy())
    sizes = {s: len(d) for s, d in full.items()}
    assert sizes == dict(get_task(name).sizes)
    for d in full.values():
        assert torch.bincount(d.y).tolist() == [len(d) // 4] * 4
    hs = {s: _hashes(d.x) for s, d in full.items()}
    assert not (hs["train"] & hs["val"]) and not (hs["train"] & hs["test"]) and not (hs["val"] & hs["test"])


# ---------------------------------------------------------------- real sources: partitions
def test_real_source_partitions_are_disjoint(root):
    _require_offline_sources(root)
    fp = registry.fashion_partition(root, False)
    parts = {k: set(np.concatenate(fp[k]).tolist()) for k in ("train", "val", "test")}
    parts["pool"] = set(fp["pool"].tolist())
    ap = registry.animal_partition(root)
    aparts = {k: set(np.concatenate(ap[k]).tolist()) for k in ("train", "val", "test", "pool")}
    dp = registry.digit_partition()
    dparts = {k: set(np.concatenate(dp[k]).tolist()) for k in ("train", "val", "test")}
    for p in (parts, aparts, dparts):
        keys = list(p)
        for i, a in enumerate(keys):
            for b in keys[i + 1:]:
                assert not (p[a] & p[b]), (a, b)
    # no Fashion-MNIST test image is reused, and every split has whole images, not copies
    assert all(i < len(fp["y"]) for i in parts["pool"])
    assert min(len(m) for m in fp["train"]) == registry.FASHION_PER_CLASS["train"]
    assert sum(len(m) for m in dp["test"]) >= 350  # digits: 20 % of the 1,797 source images


def test_glyph_fonts_split_between_tasks_and_pool():
    from acetools.world.vision.data.pool import HEADS

    assert not set(glyphs.TASK_FONTS) & set(glyphs.POOL_FONTS)
    assert "glyph" not in HEADS and HEADS["typeface"] == ("sans", "mono", "serif")  # no character labels


def test_dedupe_drops_conflicting_copies():
    x = np.zeros((5, 2, 2), np.uint8)
    x[1, 0, 0] = 1
    x[3, 0, 0] = 2
    x[4, 0, 0] = 2
    y = np.array([0, 1, 1, 3, 4])  # rows 0 and 2 are copies with labels 0 and 1; rows 3, 4 conflict
    assert sources.dedupe(x, y).tolist() == [1]
    y2 = np.array([0, 1, 0, 3, 3])
    assert sources.dedupe(x, y2).tolist() == [0, 1, 3]


def test_animal_unpickler_refuses_code():
    class Evil:
        def __reduce__(self):
            return (print, ("pwned",))

    buf = io.BytesIO(pickle.dumps(Evil()))
    with pytest.raises(pickle.UnpicklingError, match="refusing"):
        sources._NumpyOnlyUnpickler(buf).load()
    ok = io.BytesIO(pickle.dumps(np.arange(6, dtype=np.uint8).reshape(2, 3)))
    assert sources._NumpyOnlyUnpickler(ok).load().shape == (2, 3)


# ---------------------------------------------------------------- missing sources
def _clear_source_caches():
    registry.fashion_partition.cache_clear()
    registry.animal_partition.cache_clear()
    sources._read_fashion.cache_clear()
    sources._read_animals.cache_clear()


def test_missing_fashion_says_how_to_get_it(tmp_path, monkeypatch):
    monkeypatch.setattr(sources, "FASHION_SYSTEM_DIR", tmp_path / "nowhere")
    _clear_source_caches()
    try:
        with pytest.raises(DataSourceError, match=r"apt-get install dataset-fashion-mnist.*allow_download=True"):
            load_split("fashion", "train", root=tmp_path, n=4)
    finally:
        _clear_source_caches()


def test_missing_animals_says_how_to_get_it(tmp_path, monkeypatch):
    monkeypatch.setattr(sources, "animal_mnist_dir", lambda: None)
    _clear_source_caches()
    try:
        with pytest.raises(DataSourceError, match=r"pip install --no-deps animal-mnist==0\.4"):
            load_split("animals", "test", root=tmp_path, n=4)
    finally:
        _clear_source_caches()


def test_missing_fonts_say_how_to_get_them(tmp_path, monkeypatch):
    monkeypatch.setattr(glyphs, "matplotlib_font_dir", lambda: None)
    with pytest.raises(DataSourceError, match=r"pip install matplotlib.*fonts/"):
        load_split("letters", "val", root=tmp_path, n=3)


def _write_idx(path, arr: np.ndarray, gz: bool = False):
    header = bytes([0, 0, 8, arr.ndim]) + b"".join(int(s).to_bytes(4, "big") for s in arr.shape)
    data = header + np.ascontiguousarray(arr, dtype=np.uint8).tobytes()
    path.parent.mkdir(parents=True, exist_ok=True)
    if gz:
        with gzip.open(str(path) + ".gz", "wb") as fh:
            fh.write(data)
    else:
        path.write_bytes(data)


def test_fashion_reader_prefers_the_root_copy(tmp_path):
    rng = np.random.default_rng(0)
    for name, shape in (("train-images-idx3-ubyte", (20, 28, 28)), ("t10k-images-idx3-ubyte", (10, 28, 28))):
        _write_idx(tmp_path / "fashion-mnist" / name, rng.integers(0, 256, shape), gz=True)
    for name, n in (("train-labels-idx1-ubyte", 20), ("t10k-labels-idx1-ubyte", 10)):
        _write_idx(tmp_path / "fashion-mnist" / name, np.arange(n) % 10, gz=True)
    f = sources.fashion_mnist(tmp_path)
    assert f["train_x"].shape == (20, 28, 28) and f["test_y"].tolist() == list(range(10))
    sources._read_fashion.cache_clear()


# ---------------------------------------------------------------- online path on local fixtures
def _fake_mnist(root, n_train=50, n_test=20):
    """Tiny MNIST in torchvision's on-disk layout: <root>/torchvision/MNIST/raw/*-ubyte."""
    rng = np.random.default_rng(0)
    raw = root / "torchvision" / "MNIST" / "raw"
    xs = {}
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        x = rng.integers(0, 256, (n, 28, 28)).astype(np.uint8)
        y = (np.arange(n) % 10).astype(np.uint8)
        _write_idx(raw / f"{prefix}-images-idx3-ubyte", x)
        _write_idx(raw / f"{prefix}-labels-idx1-ubyte", y)
        xs[prefix] = (x, y)
    return xs


@pytest.fixture
def no_downloads(monkeypatch):
    """Every torchvision download entry point raises and records the attempt."""
    import torchvision.datasets as tvd
    import torchvision.datasets.mnist as tv_mnist
    import torchvision.datasets.utils as tvu

    calls = []

    def boom(*a, **k):
        calls.append((a, k))
        raise AssertionError("a download was attempted")

    for mod, attr in ((tvu, "download_url"), (tvu, "download_and_extract_archive"),
                      (tv_mnist, "download_and_extract_archive"), (tvd.MNIST, "download")):
        monkeypatch.setattr(mod, attr, boom)
    return calls


def test_online_task_loads_from_local_files_without_downloading(tmp_path, no_downloads):
    fake = _fake_mnist(tmp_path)
    tr = load_split("mnist", "train", root=tmp_path)
    va = load_split("mnist", "val", root=tmp_path)
    te = load_split("mnist", "test", root=tmp_path)
    assert no_downloads == []
    assert (len(tr), len(va), len(te)) == (45, 5, 20)  # val = 10 % of train; test = official test
    assert tr.x.shape == (45, 3, 32, 32) and tr.x.dtype == torch.uint8 and tr.y.dtype == torch.int64
    assert tr.class_names == tuple(str(i) for i in range(10))
    assert sorted(tr.y.tolist() + va.y.tolist()) == sorted(fake["train"][1].tolist())
    assert not (_hashes(tr.x) & _hashes(va.x)) and not (_hashes(tr.x) & _hashes(te.x))
    assert torch.equal(load_split("mnist", "train", root=tmp_path, n=7).x, tr.x[:7])
    # 28 → 32 px, grey → the three channels equal
    assert torch.equal(tr.x[:, 0], tr.x[:, 1]) and torch.equal(tr.x[:, 1], tr.x[:, 2])
    # converted once, then served from the cache even if the raw files go away
    import shutil

    shutil.rmtree(tmp_path / "torchvision")
    assert load_split("mnist", "test", root=tmp_path).digest() == te.digest()


def test_online_task_missing_never_downloads_and_names_the_fix(tmp_path, no_downloads):
    with pytest.raises(DataSourceError, match="allow_download=True"):
        load_split("mnist", "train", root=tmp_path)
    assert no_downloads == []


def test_online_allow_download_calls_torchvision_download(tmp_path, monkeypatch):
    import torchvision.datasets as tvd

    calls = []

    def fake_download(self):
        calls.append(self.root)
        _fake_mnist(tmp_path, n_train=30, n_test=10)

    monkeypatch.setattr(tvd.MNIST, "download", fake_download)
    te = load_split("mnist", "test", root=tmp_path, allow_download=True)
    assert len(calls) >= 1 and len(te) == 10


def test_online_specs_are_complete():
    for name in SUITES["online20"]:
        spec = online.ONLINE_SPECS[name]
        import torchvision.datasets as tvd

        assert hasattr(tvd, spec.cls), spec.cls
        assert spec.info.n_classes >= 2
    img = online.to_32px_rgb(np.zeros((40, 90, 3), np.uint8))
    assert img.shape == (32, 32, 3) and img.dtype == np.uint8


# ---------------------------------------------------------------- pretraining pool
def test_pool_heads_and_disjointness(root):
    _require_offline_sources(root)
    pool = D.pretraining_pool(root=root, n_per_source=30)
    n = len(pool)
    assert pool.x.shape == (n, 3, 32, 32) and pool.x.dtype == torch.uint8 and n == 30 * len(D.POOL_SOURCES)
    assert set(pool.labels) == set(pool.head_classes) and "domain" in pool.labels
    for head, lab in pool.labels.items():
        assert lab.dtype == torch.int64 and lab.shape == (n,)
        assert int(lab.max()) < pool.head_classes[head] and int(lab.min()) >= -1
        if head != "domain":
            assert 0 < int((lab >= 0).sum()) < n  # applies to one source only
    assert (pool.labels["domain"] >= 0).all()
    assert D.pretraining_pool(root=root, n_per_source=30).digest() == pool.digest()  # cached, same bytes
    # no pool image is in any task's val or test data (prefixes of the tasks sharing a source)
    ph = _hashes(pool.x)
    for name in ("fashion", "animals", "letters", "lowercase", "numerals", "shapes", "count", "texture"):
        for split in ("val", "test"):
            assert not (ph & _hashes(load_split(name, split, root=root, n=200).x)), (name, split)


# ---------------------------------------------------------------- calibration helpers
def test_calibration_helpers():
    from tests.conftest import load_script

    calibrate = load_script("calibrate_tasks")

    d = tiny_task(n_classes=3, n=90, seed=0)
    t = tiny_task(n_classes=3, n=60, seed=0, split="test")
    f = torch.nn.functional.one_hot(d.y, 3).float() * 5 + torch.randn(90, 3, generator=torch.Generator().manual_seed(0))
    assert calibrate.ncm_accuracy(f, d.y, f, d.y) > 0.9 and calibrate.ncm_accuracy(f, d.y, f, d.y, cosine=True) > 0.9
    assert 0.0 <= calibrate.ncm_accuracy(d.x, d.y, t.x, t.y) <= 1.0
    assert 0.0 <= calibrate.linear_accuracy(d.x, d.y, t.x, t.y, epochs=5) <= 1.0
    torch.manual_seed(0)
    res = calibrate.cnn_accuracy(d.x, d.y, t.x, t.y, seconds=1.0, max_epochs=2)
    assert set(res) == {"cnn", "cnn_train", "epochs"} and 1 <= res["epochs"] <= 2
    lum = calibrate.luminance(d.x)
    assert lum.shape == (90, 1, 32, 32)
