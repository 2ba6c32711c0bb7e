"""Write acetools/world/clip/tasks.json from an installed fusion-bench (developer tool, offline).

FusionBench (MIT licence, https://github.com/tanganke/fusion_bench) keeps, per task, the Hugging
Face dataset id and splits (``fusion_bench_config/dataset/image_classification/{train,val,test}``)
and the class names and zero-shot templates (``fusion_bench.tasks.clip_classification``). This
script copies them into the package as data, so the CLIP world needs no fusion-bench at run
time; ``tests/test_clip_world.py::test_task_table_matches_fusionbench`` (oracle) checks the copy.

    python3 scripts/clip_tasks_from_fusionbench.py            # rewrite the JSON
    python3 scripts/clip_tasks_from_fusionbench.py --check    # exit 1 if it differs
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "acetools" / "world" / "clip" / "tasks.json"

#: The TALL-20 order (FusionBench's ``test/TALL20.yaml``): 8 tasks, +6 for 14, +6 for 20.
TASKS20 = ["sun397", "stanford-cars", "resisc45", "eurosat", "svhn", "gtsrb", "mnist", "dtd",
           "oxford_flowers102", "pcam", "fer2013", "oxford-iiit-pet", "stl10", "cifar100",
           "cifar10", "food101", "fashion_mnist", "emnist_letters", "kmnist", "rendered-sst2"]
_SENTINEL = "\x00CLASS\x00"


def _source(cfg: dict) -> dict:
    """A FusionBench dataset config as ``{path, name, split, columns}``."""
    target = cfg["_target_"]
    if target.endswith("train_validation_split"):
        raise ValueError("nested split")
    if target == "fusion_bench.dataset.fer2013.load_fer2013":  # load_dataset + renamed columns
        return {"path": "clip-benchmark/wds_fer2013", "name": None, "split": cfg["split"],
                "columns": {"jpg": "image", "cls": "label"}}
    if target != "datasets.load_dataset":
        raise ValueError(f"unsupported loader {target}")
    args = cfg.get("_args_") or []
    path = cfg.get("path", args[0] if args else None)
    name = cfg.get("name", args[1] if len(args) > 1 else None)
    return {"path": path, "name": name, "split": cfg["split"], "columns": {}}


def build() -> dict:
    import fusion_bench_config
    import yaml
    from fusion_bench.tasks.clip_classification import CLIPTemplateFactory

    root = Path(list(fusion_bench_config.__path__)[0]) / "dataset" / "image_classification"
    tasks = {}
    for t in TASKS20:
        test = _source(yaml.safe_load((root / "test" / f"{t}.yaml").read_text())[t])
        train = _source(yaml.safe_load((root / "train" / f"{t}.yaml").read_text())[t])
        val_file = root / "val" / f"{t}.yaml"
        if val_file.is_file():
            v = yaml.safe_load(val_file.read_text())[t]
            val = {"from": "train", "fraction": v["validation_fraction"], "seed": v["random_seed"]}
        else:  # FusionBench has no val config beyond the 8 tasks: the same rule, ours
            val = {"from": "train", "fraction": 0.1, "seed": 0, "note": "not in FusionBench; its 8-task rule"}
        classnames, templates = CLIPTemplateFactory.get_classnames_and_templates(t)
        tasks[t] = {
            "dataset": test["path"], "config": test["name"], "columns": test["columns"],
            "test_split": test["split"], "train_split": train["split"], "val": val,
            "expert": f"tanganke/clip-vit-base-patch32_{t}",
            "classnames": [str(c) for c in classnames],
            "templates": [f(_SENTINEL).replace(_SENTINEL, "{c}") for f in templates],
        }
    import fusion_bench

    version = getattr(fusion_bench, "__version__", None)
    if version is None:
        from importlib.metadata import version as _v

        version = _v("fusion-bench")
    return {"source": f"fusion-bench {version} (fusion_bench_config/dataset/image_classification, "
                      "fusion_bench.tasks.clip_classification; MIT licence)",
            "base": "openai/clip-vit-base-patch32",
            "suites": {"clip8": TASKS20[:8], "clip14": TASKS20[:14], "clip20": TASKS20},
            "tasks": tasks}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true")
    a = ap.parse_args(argv)
    text = json.dumps(build(), indent=1, ensure_ascii=False) + "\n"
    if a.check:
        same = OUT.is_file() and OUT.read_text() == text
        print("up to date" if same else f"{OUT} differs from fusion-bench")
        return 0 if same else 1
    OUT.write_text(text)
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
