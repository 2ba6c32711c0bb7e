"""The text world's tasks: classes picked from a source (:mod:`acetools.world.text.sources`), balanced,
cut into fixed train / val / test splits that share no text; the tasks and suites are data, in ``tasks.json``
(docs/text-world.md §The tasks)."""

from __future__ import annotations

import hashlib
import heapq
import json
import random
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import chain
from pathlib import Path

from ...errors import InputError
from .sources import SOURCES, provenance

__all__ = ["TextTask", "TextData", "TASKS", "SUITES", "build_task", "suite_tasks"]


@dataclass(frozen=True)
class TextTask:
    """One classification task on real text."""

    name: str
    source: str
    classes: tuple[str, ...]
    n_train: int = 300  # texts per class
    n_val: int = 30
    n_test: int = 60
    #: the words the zero-shot heads embed per class (default: the class names)
    prompts: tuple[str, ...] = ()
    doc: str = ""

    def spec(self) -> dict:
        """What fixes the task's data (the cache key, together with the source's provenance)."""
        return {"name": self.name, "source": self.source, "classes": list(self.classes), "n_train": self.n_train,
                "n_val": self.n_val, "n_test": self.n_test, "split_seed": 0}

    @property
    def class_prompts(self) -> tuple[str, ...]:
        return self.prompts or tuple(c.split(".")[-1].replace("-", " ").replace("_", " ") for c in self.classes)


@dataclass
class TextData:
    """One split of a task: ``texts`` with integer ``y`` indexing ``classes``."""

    name: str
    split: str
    texts: list[str]
    y: list[int]
    classes: tuple[str, ...]
    hash: str = field(default="")

    def __len__(self) -> int:
        return len(self.y)


def _hash(texts: Sequence[str], y: Sequence[int]) -> str:
    return hashlib.sha256(json.dumps([list(texts), list(y)], ensure_ascii=False).encode()).hexdigest()


def build_task(task: TextTask) -> dict[str, TextData]:
    """Read ``task``'s source and cut its balanced train / val / test splits.

    Raises ValueError naming the class when a class has fewer texts than the splits need.
    """
    raw = SOURCES[task.source].read()
    missing = [c for c in task.classes if c not in raw]
    if missing:
        raise InputError(f"task {task.name!r}: source {task.source!r} has no class {missing[0]!r} "
                         f"(it has {sorted(raw)[:12]}...)")
    distinct = {c: set(raw[c]) for c in task.classes}
    n_classes = Counter(chain.from_iterable(distinct.values()))  # how many classes each text occurs under
    need = task.n_train + task.n_val + task.n_test
    splits: dict[str, tuple[list[str], list[int]]] = {s: ([], []) for s in ("train", "val", "test")}
    for i, c in enumerate(task.classes):
        texts = [t for t in distinct[c] if n_classes[t] == 1]
        if len(texts) < need:
            raise InputError(f"task {task.name!r}: class {c!r} has {len(texts)} distinct texts, "
                             f"{need} needed (n_train + n_val + n_test per class)")
        # the first `need` in the order of a hash of (task, text): a source that gains or loses a few
        # texts (a Debian point release) moves only those texts, not the whole class's split
        texts = heapq.nsmallest(need, texts, key=lambda t: hashlib.sha256(f"{task.name}\0{t}".encode()).digest())
        cuts = {"val": texts[: task.n_val], "test": texts[task.n_val: task.n_val + task.n_test],
                "train": texts[task.n_val + task.n_test: need]}
        for s, part in cuts.items():
            splits[s][0].extend(part)
            splits[s][1].extend([i] * len(part))
    out = {}
    for s, (texts, y) in splits.items():
        order = list(range(len(y)))
        random.Random(f"{task.name}:{s}").shuffle(order)
        texts, y = [texts[j] for j in order], [y[j] for j in order]
        out[s] = TextData(task.name, s, texts, y, task.classes, _hash(texts, y))
    return out


def task_provenance(task: TextTask) -> dict:
    return provenance(SOURCES[task.source])


def _task(t: dict) -> TextTask:
    """A task of ``tasks.json``; without ``classes``, every class of its source."""
    sizes = {k: t[k] for k in ("n_train", "n_val", "n_test") if k in t}
    return TextTask(t["name"], t["source"], tuple(t.get("classes") or SOURCES[t["source"]].classes), doc=t["doc"],
                    **sizes)


_RAW = json.loads(Path(__file__).with_name("tasks.json").read_text(encoding="utf-8"))
TASKS: dict[str, TextTask] = {t["name"]: _task(t) for t in _RAW["tasks"]}
#: text8: eight tasks of five sources (WordNet four times, at different cuts), each with 6-12 balanced classes;
#: text12: text8 and four more, so that growth with T can be measured.
SUITES: dict[str, tuple[str, ...]] = {k: tuple(v) for k, v in _RAW["suites"].items()}


def suite_tasks(suite: str) -> tuple[str, ...]:
    if suite not in SUITES:
        raise InputError(f"unknown text suite {suite!r}; valid: {sorted(SUITES)}")
    return SUITES[suite]
