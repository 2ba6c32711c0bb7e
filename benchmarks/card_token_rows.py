"""Add the centred, token-aware activation rows (issue 23) to committed regime cards that predate them.

    python3 benchmarks/card_token_rows.py first_world gentle gentle_fast     # figures/regime/<card>/

The rows (``act_overlap_centred``, ``act_topk_energy_centred``, ``act_mean_share``,
``act_pos_share``, ``act_cls_share``; :func:`acetools.regime.regime_card`) are measured at W0 on
``n_act`` training images per task, so they need the card's base and data only, not its experts.
A card is filled only when its base is the one this machine has (the same content hash as the
card's ``meta.recipe.base_sha256``) and its tasks are the suite's; otherwise the script says which
base it needs and leaves the card alone. As a check, the raw rows ``act_overlap`` and
``act_topk_energy`` (base-only too) are recomputed and must match the card's to 1e-4; the new rows
go in after them, every other row is unchanged, and ``meta.token_rows`` records how and when they
were added. Then run ``python3 benchmarks/recipe_study.py --summary``.
"""

from __future__ import annotations

import argparse
import math
import sys
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from acetools.benchmark import Benchmark  # noqa: E402
from acetools.regime import RegimeCard, _activation_rows, _token_activation_rows, _token_rows  # noqa: E402
from acetools.world.vision.zoo import Zoo  # noqa: E402

OUT = ROOT / "figures" / "regime"
#: The raw rows recomputed as a check, and the tolerance (absolute, in the rows' units).
CHECK = {"act_overlap": 1e-4, "act_topk_energy": 1e-2}


def token_rows(card: RegimeCard, *, n_act: int, threads: int | None) -> tuple[list[dict], dict]:
    """The new rows for ``card`` and the check of its raw rows (``{metric: (card, now)}``)."""
    m = card.meta
    zoo = Zoo(m["suite"], size=m["size"], seed=m.get("seed") or 0, mtl=False, threads=threads)
    if list(zoo.tasks) != list(m["tasks"]):
        raise SystemExit(f"the card's tasks {m['tasks']} are not {m['suite']}'s {list(zoo.tasks)}")
    want = (m.get("recipe") or {}).get("base_sha256")
    zoo.base_state()
    have = zoo.sidecar("base").get("content_sha256")
    if want != have:
        raise LookupError(f"needs the base {str(want)[:12]} (this machine's {m['size']} base is {str(have)[:12]})")
    bench = Benchmark(zoo, threads=threads)
    base, tasks = bench.base, list(zoo.tasks)
    no_update = [{k: torch.zeros(()) for k in bench.matrix_keys()} for _ in tasks]  # tau_in_act is not checked
    raw = _activation_rows(bench, base, no_update, tasks, n_images=n_act)
    check = {k: (card.value(k), raw[k]) for k in CHECK}
    bad = {k: v for k, v in check.items() if not abs(v[0] - v[1]) <= CHECK[k]}
    if bad:
        raise SystemExit(f"the raw rows do not reproduce on this machine: {bad}; not adding rows to this card")
    act = _token_activation_rows(bench, base, tasks, n_images=n_act)
    rows: list[dict] = []

    def row(metric, label, value, unit, how):
        rows.append({"metric": metric, "label": label, "value": float(value), "clip": math.nan, "clip_note": "",
                     "unit": unit, "how": how})

    _token_rows(row, act)
    return rows, check


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("cards", nargs="+", help="card folders under --out (e.g. gentle_fast)")
    ap.add_argument("--out", default=str(OUT))
    ap.add_argument("--n-act", type=int, default=128, help="training images per task (the card's default 128)")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    left = []
    for name in args.cards:
        folder = Path(args.out) / name
        card = RegimeCard.load(folder)
        names = {r["metric"] for r in card.rows}
        try:
            new, check = token_rows(card, n_act=args.n_act, threads=args.threads)
        except LookupError as err:
            print(f"{name}: left as it is: {err}")
            left.append(name)
            continue
        if names & {r["metric"] for r in new}:
            card.rows = [r for r in card.rows if r["metric"] not in {x["metric"] for x in new}]
        at = next(i for i, r in enumerate(card.rows) if r["metric"] == "act_topk_energy") + 1
        card.rows[at:at] = new
        card.meta["token_rows"] = {
            "added": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "command": f"python3 benchmarks/card_token_rows.py {name}", "n_act": args.n_act,
            "how": "measured at W0 on the card's base (same content hash) and data; the experts are not involved",
            "raw_rows_check": {k: {"card": a, "now": b} for k, (a, b) in check.items()},
        }
        card.save(folder)
        print(f"{name}: " + ", ".join(f"{r['metric']} {r['value']:.4g}" for r in new)
              + "; raw rows reproduce: " + ", ".join(f"{k} {a:.4g} vs {b:.4g}" for k, (a, b) in check.items()))
    return 1 if left and len(left) == len(args.cards) else 0


if __name__ == "__main__":
    sys.exit(main())
