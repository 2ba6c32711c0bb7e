"""The mini-world's tasks: an offline registry of 32×32 RGB image-classification tasks, the papers'
torchvision datasets as online suites, a pretraining pool and tiny fixtures (docs/vision-world.md §The tasks).

>>> from acetools.world.vision.data import SUITES, load_split
>>> d = load_split("tiny_shapes", "train", n=30)
>>> d.x.shape, d.x.dtype, d.y.dtype
(torch.Size([30, 3, 32, 32]), torch.uint8, torch.int64)
"""

from __future__ import annotations

from ._core import SPLITS, DataSourceError, PretrainData, TaskData, TaskInfo, data_root, row_hashes
from .fixtures import FIXTURE_SUITES, FIXTURE_TASKS
from .loading import all_task_names, build_task, get_task, load_split
from .online import ONLINE_SUITES, ONLINE_TASKS
from .pool import POOL_SOURCES, pretraining_pool
from .registry import OFFLINE_SUITES, TASKS, VERSION

SUITES: dict[str, list[str]] = {**OFFLINE_SUITES, **ONLINE_SUITES, **FIXTURE_SUITES}

__all__ = [
    "TASKS", "SUITES", "ONLINE_TASKS", "FIXTURE_TASKS", "SPLITS", "VERSION", "POOL_SOURCES",
    "TaskInfo", "TaskData", "PretrainData", "DataSourceError",
    "get_task", "load_split", "build_task", "all_task_names", "pretraining_pool",
    "data_root", "row_hashes",
]
