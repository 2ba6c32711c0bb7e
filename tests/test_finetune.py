"""acetools.world.vision.finetune: pretraining, expert fine-tuning with a frozen head, MTL, evaluation."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from acetools.utils import make_generator
from acetools.world.vision.finetune import (
    FinetuneConfig,
    augment_batch,
    evaluate,
    finetune_expert,
    num_threads,
    pretrain_base,
    train_multitask,
    warmup_cosine,
)
from acetools.world.vision.models import Classifier, build_encoder, prototype_head

THREADS = 1  # fixed: determinism needs a fixed thread count; 1 is also robust on a busy machine
FAST = dict(lr=3e-3, epochs=8, batch_size=32, threads=THREADS, progress=False)


def corner_task(n=300, seed=0, n_classes=3, name="corners", split="train"):
    """Class c: a bright 10x10 square near corner c of a noisy image (+-2 px jitter)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, 120, (n, 3, 32, 32), generator=g, dtype=torch.uint8)
    y = torch.arange(n) % n_classes
    corners = [(4, 4), (4, 22), (22, 4), (22, 22)]
    jit = torch.randint(-2, 3, (n, 2), generator=g)
    for i in range(n):
        oy, ox = corners[int(y[i])]
        oy, ox = oy + int(jit[i, 0]), ox + int(jit[i, 1])
        x[i, :, oy : oy + 10, ox : ox + 10] = 250
    return SimpleNamespace(x=x, y=y, name=name, split=split, class_names=[f"c{i}" for i in range(n_classes)])


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    with num_threads(THREADS):
        yield


@pytest.fixture(scope="module")
def setup(_one_thread):
    enc = build_encoder("micro", seed=0)
    train, test = corner_task(300, 0), corner_task(300, 1, split="test")
    head = prototype_head(enc, train.x, train.y, 3)
    return enc.state_dict(), head, train, test


def _equal(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_finetune_improves_accuracy_on_held_out_data(setup):
    base, head, train, test = setup
    before = evaluate(base, head, test, size="micro")
    state, recipe = finetune_expert(base, head, train, size="micro", seed=0, **FAST)
    after = evaluate(state, head, test, size="micro")
    assert before < 0.75  # random features + near-identical prototypes: the base cannot solve it
    assert after >= 0.9 and after > before + 0.2, (before, after)
    assert recipe["kind"] == "expert" and recipe["config"]["lr"] == 3e-3 and recipe["steps"] == 80
    assert recipe["final_train_acc"] > 0.8
    assert state.keys() == base.keys()


def test_head_stays_frozen_and_inputs_untouched(setup):
    base, head, train, _ = setup
    w = head.weight.detach().clone()
    base_copy = {k: v.clone() for k, v in base.items()}
    state, _ = finetune_expert(base, head, train, size="micro", seed=0, **(FAST | {"epochs": 1}))
    assert torch.equal(head.weight, w)  # bitwise
    assert not head.weight.requires_grad
    assert _equal(base, base_copy)
    assert not _equal(state, base)  # the encoder did move


def test_finetune_is_deterministic_given_the_seed(setup):
    base, head, train, _ = setup
    kw = FAST | {"epochs": 1, "augment": True, "hflip": True}
    a, _ = finetune_expert(base, head, train, size="micro", seed=5, **kw)
    b, _ = finetune_expert(base, head, train, size="micro", seed=5, **kw)
    c, _ = finetune_expert(base, head, train, size="micro", seed=6, **kw)
    assert _equal(a, b)
    assert not _equal(a, c)


def test_config_object_and_overrides(setup):
    base, head, train, _ = setup
    cfg = FinetuneConfig(lr=1e-4, epochs=1, batch_size=100, warmup_steps=0)
    _, recipe = finetune_expert(base, head, train, cfg, size="micro", weight_decay=0.0, threads=THREADS, progress=False)
    assert recipe["config"] == {**cfg.__dict__, "weight_decay": 0.0}
    assert recipe["steps"] == 3


def test_pretrain_base_masked_multi_head_and_deterministic():
    t = corner_task(200, 7, n_classes=4)
    colour = torch.arange(200) % 2
    pos = t.y.clone()
    pos[::2] = -1  # half the images have no position label
    nothing = torch.full((200,), -1)
    pool = SimpleNamespace(x=t.x, labels={"pos": pos, "colour": colour, "none": nothing},
                           head_classes={"pos": 4, "colour": 2, "none": 5})
    kw = dict(steps=6, batch_size=64, lr=2e-3, seed=1, threads=THREADS, progress=False)
    a, rec = pretrain_base(pool, "micro", **kw)
    b, _ = pretrain_base(pool, "micro", **kw)
    assert _equal(a, b)
    assert a.keys() == build_encoder("micro").state_dict().keys()  # pool heads are dropped
    assert rec["steps"] == 6 and rec["head_classes"] == {"pos": 4, "colour": 2, "none": 5}
    assert set(rec["final_train_acc"]) == {"pos", "colour"}  # the all -1 head never contributes
    c, _ = pretrain_base(pool, "micro", head_type="cosine", **kw)
    assert not _equal(a, c)
    bad = SimpleNamespace(x=t.x, labels={"pos": t.y}, head_classes={"pos": 2})
    with pytest.raises(ValueError, match="head_classes"):
        pretrain_base(bad, "micro", **kw)


def test_pretraining_lowers_the_loss():
    t = corner_task(256, 3, n_classes=4)
    pool = SimpleNamespace(x=t.x, labels={"pos": t.y}, head_classes={"pos": 4})
    _, short = pretrain_base(pool, "micro", steps=2, batch_size=64, lr=3e-3, seed=0, threads=THREADS, progress=False)
    _, long = pretrain_base(pool, "micro", epochs=15, batch_size=64, lr=3e-3, seed=0, threads=THREADS, progress=False)
    assert long["final_loss"] < 0.7 * short["final_loss"]


def test_train_multitask_mixed_batches_with_frozen_heads(setup):
    base, head, train, test = setup
    other = corner_task(300, 11, n_classes=3)
    other.y = 2 - other.y  # the same inputs labelled in reverse: a conflicting task
    other.name = "reversed"
    enc = build_encoder("micro")
    enc.load_state_dict(base)
    head2 = prototype_head(enc, other.x, other.y, 3)
    w1, w2 = head.weight.clone(), head2.weight.clone()
    state, recipe = train_multitask(base, {"a": head, "b": head2}, {"a": train, "b": other}, size="micro", seed=0,
                                    **(FAST | {"epochs": 2}))
    assert torch.equal(head.weight, w1) and torch.equal(head2.weight, w2)
    assert recipe["kind"] == "mtl" and recipe["n_images"] == 600 and recipe["steps"] == 2 * 19
    assert recipe["tasks"] == ["corners", "reversed"]
    with pytest.raises(ValueError, match="different tasks"):
        train_multitask(base, {"a": head}, {"b": train}, size="micro")


def test_evaluate_accepts_encoder_classifier_or_state(setup):
    base, head, _, test = setup
    enc = build_encoder("micro")
    enc.load_state_dict(base)
    with torch.no_grad():
        manual = (head(enc.eval()(test.x)).argmax(-1) == test.y).float().mean().item()
    assert evaluate(enc, head, test) == pytest.approx(manual)
    assert evaluate(Classifier(enc, head), None, test, batch_size=7) == pytest.approx(manual)
    assert evaluate(base, head, test, size="micro") == pytest.approx(manual)
    with pytest.raises(ValueError, match="size"):
        evaluate(base, head, test)


def test_warmup_cosine_schedule():
    f = warmup_cosine(100, 10)
    assert f(0) == pytest.approx(0.1) and f(9) == pytest.approx(1.0)
    assert f(10) == pytest.approx(1.0) and f(55) == pytest.approx(0.5) and f(100) == pytest.approx(0.0)
    g = warmup_cosine(100, 0.2)
    assert g(19) == pytest.approx(1.0) and g(0) == pytest.approx(0.05)
    assert warmup_cosine(10, 0)(0) == pytest.approx(1.0)


def test_augment_batch():
    x = torch.randint(0, 256, (8, 3, 32, 32), dtype=torch.uint8)
    assert torch.equal(augment_batch(x, make_generator(0), crop=True, pad=0), x)
    a = augment_batch(x, make_generator(1), crop=True, hflip=True)
    b = augment_batch(x, make_generator(1), crop=True, hflip=True)
    assert torch.equal(a, b) and a.shape == x.shape and a.dtype == torch.uint8
    flipped = augment_batch(x, make_generator(2), crop=False, hflip=True)
    for i in range(8):  # each image is either itself or its mirror
        assert torch.equal(flipped[i], x[i]) or torch.equal(flipped[i], x[i].flip(-1))
    shifted = augment_batch(x, make_generator(3), crop=True)
    assert ((shifted == 0).float().mean() > (x == 0).float().mean())  # zero padding entered


def test_num_threads_context_restores():
    old = torch.get_num_threads()
    with num_threads(1) as n:
        assert n == 1 and torch.get_num_threads() == 1
    assert torch.get_num_threads() == old


def test_pretraining_resumes_from_its_epoch_checkpoint(tmp_path, monkeypatch):
    """An interrupted run, called again with the same checkpoint file, ends with the
    weights of an uninterrupted run; the file is gone afterwards; a foreign file is refused."""
    import acetools.world.vision.finetune as ft

    t = corner_task(128, 4, n_classes=4)
    pool = SimpleNamespace(x=t.x, labels={"pos": t.y}, head_classes={"pos": 4})
    kw = dict(epochs=3, batch_size=32, lr=2e-3, seed=3, augment=True, threads=THREADS, progress=False)
    ref, ref_rec = pretrain_base(pool, "micro", **kw)
    ckpt = tmp_path / "base.resume.safetensors"
    save = ft._save_resume

    def interrupt(path, fp, step, *a):
        save(path, fp, step, *a)
        if step >= 8:  # after epoch 2 of 3 (4 steps per epoch)
            raise KeyboardInterrupt

    monkeypatch.setattr(ft, "_save_resume", interrupt)
    with pytest.raises(KeyboardInterrupt):
        pretrain_base(pool, "micro", checkpoint=ckpt, **kw)
    assert ckpt.is_file()
    from safetensors import safe_open

    with safe_open(str(ckpt), framework="pt") as f:  # a safetensors file with JSON metadata: no pickle
        assert "acetools.resume" in f.metadata() and any(k.startswith("optimizer/") for k in f.keys())
    monkeypatch.setattr(ft, "_save_resume", save)

    def no_pickle(*a, **k):
        raise AssertionError("the resume checkpoint must not be read with torch.load (a pickle)")

    monkeypatch.setattr(torch, "load", no_pickle)
    resumed, rec = pretrain_base(pool, "micro", checkpoint=ckpt, **kw)
    monkeypatch.undo()
    assert _equal(resumed, ref)
    assert rec["steps"] == ref_rec["steps"] == 12
    assert not ckpt.exists()
    # a checkpoint of another config is refused with a message naming the file
    monkeypatch.setattr(ft, "_save_resume", interrupt)
    with pytest.raises(KeyboardInterrupt):
        pretrain_base(pool, "micro", checkpoint=ckpt, **kw)
    monkeypatch.setattr(ft, "_save_resume", save)
    with pytest.raises(RuntimeError, match="resume.safetensors"):
        pretrain_base(pool, "micro", checkpoint=ckpt, **(kw | {"lr": 1e-3}))


def test_bf16_precision_trains_float32_weights_and_stays_out_of_default_keys(setup):
    from acetools.world.vision.finetune import PretrainConfig, key_config

    base, head, train, test = setup
    a, rec = finetune_expert(base, head, train, size="micro", seed=0, precision="bf16", **FAST)
    b, _ = finetune_expert(base, head, train, size="micro", seed=0, **FAST)
    assert all(v.dtype == torch.float32 for v in a.values())
    assert not _equal(a, b)  # bf16 autocast changes the arithmetic
    assert evaluate(a, head, test, size="micro") >= 0.9
    assert rec["config"]["precision"] == "bf16"
    assert "precision" not in key_config(FinetuneConfig()) and "precision" not in key_config(PretrainConfig())
    assert key_config(FinetuneConfig(precision="bf16"))["precision"] == "bf16"
    with pytest.raises(ValueError, match="precision"):
        finetune_expert(base, head, train, size="micro", seed=0, precision="fp16", **FAST)
