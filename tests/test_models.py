"""acetools.world.vision.models: open_clip encoders with open_clip's names, heads, pre-processing, ViT-B-32."""

from __future__ import annotations

import open_clip
import pytest
import torch
import torch.nn.functional as F

from acetools.world.vision import models
from acetools.world.vision.finetune import num_threads
from acetools.world.vision.models import (
    IMAGE_MEAN,
    IMAGE_STD,
    ClassificationHead,
    Classifier,
    build_clip,
    build_encoder,
    encode,
    prototype_head,
)


def _count(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    with num_threads(1):  # robust on a busy 2-core machine
        yield


def _vit_params(width, layers, patch, image, embed, mlp_ratio=4):
    """Brute-force parameter count of an open_clip VisionTransformer (token pooling)."""
    tokens = (image // patch) ** 2 + 1
    block = 2 * 2 * width + (3 * width * width + 3 * width) + (width * width + width)
    block += (mlp_ratio * width * width + mlp_ratio * width) + (mlp_ratio * width * width + width)
    return 3 * width * patch * patch + width + tokens * width + 2 * width + layers * block + 2 * width + width * embed


def test_micro_keys_carry_open_clip_names_with_visual_prefix():
    enc = build_encoder("micro", seed=0)
    keys = list(enc.state_dict())
    assert all(k.startswith("visual.") for k in keys)
    for k in [
        "visual.conv1.weight",
        "visual.class_embedding",
        "visual.positional_embedding",
        "visual.transformer.resblocks.0.attn.in_proj_weight",
        "visual.transformer.resblocks.1.attn.out_proj.weight",
        "visual.transformer.resblocks.1.mlp.c_fc.weight",
        "visual.transformer.resblocks.1.mlp.c_proj.weight",
        "visual.ln_post.weight",
        "visual.proj",
    ]:
        assert k in keys, k
    assert not any("mean" in k or "std" in k for k in keys)  # pre-processing buffers are not state
    sd = enc.state_dict()
    assert sd["visual.transformer.resblocks.0.attn.in_proj_weight"].shape == (96, 32)  # 3w x w, d_out x d_in
    assert sd["visual.proj"].shape == (32, 32)


@pytest.mark.parametrize("size", ["micro", "tiny", "small"])
def test_parameter_counts_match_the_configs(size):
    cfg = models.SIZES[size]
    v = cfg["vision_cfg"]
    enc = build_encoder(size, seed=0)
    assert _count(enc) == _vit_params(v["width"], v["layers"], v["patch_size"], v["image_size"],
                                                cfg["embed_dim"])
    assert enc.output_dim == cfg["embed_dim"]
    heads = v["width"] // v["head_width"]
    assert enc.visual.transformer.resblocks[0].attn.num_heads == heads


def test_sizes_are_registered_in_open_clip_and_build_the_same_tower():
    models.register_model_configs()
    assert {"acetools-micro", "acetools-tiny", "acetools-small"} <= set(open_clip.list_models())
    clip = open_clip.create_model("acetools-micro")
    ours = build_encoder("micro")
    theirs = {k: v.shape for k, v in clip.state_dict().items() if k.startswith("visual.")}
    assert theirs == {k: v.shape for k, v in ours.state_dict().items()}
    assert type(ours.visual) is open_clip.transformer.VisionTransformer


def test_seeded_builds_are_identical_and_seeds_differ():
    a, b, c = build_encoder("micro", seed=3), build_encoder("micro", seed=3), build_encoder("micro", seed=4)
    assert all(torch.equal(a.state_dict()[k], b.state_dict()[k]) for k in a.state_dict())
    assert not torch.equal(a.state_dict()["visual.proj"], c.state_dict()["visual.proj"])


def test_preprocess_uint8_float_and_resize():
    enc = build_encoder("micro", seed=0).eval()
    x = torch.randint(0, 256, (4, 3, 32, 32), dtype=torch.uint8)
    pre = enc.preprocess(x)
    mean = torch.tensor(IMAGE_MEAN).view(1, 3, 1, 1)
    std = torch.tensor(IMAGE_STD).view(1, 3, 1, 1)
    torch.testing.assert_close(pre, (x.float() / 255 - mean) / std)
    with torch.no_grad():
        torch.testing.assert_close(enc(x), enc(x.float() / 255))
        assert enc(torch.randint(0, 256, (2, 3, 48, 48), dtype=torch.uint8)).shape == (2, 32)  # resized
    with pytest.raises(ValueError):
        enc(torch.zeros(2, 1, 32, 32, dtype=torch.uint8))


def test_prototype_head_is_normalised_class_means():
    torch.manual_seed(0)
    enc = build_encoder("micro", seed=0)
    x = torch.randint(0, 256, (30, 3, 32, 32), dtype=torch.uint8)
    y = torch.arange(30) % 3
    head = prototype_head(enc, x, y, 3, logit_scale=30.0)
    with torch.no_grad():
        f = F.normalize(enc.eval()(x), dim=-1)
    for c in range(3):
        want = F.normalize(f[y == c].mean(0), dim=0) * 30.0
        torch.testing.assert_close(head.weight[c], want, rtol=1e-5, atol=1e-5)
    assert not head.weight.requires_grad
    assert list(head.state_dict()) == ["weight"]
    # logits = scale * cosine(feature, prototype)
    logits = head(enc(x[:5]))
    torch.testing.assert_close(logits, f[:5] @ head.weight.t(), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(head.weight.norm(dim=1), torch.full((3,), 30.0))


def test_prototype_head_rejects_empty_classes_and_bad_labels():
    enc = build_encoder("micro", seed=0)
    x = torch.zeros(4, 3, 32, 32, dtype=torch.uint8)
    with pytest.raises(ValueError, match="without images"):
        prototype_head(enc, x, torch.tensor([0, 0, 1, 1]), 3)
    with pytest.raises(ValueError, match="labels"):
        prototype_head(enc, x, torch.tensor([0, 0, 1, 5]), 3)


def test_classifier_and_encode_batching():
    enc = build_encoder("micro", seed=0)
    head = ClassificationHead(torch.randn(5, 32))
    clf = Classifier(enc, head).eval()
    x = torch.randint(0, 256, (7, 3, 32, 32), dtype=torch.uint8)
    with torch.no_grad():
        full = enc(x)
    torch.testing.assert_close(encode(enc, x, batch_size=3), full)
    assert clf(x).shape == (7, 5)


def test_a_tiny_clip_image_side_is_an_encoder():
    clip = build_clip("micro", pretrained=None)  # the registered micro config, offline
    enc = models.encoder_from_clip(clip)
    assert enc.visual is clip.visual and enc.image_size == 32
    assert enc(torch.zeros(2, 3, 32, 32, dtype=torch.uint8)).shape == (2, 32)


def test_build_clip_from_a_local_file(tmp_path):
    from safetensors.torch import save_file

    torch.manual_seed(0)
    src = build_clip("micro", pretrained=None)
    path = tmp_path / "micro_clip.safetensors"
    save_file({k: v.contiguous() for k, v in src.state_dict().items()}, str(path))
    torch.manual_seed(1)
    loaded = build_clip("micro", pretrained=str(path))
    for k, v in src.state_dict().items():
        assert torch.equal(v, loaded.state_dict()[k]), k


@pytest.mark.slow
def test_vit_b32_code_path_without_weights():
    enc = build_encoder("ViT-B-32", pretrained=None, seed=0)
    assert enc.image_size == 224
    assert 87_000_000 < _count(enc) < 88_500_000
    sd = enc.state_dict()
    assert sd["visual.transformer.resblocks.11.attn.in_proj_weight"].shape == (2304, 768)
    assert sd["visual.proj"].shape == (768, 512)
    with torch.no_grad():
        assert enc.eval()(torch.zeros(1, 3, 32, 32, dtype=torch.uint8)).shape == (1, 512)  # resized to 224


def test_vit_b32_pretrained_is_gated_offline():
    import open_clip as oc

    tag = oc.get_pretrained_cfg("ViT-B-32", "openai")
    if models._cached_checkpoint(tag, None) is not None:
        pytest.skip("OpenAI ViT-B-32 weights are cached on this machine")
    with pytest.raises(RuntimeError, match="does not download"):
        build_encoder("ViT-B-32", pretrained="openai")
    with pytest.raises(ValueError, match="no published weights"):
        build_encoder("tiny", pretrained="openai")
    with pytest.raises(ValueError, match="unknown model size"):
        models.model_config("giant-nonexistent")
