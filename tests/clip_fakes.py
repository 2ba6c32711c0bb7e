"""Tiny fakes of the CLIP world's inputs, written into temporary folders (no download).

- :func:`fake_models`: a tiny random ``CLIPModel`` as ``DIR/openai/clip-vit-base-patch32/`` and
  tiny ``CLIPVisionModel`` experts (the base's vision tower plus a random low-rank task
  vector per layer) as ``DIR/tanganke/clip-vit-base-patch32_<task>/``;
- :func:`fake_hf_cache`: the same base in the Hugging Face hub cache layout
  (``models--openai--clip-vit-base-patch32/snapshots/<rev>/`` and ``refs/main``);
- :func:`fake_images`: an ImageFolder ``DIR/<task>/<split>/<class name>/*.png`` whose classes
  differ by colour;
- :func:`fake_openclip`: the open_clip checkpoint layout (state dicts saved with ``torch.save``).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import torch

IMAGE_SIZE = 32


def tiny_config():
    from transformers import CLIPConfig

    text = dict(vocab_size=49408, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                max_position_embeddings=77, eos_token_id=2)  # eos 2: pool at argmax(input_ids), as openai's config
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                  image_size=IMAGE_SIZE, patch_size=8)
    return CLIPConfig(text_config=text, vision_config=vision, projection_dim=16)


def fake_models(root: Path, tasks, *, seed: int = 0, scale: float = 0.05) -> Path:
    from transformers import CLIPModel, CLIPVisionModel

    torch.manual_seed(seed)
    base = CLIPModel(tiny_config()).eval()
    with torch.no_grad():
        base.logit_scale.fill_(float(np.log(100.0)))  # as the trained CLIP's (exp = 100)
    base.save_pretrained(root / "openai" / "clip-vit-base-patch32")
    g = torch.Generator().manual_seed(seed + 1)
    for task in tasks:
        ex = CLIPVisionModel(base.config.vision_config)
        state = {k: v.clone() for k, v in base.state_dict().items() if k.startswith("vision_model.")}
        for k, v in state.items():
            if v.ndim == 2 and v.is_floating_point():
                u = torch.randn(v.shape[0], 2, generator=g)
                w = torch.randn(2, v.shape[1], generator=g)
                state[k] = v + scale * (u @ w) / 2
        own = set(ex.state_dict())  # transformers 5 names the tower's keys without "vision_model."
        ex.load_state_dict({(k if k in own else k[len("vision_model."):]): v for k, v in state.items()}, strict=True)
        ex.save_pretrained(root / "tanganke" / f"clip-vit-base-patch32_{task}")
    return root


def train_experts(models_root: Path, data_root: Path, tasks, *, steps: int = 200, lr: float = 1e-2,
                  seed: int = 0) -> None:
    """Replace each fake expert by the base's vision tower fine-tuned for ``steps`` Adam steps on its
    task's training images with the task's zero-shot head, until it gets them all right (so
    experts beat the base, as real ones do)."""
    from transformers import CLIPVisionModel

    from acetools.world.clip.data import normalize
    from acetools.world.clip.models import HFImageEncoder
    from acetools.world.clip.tasks import CLIP_SUITES
    from acetools.world.clip.world import ClipWorld

    suite = next(s for s, ts in CLIP_SUITES.items() if set(tasks) <= set(ts))
    w = ClipWorld(suite, tasks=list(tasks), models_root=models_root, data_root=data_root, device="cpu", cache=False)
    torch.manual_seed(seed)
    for t in tasks:
        enc = HFImageEncoder(w._base_hf())
        enc.vision_model.requires_grad_(True)
        _, idx = w.split_indices(t, "train")
        px, y, _ = w.pixels(t, "train", indices=idx)
        x, y = normalize(px, "cpu"), torch.as_tensor(y)
        W, scale, _ = w.head(t)
        opt = torch.optim.Adam(enc.vision_model.parameters(), lr=lr)
        for _ in range(steps):  # until every training image is right (at most ``steps``)
            logits = scale * torch.nn.functional.normalize(enc(x), dim=-1) @ W.t()
            if bool((logits.argmax(-1) == y).all()):
                break
            loss = torch.nn.functional.cross_entropy(logits, y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        ex = CLIPVisionModel(w._base_hf().config.vision_config)
        own = set(ex.state_dict())
        tuned = {k: v.detach() for k, v in enc.state_dict().items() if k.startswith("vision_model.")}
        ex.load_state_dict({(k if k in own else k[len("vision_model."):]): v for k, v in tuned.items()}, strict=True)
        ex.save_pretrained(models_root / "tanganke" / f"clip-vit-base-patch32_{t}")


def fake_hf_cache(cache: Path, models_root: Path, repo_id: str = "openai/clip-vit-base-patch32") -> Path:
    """Copy ``models_root/<repo_id>`` into a hub cache at ``cache`` (returns the snapshot folder)."""
    rev = "0123456789abcdef0123456789abcdef01234567"
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    snap = repo / "snapshots" / rev
    shutil.copytree(models_root / repo_id, snap)
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / "main").write_text(rev)
    return snap


def fake_images(root: Path, task: str, classes, *, n_train: int = 12, n_test: int = 8, n_val: int = 0,
                seed: int = 0) -> Path:
    from PIL import Image

    rng = np.random.default_rng(seed)
    for split, n in (("train", n_train), ("test", n_test), ("val", n_val)):
        if n == 0:
            continue
        for ci, c in enumerate(classes):
            d = root / task / split / c
            d.mkdir(parents=True, exist_ok=True)
            colour = np.array([(97 * ci) % 256, (53 * ci + 80) % 256, (171 * ci + 40) % 256])
            for i in range(n):
                img = np.clip(colour + rng.normal(0, 30, (40, 48, 3)), 0, 255).astype(np.uint8)
                Image.fromarray(img).save(d / f"{i}.png")
    return root


def fake_openclip(root: Path, tasks, classes: dict[str, int], *, data_root: Path, seed: int = 0,
                  embed: int = 16) -> Path:
    """``root/ViT-B-32/...`` with tiny open_clip ViT state dicts (``model.visual.*``, QuickGELU) and
    prototype heads: row c of task t's head is 100 x the expert's mean unit feature of t's class-c
    training images in ``data_root`` (zero for the classes without a folder)."""
    from acetools.world.clip.data import image_folder, preprocess
    from acetools.world.clip.models import OPENCLIP_NAMES
    from acetools.world.clip.tasks import CLIP_TASKS
    from acetools.world.vision.models import ImageEncoder, vision_tower

    torch.manual_seed(seed)
    cfg = {"embed_dim": embed, "quick_gelu": True,
           "vision_cfg": {"width": 64, "layers": 2, "patch_size": 8, "image_size": IMAGE_SIZE, "head_width": 64}}
    enc = ImageEncoder(vision_tower(cfg), IMAGE_SIZE).eval()
    base = {f"model.{k}": v.detach().clone() for k, v in enc.state_dict().items()}
    d = root / "ViT-B-32"
    (d / "MNISTVal").mkdir(parents=True, exist_ok=True)
    torch.save({**base, "model.logit_scale": torch.tensor(4.6)}, d / "MNISTVal" / "nonlinear_zeroshot.pt")
    g = torch.Generator().manual_seed(seed + 1)
    for t in tasks:
        name = OPENCLIP_NAMES[t]
        st = {k: (v + 0.01 * torch.randn(v.shape, generator=g) if v.ndim == 2 else v.clone()) for k, v in base.items()}
        (d / f"{name}Val").mkdir(parents=True, exist_ok=True)
        torch.save(st, d / f"{name}Val" / "nonlinear_finetuned.pt")
        enc.load_state_dict({k[len("model."):]: v for k, v in st.items()})
        src = image_folder(data_root, CLIP_TASKS[t], "train")
        x = torch.as_tensor(np.stack([preprocess(src.image(i), IMAGE_SIZE) for i in range(len(src))]))
        with torch.no_grad():
            f = torch.nn.functional.normalize(enc(x), dim=-1)
        w = torch.zeros(classes[t], embed)
        for c in set(src.labels.tolist()):
            w[c] = 100 * torch.nn.functional.normalize(f[torch.as_tensor(src.labels == c)].mean(0), dim=-1)
        torch.save({"weight": w, "bias": torch.zeros(classes[t])}, d / f"head_{name}Val.pt")
    return root
