"""The mini-world's tasks: an offline registry of 32×32 RGB image-classification tasks.

Twenty tasks built on this machine from Fashion-MNIST, Animal-MNIST, scikit-learn's digits,
glyphs in matplotlib's fonts and procedural generators — some of them labelling the same
inputs in conflicting ways — plus the papers' torchvision datasets as online suites, a
pretraining pool disjoint from every task's val and test data, and tiny fixtures.

>>> from acetools.world.vision.data import SUITES, load_split
>>> d = load_split("tiny_shapes", "train", n=30)
>>> d.x.shape, d.x.dtype, d.y.dtype
(torch.Size([30, 3, 32, 32]), torch.uint8, torch.int64)

``TASKS`` holds the offline tasks; ``get_task``/``load_split`` also accept the online
(``ONLINE_TASKS``) and fixture (``FIXTURE_TASKS``) names. See ``registry.py`` for the
suites' design, ``pool.py`` for the pool, ``online.py`` for the torchvision path and
``benchmarks/calibrate_tasks.py`` for the proxy checks that every task is learnable but not trivial.
"""

from __future__ import annotations

from ._core import SPLITS, DataSourceError, PretrainData, TaskData, TaskInfo, data_root, row_hashes
from .fixtures import FIXTURE_SUITES, FIXTURE_TASKS, tiny_task
from .loading import all_task_names, build_task, fingerprint, get_task, load_split, prepare
from .online import ONLINE_SUITES, ONLINE_TASKS
from .pool import POOL_SOURCES, pretraining_pool
from .preview import contact_sheet, save_contact_sheet
from .registry import OFFLINE_SUITES, TASKS, VERSION

SUITES: dict[str, list[str]] = {**OFFLINE_SUITES, **ONLINE_SUITES, **FIXTURE_SUITES}

__all__ = [
    "TASKS", "SUITES", "ONLINE_TASKS", "FIXTURE_TASKS", "SPLITS", "VERSION", "POOL_SOURCES",
    "TaskInfo", "TaskData", "PretrainData", "DataSourceError",
    "get_task", "load_split", "prepare", "build_task", "fingerprint", "all_task_names", "pretraining_pool", "tiny_task",
    "data_root", "row_hashes", "contact_sheet", "save_contact_sheet",
]
