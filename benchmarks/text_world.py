"""Build the text world's experts and benchmark every merge method on them (issue 19).

    python3 benchmarks/text_world.py build --suite text8 --seeds 0 1 2      # experts, resumable
    python3 benchmarks/text_world.py build --suite text8 --heads trained --seeds 0 1 2   # the GLUE protocol
    python3 benchmarks/text_world.py bench --suite text8 --seeds 0          # every method + variants
    python3 benchmarks/text_world.py card --suite text8 --seeds 0           # its regime card
    python3 benchmarks/text_world.py tables --suite text8                  # the README's tables
    python3 benchmarks/text_world.py bench --suite fixture --profile quick  # the fixture world
    python3 benchmarks/text_world.py bench --suite text12 --methods task_arithmetic tsv_m --variants "ace (eps 2e-4)"
    python3 benchmarks/text_world.py bench --suite text8 --seeds 0 --add --variants "cart (block matrices)"

``build`` builds (or loads) each expert, one cache entry per expert, so a killed run resumes
with the next expert; it saves the build's throughput (training sequences per second per
task, evaluation sequences per second) to ``benchmarks/results/text_world/build_<suite>_seed<k>.json``.
``bench`` runs the harness (coefficients on validation, test at the chosen value) and writes
``<suite>_<size>_seed<k>_{summary,per_task,norms,cosine}.csv`` and ``.json`` to
``figures/benchmark/`` (``--out``), as ``acetools bench`` does for the vision world. ``card``
writes the regime card (:func:`acetools.regime.regime_card`) to ``figures/regime/<suite>_seed<k>/``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import time
from pathlib import Path

from acetools.benchmark import Search, picked_rows
from acetools.merging.esm import ROBERTA, ROBERTA_ALPHA_GRID
from acetools.search import PATIENCE
from acetools.world.base import cache_dir

ROOT = Path(__file__).resolve().parents[1]

#: ACE's scale candidates here: (0, 5] in steps of 0.1 (the vision row's 0.1-2.0 grid, ACE_SCALED, ends where
#: a vision seed already chose 2.0; the grid search stops PATIENCE points after its best).
ACE_SCALE_GRID = tuple(round(0.1 * i, 1) for i in range(1, 51))
#: The text world's labelled variant rows (docs/text-world.md §Benchmark): ACE at the
#: official code's eps 1e-2 (the plain "ace" row), at the paper's RoBERTa eps 2e-4 and at
#: 1e-5, the gate off, issue 23's relative ridge and scale-free gamma, and with its scale chosen
#: on validation as every rival's coefficient is; ESM as its RoBERTa code configures it; CART on
#: every block matrix; WUDI at its default step size (the plain row) and at larger ones (the
#: course picks the one with the best validation score among the three).
TEXT_VARIANTS = {
    "ace (scale searched)": {"method": "ace", "search": Search("scaling", "grid", ACE_SCALE_GRID)},
    # the plain "esm" row runs the ViT code's configuration; this one the RoBERTa code's
    "esm (roberta)": {"method": "esm", "search": Search("alpha", "grid", ROBERTA_ALPHA_GRID), **ROBERTA},
    "ace (eps 2e-4)": {"method": "ace", "search": None, "eps": 2e-4},
    "ace (eps 1e-5)": {"method": "ace", "search": None, "eps": 1e-5},
    "ace (gate off)": {"method": "ace", "search": None, "gate": "off"},
    "ace (eps 2e-4, gate off)": {"method": "ace", "search": None, "eps": 2e-4, "gate": "off"},
    # issue 23's two options that are not the paper's: a ridge in units of each task's mean
    # eigenvalue, and a scale-free gamma (at the RoBERTa ridge, to compare with its row)
    "ace (eps 1e-2 relative)": {"method": "ace", "search": None, "eps": 1e-2, "eps_mode": "relative"},
    "ace (eps 2e-4, gamma cv)": {"method": "ace", "search": None, "eps": 2e-4, "gamma_mode": "cv"},
    # CART's official name rule (attn/mlp) misses BERT's block weights, so its plain row is weight
    # averaging; every block matrix takes its low-rank path here
    "cart (block matrices)": {"method": "cart", "targets": "blocks"},
    "wudi (lr 1e-4)": {"method": "wudi", "search": None, "lr": 1e-4},
    "wudi (lr 1e-3)": {"method": "wudi", "search": None, "lr": 1e-3},
}


def _world(args, seed):
    from acetools.world.text.finetune import PROTOCOLS
    from acetools.world.text.world import TextWorld

    return TextWorld(args.suite, seed=seed, profile=args.profile, threads=args.threads, device=args.device,
                     finetune=PROTOCOLS[args.heads])


def _tag(args) -> str:
    from acetools.world.text.finetune import protocol_tag

    return protocol_tag(args.suite, args.heads)


def build(args) -> None:
    out = Path(args.results)
    out.mkdir(parents=True, exist_ok=True)
    if args.executor != "serial":  # every expert of every seed a job (acetools/executor.py), then read back below
        from acetools.executor import as_executor
        from acetools.world.text.world import build_experts

        build_experts([_world(args, seed) for seed in args.seeds],
                      executor=as_executor(args.executor, address=args.address, workers=args.workers))
    for seed in args.seeds:
        w = _world(args, seed)
        t0 = time.perf_counter()
        rows = []
        for task in w.tasks:
            t1 = time.perf_counter()
            w.expert_state(task)
            side = w._sides[task]
            m = side.get("metrics", {})
            rows.append({"task": task, "built": task in w.built, "seconds": round(time.perf_counter() - t1, 1),
                         "train_seconds": m.get("seconds"), "train_seq_per_s": m.get("train_seq_per_s"),
                         "steps": m.get("steps"), "val_acc": m.get("val_acc")})
            print(json.dumps(rows[-1]), flush=True)
        # evaluation throughput: each expert on its test split
        t2 = time.perf_counter()
        n_eval, acc = 0, {}
        for task in w.tasks:
            acc[task] = w.evaluate(w.expert_state(task), task, "test")
            n_eval += len(w.split(task, "test"))
        eval_s = time.perf_counter() - t2
        rec = {"suite": args.suite, "heads": args.heads, "seed": seed, "profile": args.profile, "threads": args.threads,
               "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"), "load_avg_1min": os.getloadavg()[0],
               "experts": rows, "built_now": w.built, "seconds_total": round(time.perf_counter() - t0, 1),
               "build_seconds_recorded": round(sum(r["train_seconds"] or 0 for r in rows), 1),
               "expert_test_acc": acc, "eval_seq_per_s": round(n_eval / eval_s, 1), "config": w.config.to_dict()}
        rec["peak_rss_mib"] = _peak_rss_mib()
        path = out / f"build_{_tag(args)}_seed{seed}.json"
        path.write_text(json.dumps(rec, indent=1))
        print(f"seed {seed}: {len(w.built)} built, experts' mean test acc "
              f"{100 * sum(acc.values()) / len(acc):.1f} %, eval {rec['eval_seq_per_s']} seq/s -> {path}", flush=True)


def _peak_rss_mib() -> float:
    """This process's peak resident memory so far (MiB; Linux reports ru_maxrss in KiB)."""
    import resource

    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def _variants(args) -> dict | None:
    """The variant rows to run: all of :data:`TEXT_VARIANTS`, the ones ``--variants`` names, or none."""
    if args.no_variants:
        return None
    if args.variants is None:
        return TEXT_VARIANTS
    unknown = [v for v in args.variants if v not in TEXT_VARIANTS]
    if unknown:
        raise SystemExit(f"unknown variant {unknown[0]!r}; variants: {list(TEXT_VARIANTS)}")
    return {v: TEXT_VARIANTS[v] for v in args.variants}


def _add_rows(args, b, stem: str) -> list:
    """``--add``: run only ``--methods`` and ``--variants`` and put their rows into the committed
    ``<stem>`` tables (summary, per-task, JSON), replacing rows of the same name; every other row,
    and the norms and cosine tables, stay as they are."""
    import pandas as pd
    replace_rows = _script(Path(__file__).with_name("merge_rows.py")).replace_rows  # the script beside this one

    from acetools.utils import atomic_write

    out = Path(args.out)
    paths = {k: out / f"{stem}{suffix}" for k, suffix in (("summary", "_summary.csv"), ("per_task", "_per_task.csv"),
                                                          ("json", ".json"))}
    missing = [str(p) for p in paths.values() if not p.is_file()]
    if missing:
        raise SystemExit(f"--add needs the committed tables; missing: {missing[0]} (run the full bench first)")
    committed = json.loads(paths["json"].read_text())
    ours = {"patience": b.patience, "n_val": b.n_val, "n_test": b.n_test}
    differ = {k: (committed.get(k), v) for k, v in ours.items() if committed.get(k) != v}
    if differ:
        raise SystemExit(f"--add would mix protocols in {paths['json']}: " + ", ".join(
            f"{k} is {a} there and {b_} here" for k, (a, b_) in differ.items()) + "; pass the committed values")
    jobs = [(m, {"method": m}) for m in args.methods or []] + list((_variants(args) or {}).items())
    if not jobs:
        raise SystemExit("--add needs --methods or --variants")
    runs = []
    for label, spec in jobs:
        spec = dict(spec)
        m = spec.pop("method")
        runs.append(b.run(m, label=None if label == m else label, **spec))
    for key, new in (("summary", b.summary(runs)), ("per_task", b.per_task(runs))):
        old = pd.read_csv(paths[key])
        rows, _ = replace_rows(old.to_dict(orient="records"), new.to_dict(orient="records"))
        with atomic_write(paths[key], "w") as fh:
            pd.DataFrame(rows, columns=old.columns).to_csv(fh, index=False)
    committed["runs"], _ = replace_rows(committed["runs"], b.record(runs)["runs"])
    with atomic_write(paths["json"], "w") as fh:
        json.dump(committed, fh, indent=1, default=str)
    print(b.summary(runs)[["method", "test_acc", "test_normalized", "coef"]].to_string())
    print("-> added to", paths["summary"], flush=True)
    return runs


def _row_store(args, w, stem: str) -> Path:
    """Where ``bench`` keeps each finished row until the seed's tables are saved, so a stopped run resumes
    with its next row (``Benchmark.run_all``'s ``store``). The folder is named after the protocol and the
    code (the git commit, plus the diff of acetools/ and this script from it), so a resumed run never
    mixes rows of two code versions."""
    import hashlib
    import subprocess

    def git(*a: str) -> str:
        return subprocess.run(["git", *a], cwd=ROOT, capture_output=True, text=True).stdout

    code = git("rev-parse", "HEAD").strip() + git("diff", "HEAD", "--", "acetools", "benchmarks/text_world.py")
    key = json.dumps([stem, args.n_val, args.n_test, args.n_gram, args.patience, w.config.to_dict(), code])
    return cache_dir("bench_rows") / f"{stem}-{hashlib.sha256(key.encode()).hexdigest()[:12]}"


def bench(args) -> None:
    from acetools.benchmark import Benchmark

    for seed in args.seeds:
        t0 = time.perf_counter()
        w = _world(args, seed)
        b = Benchmark(w, n_val=args.n_val, n_test=args.n_test, n_proxy=32, n_gram=args.n_gram,
                      patience=args.patience, threads=args.threads)
        stem = f"{_tag(args)}_{w.size}_seed{seed}"
        if args.add:
            runs = _add_rows(args, b, stem)
            continue
        methods = args.methods or None
        store = _row_store(args, w, stem)
        resumed = len(list(store.glob("*.pkl"))) if store.is_dir() else 0  # rows kept by a run that was stopped
        runs = b.run_all(methods, extra=_variants(args), progress=True, store=store)
        runs += picked_rows(runs)
        paths = b.save(runs, args.out, stem)
        # the run's cost: wall time, peak memory, and each method's merge and input time
        rec = {"suite": args.suite, "heads": args.heads, "seed": seed, "threads": args.threads,
               "load_avg_1min": os.getloadavg()[0], "rows_resumed": resumed,
               "wall_seconds": round(time.perf_counter() - t0, 1), "peak_rss_mib": _peak_rss_mib(),
               "methods": {r.name: {"merge_seconds": round(r.merge_seconds, 2),
                                    "inputs_seconds": round(r.inputs_seconds, 2)} for r in runs}}
        Path(args.results).mkdir(parents=True, exist_ok=True)
        (Path(args.results) / f"bench_{stem}.json").write_text(json.dumps(rec, indent=1))
        print(b.summary(runs)[["method", "test_acc", "test_normalized", "coef", "merge_seconds"]].to_string())
        print("->", paths["summary"], flush=True)
        shutil.rmtree(store, ignore_errors=True)  # every row is in the saved tables now


def card(args) -> None:
    from acetools.regime import regime_card

    for seed in args.seeds:
        w = _world(args, seed)
        c = regime_card(w, n_val=args.n_val, n_test=args.n_test, patience=args.patience, threads=args.threads,
                        progress=True)
        folder = Path(args.cards) / f"{_tag(args)}_seed{seed}"
        c.save(folder)
        print(c.to_frame()[["metric", "value", "clip"]].head(14).to_string())
        print("->", folder, flush=True)


def _script(path: Path):
    """The script at ``path`` as a module (a script of this repository, not an installed package), however this
    one is run or imported."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def tables(args) -> str:
    """The README's text-world tables (markdown), from the committed files only."""
    text_world_tables = _script(ROOT / "scripts" / "readme_tables.py").text_world_tables

    text = text_world_tables(args.out, args.results, args.suite)
    print(text)
    return text


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("what", choices=["build", "bench", "card", "tables"])
    p.add_argument("--suite", default="text8")
    p.add_argument("--profile", default="full", choices=["full", "quick"])
    p.add_argument("--seeds", type=int, nargs="+", default=[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--device", default="cpu")
    p.add_argument("--heads", default="zeroshot", choices=["zeroshot", "trained"],
                   help="frozen zero-shot heads (the shipped world) or per-task heads trained with the experts")
    # the committed tables' protocol (issue 23): 100 validation and 300 test texts per task, the
    # course's one patience; 0 evaluates every split text, and patience 0 the whole grid
    p.add_argument("--executor", default="serial", choices=["serial", "ray"],
                   help="build: where the experts (tasks x seeds) are built (docs/performance.md §Executors)")
    p.add_argument("--address", default=None, help="with --executor ray: a running cluster (default: a local one)")
    p.add_argument("--workers", type=int, default=None, help="with --executor ray: jobs run at once")
    p.add_argument("--n-val", type=int, default=100)
    p.add_argument("--n-test", type=int, default=300)
    p.add_argument("--n-gram", type=int, default=256)
    p.add_argument("--patience", type=int, default=PATIENCE)
    p.add_argument("--methods", nargs="*", default=None)
    p.add_argument("--no-variants", action="store_true")
    p.add_argument("--variants", nargs="*", default=None, help="only these variant rows (default: all)")
    p.add_argument("--add", action="store_true",
                   help="run only --methods / --variants and add their rows to the existing tables in --out")
    p.add_argument("--out", default=str(ROOT / "figures" / "benchmark"))
    p.add_argument("--results", default=str(ROOT / "benchmarks" / "results" / "text_world"))
    p.add_argument("--cards", default=str(ROOT / "figures" / "regime"))
    args = p.parse_args(argv)
    args.n_val, args.n_test, args.patience = args.n_val or None, args.n_test or None, args.patience or None
    {"build": build, "bench": bench, "card": card, "tables": tables}[args.what](args)


if __name__ == "__main__":
    main()
