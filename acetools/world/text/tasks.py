"""The text world's tasks: classes picked from a source (:mod:`acetools.world.text.sources`), balanced,
cut into fixed train / val / test splits that share no text (docs/text-world.md §The tasks)."""

from __future__ import annotations

import hashlib
import heapq
import json
import random
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import chain

from ...errors import InputError
from .sources import (
    ANIMAL_CLASSES,
    ARTIFACT_CLASSES,
    CODE_PACKAGES,
    FOOD_CLASSES,
    PERSON_CLASSES,
    PLANT_CLASSES,
    SOURCES,
    provenance,
)

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


_FORTUNE = ("art", "computers", "definitions", "men-women", "politics", "science", "songs-poems", "work", "zippy")
_DEB = ("admin", "fonts", "games", "graphics", "math", "net", "science", "sound", "text", "web")
_NOUN = ("noun.act", "noun.animal", "noun.artifact", "noun.attribute", "noun.body", "noun.cognition",
         "noun.communication", "noun.food", "noun.location", "noun.person", "noun.plant", "noun.substance")
_VERB = ("verb.body", "verb.change", "verb.cognition", "verb.communication", "verb.contact", "verb.creation",
         "verb.motion", "verb.perception", "verb.possession", "verb.social")
_DOMAIN = ("law", "military", "computer science", "chemistry", "music", "biology", "physics", "botany")
_EMOJI = ("Smileys & Emotion", "Animals & Nature", "Food & Drink", "Travel & Places", "Objects", "Symbols", "Flags")
_SYMBOLS = ("Mathematical Operators", "Miscellaneous Technical", "Miscellaneous Symbols", "Dingbats",
            "Miscellaneous Symbols and Pictographs", "Supplemental Symbols and Pictographs")

TASKS: dict[str, TextTask] = {t.name: t for t in (
    TextTask("debian_section", "debian_description", _DEB, doc="package short description -> Debian section"),
    TextTask("wordnet_noun", "wordnet_noun", _NOUN, doc="noun gloss -> WordNet lexicographer file"),
    TextTask("wordnet_verb", "wordnet_verb", _VERB, n_train=150, doc="verb gloss -> WordNet lexicographer file"),
    TextTask("fortune_topic", "fortunes", _FORTUNE, doc="fortune quote -> fortune file"),
    TextTask("word_language", "words", ("english", "german", "french", "spanish", "italian", "portuguese", "dutch"),
             doc="word -> language of the word list"),
    TextTask("docstring_library", "docstrings", ("numpy", "scipy", "pandas", "torch", "matplotlib", "sklearn",
                                                  "sympy", "networkx"), n_train=170,
             doc="first docstring paragraph -> Python library"),
    TextTask("wordnet_domain", "wordnet_domain", _DOMAIN, n_train=90, n_val=20, n_test=40,
             doc="gloss -> WordNet topic domain"),
    TextTask("emoji_group", "emoji", _EMOJI, n_train=80, n_val=20, n_test=30, doc="emoji name -> emoji group"),
    TextTask("unicode_symbol", "unicode_block", _SYMBOLS, n_train=110, n_val=20, n_test=60,
             doc="symbol name -> Unicode block"),
    TextTask("code_language", "code", tuple(CODE_PACKAGES), doc="line of source code -> programming language"),
    TextTask("wordnet_animal", "wordnet_animal", ANIMAL_CLASSES, n_train=200,
             doc="animal gloss -> the animal class above it in WordNet (mammal, bird, ...)"),
    TextTask("wordnet_plant", "wordnet_plant", PLANT_CLASSES, n_train=100, n_val=20, n_test=40,
             doc="plant gloss -> the plant kind above it in WordNet (tree, herb, ...)"),
    TextTask("wordnet_artifact", "wordnet_artifact", ARTIFACT_CLASSES, n_train=130, n_val=20, n_test=40,
             doc="artifact gloss -> the artifact kind above it in WordNet (tool, vehicle, ...)"),
    TextTask("wordnet_person", "wordnet_person", PERSON_CLASSES, n_train=120, n_val=20, n_test=40,
             doc="person gloss -> the kind of person above it in WordNet (worker, writer, ...)"),
    TextTask("wordnet_food", "wordnet_food", FOOD_CLASSES, n_train=70, n_val=14, n_test=20,
             doc="food gloss -> the kind of food above it in WordNet (dish, meat, ...)"),
)}

#: text8: eight tasks of five sources (WordNet four times, at different cuts), each with 6-12 balanced classes.
SUITES: dict[str, tuple[str, ...]] = {
    "text8": ("debian_section", "wordnet_noun", "wordnet_domain", "emoji_group", "code_language",
              "wordnet_artifact", "fortune_topic", "wordnet_person"),
    # text12: text8 and four more, so that growth with T can be measured
    "text12": ("debian_section", "wordnet_noun", "wordnet_domain", "emoji_group", "code_language",
               "wordnet_artifact", "fortune_topic", "wordnet_person", "wordnet_animal", "wordnet_plant",
               "docstring_library", "wordnet_food"),
}


def suite_tasks(suite: str) -> tuple[str, ...]:
    if suite not in SUITES:
        raise InputError(f"unknown text suite {suite!r}; valid: {sorted(SUITES)}")
    return SUITES[suite]
