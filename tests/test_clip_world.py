"""The CLIP ViT-B/32 world (issue 21) on tiny fakes the tests write (tests/clip_fakes.py): nothing
downloads. Loading (``--models-root``, the Hugging Face cache layout, ``datasets``, the open_clip
layout), CLIP's preprocessing, zero-shot heads against transformers' own logits, the caches,
one-line errors for what is missing offline, every merge method end to end, the registry and
the command line of the issue."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from tests.clip_fakes import fake_hf_cache, fake_images, fake_models, fake_openclip, train_experts

pytest.importorskip("transformers")

from acetools.world.clip.tasks import BASE_ID, CLIP_SUITES, CLIP_TASKS  # noqa: E402

CLIP8 = list(CLIP_SUITES["clip8"])


@pytest.fixture(scope="module")
def fakes(tmp_path_factory):
    """``(models_root, data_root)`` for the eight clip8 tasks (two class folders each, the task's first
    and last class; the head keeps all its classes), experts fine-tuned on the fake images."""
    root = tmp_path_factory.mktemp("clipfakes")
    data = root / "D"
    for i, t in enumerate(CLIP8):
        names = CLIP_TASKS[t].classnames
        fake_images(data, t, [c.replace("/", " ") for c in (names[0], names[-1])], n_train=6, n_test=4, seed=i)
    models = fake_models(root / "M", CLIP8)
    train_experts(models, data, CLIP8)
    return models, data


def world(fakes, tmp_path, tasks=("mnist", "eurosat"), **kw):
    from acetools.world.clip import ClipWorld

    models, data = fakes
    return ClipWorld("clip8", tasks=list(tasks), models_root=models, data_root=data, device="cpu",
                     root=tmp_path / "cache", **kw)


# --------------------------------------------------------------------------- the task table

def test_task_table():
    assert [len(CLIP_SUITES[s]) for s in ("clip8", "clip14", "clip20")] == [8, 14, 20]
    assert CLIP_SUITES["clip20"][:14] == CLIP_SUITES["clip14"] and CLIP_SUITES["clip14"][:8] == CLIP_SUITES["clip8"]
    assert CLIP8 == ["sun397", "stanford-cars", "resisc45", "eurosat", "svhn", "gtsrb", "mnist", "dtd"]
    assert BASE_ID == "openai/clip-vit-base-patch32"
    for t in CLIP_SUITES["clip20"]:
        spec = CLIP_TASKS[t]
        assert spec.expert == f"tanganke/clip-vit-base-patch32_{t}"
        assert spec.classnames and len(set(spec.classnames)) == len(spec.classnames), t
        assert spec.templates and all("{c}" in x for x in spec.templates), t
    assert len(CLIP_TASKS["sun397"].classnames) == 397 and len(CLIP_TASKS["stanford-cars"].classnames) == 196
    assert CLIP_TASKS["svhn"].config == "cropped_digits" and CLIP_TASKS["fer2013"].columns == {"jpg": "image",
                                                                                                 "cls": "label"}
    assert CLIP_TASKS["mnist"].prompts()[3] == ['a photo of the number: "3".']


@pytest.mark.oracle
def test_task_table_matches_fusionbench():
    pytest.importorskip("fusion_bench")
    import importlib.util

    spec = importlib.util.spec_from_file_location("gen", Path(__file__).parents[1] / "scripts"
                                                  / "clip_tasks_from_fusionbench.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    got = gen.build()
    shipped = json.loads(gen.OUT.read_text())
    assert got["tasks"] == shipped["tasks"] and got["suites"] == shipped["suites"]


# --------------------------------------------------------------------------- preprocessing and heads

def test_preprocessing_is_clips():
    from PIL import Image
    from transformers import CLIPImageProcessor

    from acetools.world.clip.data import normalize, preprocess
    from acetools.world.vision.models import IMAGE_STD

    rng = np.random.default_rng(0)
    for shape in ((50, 37, 3), (31, 80, 3), (224, 224, 3)):
        im = Image.fromarray(rng.integers(0, 256, shape, dtype=np.uint8))
        ours = normalize(preprocess(im, 224)[None], "cpu")
        ref = CLIPImageProcessor()(images=im, return_tensors="pt")["pixel_values"]
        assert ours.shape == ref.shape == (1, 3, 224, 224)
        # the same geometry; PIL's and transformers' resampling round a few pixels differently
        # (at most 2 grey levels of 255, on < 1 % of the pixels)
        d = (ours - ref.float()).abs()
        assert float(d.max()) <= 2.5 / 255 / min(IMAGE_STD) and float((d > 1e-4).float().mean()) < 0.01, shape


def test_heads_and_logits_are_transformers_clip(fakes, tmp_path):
    """Base logits = CLIPModel's own logits_per_image (one template: mnist); a head with several
    templates is the normalised mean of the normalised projected prompts (eurosat)."""
    from transformers import CLIPModel

    from acetools.world.clip.data import normalize
    from acetools.world.clip.models import tokenize

    w = world(fakes, tmp_path)
    model = CLIPModel.from_pretrained(str(fakes[0] / BASE_ID)).eval()
    px, _, _ = w.pixels("mnist", "test")
    f, _ = w.features(w.base_state(), "mnist", "test")
    ours = w.logits(f, "mnist")
    prompts = [p[0] for p in CLIP_TASKS["mnist"].prompts()]
    ids, mask = tokenize(fakes[0] / BASE_ID, prompts, 77)
    with torch.no_grad():
        ref = model(input_ids=ids, attention_mask=mask, pixel_values=normalize(px, "cpu")).logits_per_image
    assert ours.shape == ref.shape == (len(px), 10)
    assert torch.allclose(ours, ref, atol=1e-4, rtol=1e-4)

    W, scale, _ = w.head("eurosat")
    assert W.shape[0] == 10 and scale == pytest.approx(float(model.logit_scale.detach().exp()))
    for c in (0, 5):
        ids, mask = tokenize(fakes[0] / BASE_ID, CLIP_TASKS["eurosat"].prompts()[c], 77)
        with torch.no_grad():
            e = model.get_text_features(input_ids=ids, attention_mask=mask)
        e = getattr(e, "pooler_output", e)
        want = torch.nn.functional.normalize(torch.nn.functional.normalize(e, dim=-1).mean(0), dim=-1)
        assert torch.allclose(W[c], want, atol=1e-5)


def test_merged_part_is_the_vision_tower(fakes, tmp_path):
    w = world(fakes, tmp_path)
    base = w.base_state()
    assert base and all(k.startswith("vision_model.") for k in base)
    assert set(w.expert_state("mnist")) == set(base)
    assert not torch.equal(w.expert_state("mnist")["vision_model.encoder.layers.0.mlp.fc1.weight"],
                           base["vision_model.encoder.layers.0.mlp.fc1.weight"])
    keys = w.matrix_keys()
    assert len(keys) == 2 * 6 and all(k in base for k in keys)  # q/k/v/out_proj, fc1, fc2 per layer
    assert w.layout == "hf_clip" and w.kind == "clip"
    recs = w.records()
    assert [r["kind"] for r in recs][:1] == ["clip_base"] and all(len(r["content_sha256"]) == 64 for r in recs)


def test_caps_and_splits(fakes, tmp_path):
    w = world(fakes, tmp_path, n_test=3, n_val=1)
    _, test = w.eval_indices("mnist", "test")
    assert len(test) == 3 and len(set(test)) == 3
    _, tr = w.split_indices("mnist", "train")
    _, va = w.split_indices("mnist", "val")
    assert len(tr) + len(va) == 2 * 6 and not set(tr) & set(va)  # val carved from train, FusionBench's rule
    assert len(w.eval_indices("mnist", "val")[1]) == 1
    assert w.proxy_inputs("mnist", 5, seed=0).shape[0] == len(va)  # drawn from the whole val split
    assert w.gram_examples("mnist", 4).shape == (4, 3, 32, 32)
    with pytest.raises(ValueError, match="n_test"):
        world(fakes, tmp_path, n_test=0)


def test_caches_are_reused(fakes, tmp_path, monkeypatch):
    w = world(fakes, tmp_path)
    first = w.evaluate_all(w.base_state())
    w.evaluate(w.expert_state("mnist"), "mnist")
    assert list((tmp_path / "cache" / "heads").glob("*.safetensors"))
    assert list((tmp_path / "cache" / "pixels").glob("*.npy"))
    assert list((tmp_path / "cache" / "features").glob("*.pt"))
    import acetools.world.clip.data as data
    import acetools.world.clip.models as models

    def boom(*a, **k):
        raise AssertionError("recomputed although cached")

    monkeypatch.setattr(models, "zeroshot_head", boom)
    monkeypatch.setattr(data, "preprocess", boom)
    w2 = world(fakes, tmp_path)
    w2.build(False)
    monkeypatch.setattr(w2, "_features", boom)  # the base's features come from the cache
    assert w2.evaluate_all(w2.base_state()) == first


def test_imagefolder_with_other_class_names(fakes, tmp_path):
    from acetools.world.clip import ClipWorld

    data = tmp_path / "D"
    fake_images(data, "dtd", ["stripes_x", "zigzag_y"], n_train=4, n_test=2, n_val=2)
    w = ClipWorld("clip8", tasks=["dtd"], models_root=fakes[0], data_root=data, device="cpu", root=tmp_path / "c")
    assert w.classnames("dtd") == ("stripes_x", "zigzag_y")
    assert w.head("dtd")[0].shape[0] == 2
    assert len(w.split_indices("dtd", "val")[1]) == 4  # its own val folder
    fake_images(data, "gtsrb", ["a", "b"], n_train=0, n_test=2, n_val=2)  # no train folder: val serves RegMean
    w = ClipWorld("clip8", tasks=["gtsrb"], models_root=fakes[0], data_root=data, device="cpu", root=tmp_path / "c")
    assert w.gram_examples("gtsrb", 10).shape[0] == 4


# --------------------------------------------------------------------------- missing things, offline

def test_missing_model_is_one_line(fakes, tmp_path):
    from acetools.world.clip import ClipWorld
    from acetools.world.clip.hub import MissingResource

    empty = tmp_path / "empty"
    empty.mkdir()
    w = ClipWorld("clip8", tasks=["mnist"], models_root=empty, data_root=fakes[1], device="cpu")
    with pytest.raises(MissingResource) as err:
        w.base_state()
    msg = str(err.value)
    assert "\n" not in msg and BASE_ID in msg and "hf download" in msg and "--models-root" in msg


def test_hf_cache_layout(fakes, tmp_path, monkeypatch):
    import huggingface_hub.constants as hc

    from acetools.world.clip import ClipWorld
    from acetools.world.clip.hub import MissingResource, model_folder

    cache = tmp_path / "hub"
    snap = fake_hf_cache(cache, fakes[0])
    fake_hf_cache(cache, fakes[0], "tanganke/clip-vit-base-patch32_mnist")
    monkeypatch.setattr(hc, "HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert model_folder(BASE_ID) == snap
    w = ClipWorld("clip8", tasks=["mnist", "eurosat"], data_root=fakes[1], device="cpu", root=tmp_path / "c")
    acc = w.evaluate(w.expert_state("mnist"), "mnist")
    ref = world(fakes, tmp_path).evaluate(world(fakes, tmp_path).expert_state("mnist"), "mnist")
    assert acc == ref
    with pytest.raises(MissingResource) as err:  # eurosat's expert is not in the cache
        w.expert_state("eurosat")
    msg = str(err.value)
    assert "\n" not in msg and "tanganke/clip-vit-base-patch32_eurosat" in msg and "HF_HUB_OFFLINE" in msg


def test_datasets_path(fakes, tmp_path, monkeypatch):
    import datasets
    from PIL import Image

    from acetools.world.clip import ClipWorld
    from acetools.world.clip.hub import MissingResource

    calls = []

    def fake_load(path, name=None, split=None):
        calls.append((path, name, split))
        if path != "mnist":
            raise FileNotFoundError(f"{path} is not cached")
        rng = np.random.default_rng(len(calls))
        imgs = [Image.fromarray(rng.integers(0, 256, (28, 28), dtype=np.uint8)) for _ in range(12)]
        return datasets.Dataset.from_dict({"image": imgs, "label": [i % 10 for i in range(12)]},
                                          features=datasets.Features({"image": datasets.Image(),
                                                                      "label": datasets.ClassLabel(10)}))

    monkeypatch.setattr(datasets, "load_dataset", fake_load)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    w = ClipWorld("clip8", tasks=["mnist", "eurosat"], models_root=fakes[0], device="cpu", root=tmp_path / "c")
    assert 0.0 <= w.evaluate(w.base_state(), "mnist") <= 1.0
    assert ("mnist", None, "test") in calls
    assert len(w.split_indices("mnist", "val")[1]) == 1 and len(w.split_indices("mnist", "train")[1]) == 11
    with pytest.raises(MissingResource) as err:
        w.evaluate(w.base_state(), "eurosat")
    msg = str(err.value)
    assert "\n" not in msg and "tanganke/eurosat" in msg and "--data-root" in msg and "offline" in msg


def test_missing_data_folder_is_one_line(fakes, tmp_path):
    from acetools.world.clip import ClipWorld
    from acetools.world.clip.hub import MissingResource

    empty = tmp_path / "nodata"
    empty.mkdir()
    w = ClipWorld("clip8", tasks=["mnist"], models_root=fakes[0], data_root=empty, device="cpu")
    with pytest.raises(MissingResource, match="dataset mnist: no folder"):
        w.evaluate(w.base_state(), "mnist")


# --------------------------------------------------------------------------- end to end

def test_every_method_end_to_end(fakes, tmp_path):
    from acetools.benchmark import Benchmark
    from acetools.merging import METHODS

    w = world(fakes, tmp_path, n_val=4, n_test=4)
    bench = Benchmark(w, n_val=4, n_test=4, n_proxy=4, n_gram=6, patience=2)
    runs = bench.run_all(list(METHODS), progress=False)
    summary = bench.summary(runs)
    assert list(summary["method"])[:2] == ["base (zero-shot heads)", "experts (individual)"]
    assert set(METHODS) <= set(summary["method"])
    assert summary["test_acc"].between(0, 100).all() and np.isfinite(summary["test_normalized"]).all()
    assert summary.set_index("method").loc["experts (individual)", "test_normalized"] == pytest.approx(100)
    paths = bench.save(runs, tmp_path / "out", "clip")
    rec = json.loads(paths["json"].read_text())
    assert rec["world"] == "clip" and rec["tasks"] == ["mnist", "eurosat"] and len(rec["checkpoints"]) == 3
    assert set(pd.read_csv(paths["per_task"])["task"]) == {"mnist", "eurosat"}


def test_search_leaves_out_experts_at_zero(fakes, tmp_path, monkeypatch, caplog):
    """Tiny or random experts may score 0 on a few validation images: the search then averages the
    normalized accuracy of the other tasks (none left: the absolute accuracy) and says so."""
    import logging

    from acetools.benchmark import Benchmark

    bench = Benchmark(world(fakes, tmp_path, n_val=4, n_test=4), n_val=4, n_test=4, patience=1)
    real = bench.expert_accuracy
    for zero in (("mnist",), ("mnist", "eurosat")):
        monkeypatch.setattr(bench, "expert_accuracy", lambda split="test", z=zero: {
            t: (0.0 if split == "val" and t in z else v) for t, v in real(split).items()})
        with caplog.at_level(logging.WARNING, logger="acetools.benchmark"):
            run = bench.run("task_arithmetic")
        assert set(run.val) == set(run.test) == {"mnist", "eurosat"} and run.coef is not None
        assert "score 0 on validation" in caplog.text
        searched = {c.split(":")[0] for c in run.search.columns if ":" in c}
        assert searched == ({"eurosat"} if len(zero) == 1 else {"mnist", "eurosat"})
        caplog.clear()


def test_untrained_fakes_run_end_to_end(tmp_path, capsys):
    """The issue's command on random tiny models (experts not fine-tuned: some score 0)."""
    from acetools.cli import main

    data = tmp_path / "D"
    for i, t in enumerate(CLIP8):
        fake_images(data, t, list(CLIP_TASKS[t].classnames[:2]), n_train=4, n_test=4, seed=i)
    models = fake_models(tmp_path / "M", CLIP8, seed=7)
    rc = main(["bench", "--world", "clip-vit-b32", "--suite", "clip8", "--models-root", str(models), "--data-root",
               str(data), "--n-val", "4", "--n-test", "8", "--methods", "task_arithmetic", "tsv_m", "ace", "--out",
               str(tmp_path / "OUT"), "--root", str(tmp_path / "cache"), "--quiet"])
    assert rc == 0, capsys.readouterr().err
    assert (tmp_path / "OUT" / "clip8_clip-vit-b32_seed0_summary.csv").is_file()


def test_regime_card_on_the_clip_world(fakes, tmp_path):
    from acetools.regime import regime_card

    card = regime_card(world(fakes, tmp_path, tasks=CLIP8), n_val=2, n_test=2, patience=1, n_act=4,
                       progress=False)
    df = card.to_frame().set_index("metric")
    assert np.isfinite(df.loc["tsv_norm", "value"])
    assert np.isfinite(df.loc["act_overlap", "value"])  # activations through the world interface
    assert df.loc["tsv_norm", "clip"] == pytest.approx(100 * 85.9 / 92.8, rel=1e-3)  # the papers' number beside


# --------------------------------------------------------------------------- the open_clip layout

def test_openclip_layout(fakes, tmp_path):
    from acetools.benchmark import Benchmark
    from acetools.world.clip import ClipWorld

    root = fake_openclip(tmp_path / "oc", ["mnist", "eurosat"], {"mnist": 10, "eurosat": 10}, data_root=fakes[1])
    w = ClipWorld("clip8", tasks=["mnist", "eurosat"], openclip_root=root, data_root=fakes[1], device="cpu",
                  root=tmp_path / "c")
    assert w.layout == "open_clip" and all(k.startswith("visual.") for k in w.base_state())
    assert any(k.endswith("attn.in_proj_weight") for k in w.matrix_keys())
    bench = Benchmark(w, n_val=4, n_test=4, n_proxy=4, n_gram=4, patience=1)
    summary = bench.summary(bench.run_all(["task_arithmetic", "tsv_m", "esm", "regmean"], progress=False))
    assert summary["test_acc"].between(0, 100).all()
    assert summary.set_index("method").loc["experts (individual)", "test_acc"] > 50
    assert w.records()[0]["path"].endswith("nonlinear_zeroshot.pt")


def test_openclip_pickled_module_is_refused(tmp_path):
    from acetools.world.clip.models import UnsafeCheckpoint, load_openclip_state

    p = tmp_path / "nonlinear_finetuned.pt"
    torch.save(torch.nn.Linear(2, 2), p)  # a pickled module, as the original task_vectors code wrote
    with pytest.raises(UnsafeCheckpoint, match="pickled module.*weights_only=False"):
        load_openclip_state(p)


# --------------------------------------------------------------------------- registry and command line

def test_registry():
    from acetools.world import WORLDS, get_world, world_suites

    assert list(WORLDS) == ["vision", "text", "clip-vit-b32"]
    assert WORLDS["text"].target == "acetools.world.text.world:TextWorld"
    assert world_suites("text") == ["text8", "text12", "fixture"]  # text12: text8 and four more tasks
    assert world_suites("clip-vit-b32") == ["clip8", "clip14", "clip20"]
    assert WORLDS["clip-vit-b32"].load().__name__ == "ClipWorld"
    with pytest.raises(ValueError, match="unknown world 'nope'"):
        get_world("nope")
    with pytest.raises(ValueError, match="unknown suite 'tasks8' for world 'clip-vit-b32'"):
        get_world("clip-vit-b32", "tasks8")
    with pytest.raises(ValueError, match="seed 0"):
        get_world("clip-vit-b32", "clip8", 1)


def test_the_issue_command_line(fakes, tmp_path, capsys):
    """``python3 -m acetools bench --world clip-vit-b32 --suite clip8 --models-root M --data-root D
    --n-val 4 --n-test 8 --methods task_arithmetic tsv_m ace --out OUT`` on a fresh folder of fakes."""
    from acetools.cli import main

    models, data = fakes
    out = tmp_path / "OUT"
    env = {"ACETOOLS_CACHE": str(tmp_path / "cache")}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        rc = main(["bench", "--world", "clip-vit-b32", "--suite", "clip8", "--models-root", str(models),
                   "--data-root", str(data), "--n-val", "4", "--n-test", "8", "--methods", "task_arithmetic",
                   "tsv_m", "ace", "--out", str(out), "--device", "cpu"])
        assert rc == 0, capsys.readouterr().err
        stem = "clip8_clip-vit-b32_seed0"
        for suffix in ("_summary.csv", "_per_task.csv", ".json", "_norms.csv", "_cosine.csv"):
            assert (out / f"{stem}{suffix}").is_file(), suffix
        assert (out / "clip8_clip-vit-b32_seeds.csv").is_file()
        summary = pd.read_csv(out / f"{stem}_summary.csv")
        assert {"task_arithmetic", "tsv_m", "ace"} <= set(summary["method"])
        per_task = pd.read_csv(out / f"{stem}_per_task.csv")
        assert set(per_task["task"]) == set(CLIP8)
        from acetools_course.paper_tables import beside_papers  # the course sets the papers' numbers beside

        paper = beside_papers(summary, 8, base_label="base (zero-shot heads)").set_index("method")
        assert paper.loc["tsv_m", "paper_acc"] == 85.9 and paper.loc["experts (individual)", "paper_acc"] == 92.8

        # notebook 04 reads these files for world="clip-vit-b32" beside the papers' ViT-B/32 columns
        from acetools_course import lesson04_benchmark as lesson
        from acetools_course import lesson_worlds as course

        opts = course.world_options("clip-vit-b32", str(models), str(data))
        bd = lesson.load_benchmark(quick=False, suites=["tasks8"], size="small", suite="tasks8", seed=0,
                                   results_dir=out, figures_dir=tmp_path / "fig", speed_dir=tmp_path / "none",
                                   wudi_dir=tmp_path / "none", world_options=opts)
        assert bd.suites == ["clip8"] and bd.size == "clip-vit-b32" and bd.n_tasks["clip8"] == 8
        assert bd.paper_cols["spec", "clip8"]["tsv_m"] == 85.9 and "esm" not in {t for t, _ in bd.paper_cols}

        rc = main(["bench", "--world", "clip-vit-b32", "--suite", "clip8", "--models-root", str(models),
                   "--data-root", str(data), "--n-val", "2", "--n-test", "2", "--methods", "task_arithmetic",
                   "--tasks", "mnist", "eurosat", "--out", str(out), "--device", "cpu", "--quiet"])
        assert rc == 0
        sub = pd.read_csv(out / "clip8-mnist-eurosat_clip-vit-b32_seed0_per_task.csv")
        assert set(sub["task"]) == {"mnist", "eurosat"}
    finally:
        for k, v in old.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)


def test_course_world_builds_the_clip_world(fakes, tmp_path):
    from acetools.world.clip import ClipWorld
    from acetools_course import lesson_worlds as course

    assert course.world_options() == {} and course.clip_suite("tasks20") == "clip20"
    with pytest.raises(ValueError, match="no CLIP ViT-B/32 counterpart"):
        course.clip_suite("tiny")
    w = course.world("tasks8", quick=True, root=tmp_path, device="cpu",
                     **course.world_options("clip-vit-b32", str(fakes[0]), str(fakes[1])))
    assert isinstance(w, ClipWorld) and w.suite == "clip8" and (w.n_test, w.n_val) == (60, 40)
    assert "papers' own world" in course.describe(w, True)
    x = w.split("mnist", "val").x
    assert x.dtype == np.uint8 and x.shape[1:] == (3, 32, 32)
    want = torch.as_tensor(np.array(x))[torch.randperm(len(x), generator=torch.Generator().manual_seed(3))[:1]]
    assert torch.equal(w.proxy_inputs("mnist", 1, seed=3), want)  # the lesson's draw from split("val")
    from acetools.benchmark import Benchmark

    b = Benchmark(w)  # what notebook 03's direct ESM merges add: the layout and ESM's targets
    assert b.layout_kwargs() == {"layout": "hf_clip"} and len(b.esm_targets()) == len(w.matrix_keys())
    small = torch.zeros(2, 3, 8, 8, dtype=torch.uint8)  # other sizes are resized to the model's (notebook 03's pool)
    got = w.layer_inputs(w.base_state(), small, w.matrix_keys()[:1])
    assert next(iter(got.values())).shape[0] == 2 * (1 + (32 // 8) ** 2)


@pytest.mark.parametrize("argv, needle", [
    (["--world", "clip-vit-b32", "--suite", "tasks8"], "not a suite of --world clip-vit-b32"),
    (["--suite", "clip8"], "not a suite of --world vision"),
    (["--models-root", "."], "--models-root needs --world clip-vit-b32"),
    (["--world", "clip-vit-b32", "--seeds", "1"], "one fine-tuning run"),
    (["--world", "clip-vit-b32", "--size", "tiny"], "--size is an option of the vision mini-world"),
    (["--world", "clip-vit-b32", "--tasks", "mnist", "cifar10"], "cifar10"),
    (["--world", "nope"], "invalid choice"),
])
def test_bench_world_errors_are_one_line(argv, needle, capsys, tmp_path):
    from acetools.cli import main

    extra = ["--data-root", str(tmp_path)] if "--tasks" in argv else []
    rc = main(["bench", *argv, *extra])
    err = capsys.readouterr().err
    assert rc == 2 and needle in err and err.count("\n") == 1, err


def test_bench_missing_model_is_one_cli_line(fakes, tmp_path, capsys):
    from acetools.cli import main

    empty = tmp_path / "M"
    empty.mkdir()
    rc = main(["bench", "--world", "clip-vit-b32", "--models-root", str(empty), "--data-root", str(fakes[1]),
               "--methods", "task_arithmetic", "--device", "cpu", "--quiet"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and BASE_ID in err and "hf download" in err


# --------------------------------------------------------------------------- on a GPU (skipped without CUDA)

@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("method", ["ace", "esm", "tsv_m", "iso_c", "iso_cts"])
def test_merges_take_cuda_tensors(method):
    import acetools
    from tests.conftest import make_world

    if method == "esm":
        from tests.test_esm import world as esm_world

        base, experts, acts = esm_world(dtype=torch.float32)
        kw = {"activations": acts}
    else:
        base, experts = make_world(n_tasks=3, seed=3)[:2]
        kw = {}
    cpu = acetools.merge(method, base, experts, **kw)
    gb = {k: v.cuda() for k, v in base.items()}
    ge = [{k: v.cuda() for k, v in e.items()} for e in experts]
    gkw = {"activations": {k: [a.cuda() for a in v] for k, v in acts.items()}} if kw else {}
    gpu = acetools.merge(method, gb, ge, **gkw)
    for k in base:
        assert gpu[k].device.type == "cuda", k
        d = (cpu[k] - base[k]).double()
        assert (gpu[k].cpu().double() - cpu[k].double()).norm() <= 1e-4 * d.norm() + 1e-6, k


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_clip_world_on_cuda(fakes, tmp_path):
    from acetools.benchmark import Benchmark
    from acetools.world.clip import ClipWorld

    w = ClipWorld("clip8", tasks=["mnist", "eurosat"], models_root=fakes[0], data_root=fakes[1], device="auto",
                  root=tmp_path / "c", n_val=4, n_test=4)
    assert w.device.type == "cuda" and w.base_state()["vision_model.post_layernorm.weight"].is_cuda
    bench = Benchmark(w, n_val=4, n_test=4, n_proxy=4, n_gram=4, patience=1)
    runs = bench.run_all(["task_arithmetic", "tsv_m", "iso_cts", "ace", "esm", "regmean"], progress=False)
    summary = bench.summary(runs)
    assert summary["test_acc"].between(0, 100).all()
    paths = bench.save(runs, tmp_path / "out", "cuda")  # the regime tables from CUDA states
    assert all(p.is_file() for p in paths.values())
