"""Where the CLIP world's models and datasets come from: ``--models-root`` / ``--data-root`` folders,
else the Hugging Face caches (offline when pre-filled), else, online only, a download (docs/clip-world.md
§What is where). A resource missing offline raises :class:`MissingResource` naming how to get it;
:func:`fetch` fills the caches on a machine with internet.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path

__all__ = ["MissingResource", "hub_offline", "model_folder", "load_hf_dataset", "fetch", "MODEL_FILES"]

log = logging.getLogger(__name__)

#: What a model folder needs: the config and the weights (tokenizer files when present).
MODEL_FILES = ["config.json", "*.safetensors", "*.safetensors.index.json", "pytorch_model.bin",
               "tokenizer*.json", "vocab.json", "merges.txt", "special_tokens_map.json", "preprocessor_config.json"]


class MissingResource(FileNotFoundError):
    """A model or dataset that is neither in the given folder nor in the cache, while offline."""

    def __str__(self) -> str:  # one line, whatever the caller passed
        return " ".join(str(a) for a in self.args).replace("\n", " ")


def hub_offline() -> bool:
    """Whether the Hugging Face hub may not be reached (``HF_HUB_OFFLINE`` / ``HF_DATASETS_OFFLINE``)."""
    on = {"1", "true", "yes", "on"}
    return (os.environ.get("HF_HUB_OFFLINE", "").lower() in on
            or os.environ.get("HF_DATASETS_OFFLINE", "").lower() in on)


def _how_model(repo_id: str) -> str:
    return (f"on a machine with internet run `hf download {repo_id}` (fills ~/.cache/huggingface/hub; copy it "
            f"here or set HF_HOME), or pass --models-root DIR with DIR/{repo_id}/config.json and its weights; "
            "see docs/clip-world.md")


def model_folder(repo_id: str, models_root: str | os.PathLike | None = None) -> Path:
    """The local folder of model ``repo_id`` (see the module docstring for the order)."""
    if models_root is not None:
        p = Path(models_root).expanduser() / repo_id
        if (p / "config.json").is_file():
            return p
        raise MissingResource(f"model {repo_id} not found: no {p / 'config.json'} under --models-root "
                              f"{models_root}; {_how_model(repo_id)}")
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        path = Path(snapshot_download(repo_id, allow_patterns=MODEL_FILES, local_files_only=True))
        if (path / "config.json").is_file():
            return path
    except (LocalEntryNotFoundError, FileNotFoundError, OSError, ValueError) as err:
        log.debug("%s is not in the Hugging Face cache: %s", repo_id, err)
    if hub_offline():
        raise MissingResource(f"model {repo_id} is not in the Hugging Face cache and the hub is offline "
                              f"(HF_HUB_OFFLINE=1); {_how_model(repo_id)}")
    try:  # pragma: no cover - needs the network
        return Path(snapshot_download(repo_id, allow_patterns=MODEL_FILES))
    except Exception as err:  # pragma: no cover - needs the network
        raise MissingResource(f"model {repo_id} could not be downloaded ({type(err).__name__}: "
                              f"{str(err).splitlines()[0] if str(err) else ''}); {_how_model(repo_id)}") from None


def _how_dataset(task) -> str:
    args = repr(task.dataset) + (f", {task.config!r}" if task.config else "")
    return (f"on a machine with internet run `python3 -c \"import datasets; datasets.load_dataset({args})\"` "
            f"(fills ~/.cache/huggingface), or pass --data-root DIR with DIR/{task.name}/<split>/<class name>/*.png; "
            "see docs/clip-world.md")


def load_hf_dataset(task, split: str):
    """``task``'s split through ``datasets`` (its cache offline), columns renamed to ``image`` / ``label``."""
    try:
        import datasets
    except ImportError:  # pragma: no cover - datasets is installed with transformers' extras
        raise MissingResource(f"dataset {task.dataset}: the `datasets` package is not installed "
                              f"(pip install datasets), or pass --data-root DIR") from None
    try:
        ds = datasets.load_dataset(task.dataset, task.config, split=split)
    except Exception as err:
        where = "is not in the datasets cache and the hub is offline" if hub_offline() else \
            f"could not be loaded ({type(err).__name__})"
        raise MissingResource(f"dataset {task.dataset} (split {split}) {where}; {_how_dataset(task)}") from None
    if task.columns:
        drop = [c for c in ds.column_names if c not in task.columns and c not in ("image", "label")]
        ds = ds.remove_columns(drop).rename_columns(task.columns)
    return ds


def fetch(suite: str = "clip8", tasks: Sequence[str] | None = None, *,
          progress: bool | None = None) -> list[str]:  # pragma: no cover - needs the network
    """On a machine with internet: download the base, the experts of ``suite`` (or ``tasks``) and
    their datasets' train and test splits into the Hugging Face caches. Returns what was fetched."""
    from huggingface_hub import snapshot_download

    from ...utils import progress as bar
    from .tasks import BASE_ID, CLIP_SUITES, CLIP_TASKS

    names = list(tasks or CLIP_SUITES[suite])
    done = [str(snapshot_download(BASE_ID, allow_patterns=MODEL_FILES))]
    for t in bar(names, desc="experts and datasets", enabled=progress):
        task = CLIP_TASKS[t]
        done.append(str(snapshot_download(task.expert, allow_patterns=MODEL_FILES)))
        for split in (task.train_split, task.test_split):
            load_hf_dataset(task, split)
            done.append(f"{task.dataset}:{split}")
    return done
