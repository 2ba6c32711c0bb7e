"""The CLIP world's tasks as data: FusionBench's dataset ids, splits, class names and templates, in
``tasks.json``, a copy of fusion-bench 0.2.33's written by ``scripts/clip_tasks_from_fusionbench.py`` and
checked by ``tests/test_clip_world.py::test_task_table_matches_fusionbench`` (docs/clip-world.md §What is where).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

__all__ = ["ClipTask", "CLIP_TASKS", "CLIP_SUITES", "BASE_ID", "TASK_SOURCE", "clip_tasks"]

_FILE = Path(__file__).with_name("tasks.json")


@dataclass(frozen=True)
class ClipTask:
    """One task: Hugging Face dataset, splits, expert id, class names and templates."""

    name: str
    dataset: str  # Hugging Face dataset id (FusionBench's)
    config: str | None  # dataset config name (svhn: "cropped_digits")
    test_split: str
    train_split: str
    expert: str  # Hugging Face model id of the fine-tuned CLIPVisionModel
    classnames: tuple[str, ...]
    templates: tuple[str, ...]  # "{c}" stands for the class name
    columns: dict = field(default_factory=dict, hash=False)  # renames to "image" / "label"
    val_fraction: float = 0.1
    val_seed: int = 0

    def prompts(self, classnames: tuple[str, ...] | None = None) -> list[list[str]]:
        """Per class, its templates filled in."""
        return [[t.replace("{c}", c) for t in self.templates] for c in (classnames or self.classnames)]

    @property
    def n_classes(self) -> int:
        return len(self.classnames)


@lru_cache(maxsize=1)
def _raw() -> dict:
    return json.loads(_FILE.read_text(encoding="utf-8"))


def clip_tasks() -> dict[str, ClipTask]:
    """Every task of ``tasks.json`` by name (FusionBench's names: ``stanford-cars``, ``oxford-iiit-pet``, ...)."""
    out = {}
    for name, t in _raw()["tasks"].items():
        out[name] = ClipTask(name, t["dataset"], t["config"], t["test_split"], t["train_split"], t["expert"],
                             tuple(t["classnames"]), tuple(t["templates"]), dict(t["columns"]),
                             float(t["val"]["fraction"]), int(t["val"]["seed"]))
    return out


CLIP_TASKS: dict[str, ClipTask] = clip_tasks()
#: clip8 (task arithmetic's eight), clip14 and clip20 (the TALL-mask paper's), FusionBench's order.
CLIP_SUITES: dict[str, tuple[str, ...]] = {k: tuple(v) for k, v in _raw()["suites"].items()}
BASE_ID: str = _raw()["base"]
TASK_SOURCE: str = _raw()["source"]
