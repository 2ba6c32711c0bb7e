"""The results tables of the docs, generated from the committed result files (one script, no
hand-typed numbers).

    python3 scripts/readme_tables.py           # rewrite the generated blocks of the pages in PAGES
    python3 scripts/readme_tables.py --check   # exit 1 if a page differs from the committed files

Each block sits between ``<!-- generated: NAME -->`` and ``<!-- /generated: NAME -->`` in one of
the pages of :data:`PAGES` (today every block is in docs/results.md; README.md links to it);
everything between the markers is rewritten, everything else is left alone:

* ``benchmark`` — absolute / normalized test accuracy, mean ± sd over expert seeds, from
  ``figures/benchmark/*_small_seed*_summary.csv``;
* ``room`` — TSV-M − task arithmetic per suite (the room of docs/course.md §Scaling rule), from the
  same files;
* ``targets`` — the regime issue's targets, from ``figures/06_mergeable_world/targets.csv``;
* ``claims`` — the five verdicts counted per paper, from ``figures/*/claims.json``;
* ``mini_world_prose`` and ``text_world_prose`` — the prose that states the worlds' numbers, from the same
  result files, the WUDI step-size study and the claim records it quotes;
* ``text_world`` — the text world's benchmark beside RoBERTa-GLUE and its targets, from
  ``figures/benchmark/text8_minilm_seed*_summary.csv``, ``benchmarks/results/text_world/build_*.json``
  and ACE's γ per layer type from ``figures/regime/text8_seed0/card_per_layer.csv``.

Every generator's block appears exactly once over the pages. The script also rewrites each
lesson's reading time where README.md's course map and docs/teaching.md state it
(:func:`reading_times`, from ``scripts/build_site.py``'s ``reading_minutes``). ``tests/test_readme_tables.py`` fails
when a block drifts from the files.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from pathlib import Path

import pandas as pd

from acetools import results
from acetools_course.lesson07_language import ROBERTA_GLUE, benchmark_tables, growth_table
from acetools_course.verdicts import VERDICTS

REPO = Path(__file__).resolve().parents[1]

BLOCK = re.compile(r"(<!-- generated: (?P<name>[a-z_]+) -->\n)(?P<body>.*?)(<!-- /generated: (?P=name) -->)", re.S)


def _summary(repo: Path) -> pd.DataFrame:
    runs = results.find_results(repo / "figures" / "benchmark", None, "small")
    if not runs:
        raise FileNotFoundError(f"no *_small_seed*_summary.csv in {repo / 'figures' / 'benchmark'}")
    return results.load_summary(runs)


def benchmark_table(repo: Path = REPO) -> str:
    agg = results.aggregate(_summary(repo))
    ab, nm = results.table1(agg, "test_acc"), results.table1(agg, "test_normalized")
    out = pd.DataFrame({c: [f"{a} / {n}" for a, n in zip(ab[c], nm[c])] for c in ab.columns}, index=ab.index)
    out.index.name = "method"
    return results.to_markdown(out, index=True)


def room_text(repo: Path = REPO) -> str:
    agg = results.aggregate(_summary(repo))
    t = results.wide(agg, "test_normalized")
    n = agg.drop_duplicates("suite").set_index("suite")["n_tasks"]
    room = (t.loc["tsv_m"] - t.loc["task_arithmetic"]).dropna()
    vals = " / ".join(f"{v:.1f}" for v in room)
    ts = " / ".join(str(int(n[s])) for s in room.index)
    return (f"The room, TSV-M − task arithmetic: **{vals}** normalized points at {ts} tasks (mean over seeds; "
            "CLIP ViT-B/32: 16.3 / 16.3 / 18.2).\n")


def targets_table(repo: Path = REPO) -> str:
    t = pd.read_csv(repo / "figures" / "06_mergeable_world" / "targets.csv")
    t["passed"] = t["passed"].map({True: "pass", False: "miss"}).fillna("no data")
    t["measured"] = [f"{v:.2f}" for v in t["measured"]]
    t["suite"] = t["suite"].fillna("—")
    return results.to_markdown(t[["target", "suite", "measured", "threshold", "passed"]].rename(
        columns={"passed": "result"}))


def claims_table(repo: Path = REPO) -> str:
    rows = []
    for p in sorted((repo / "figures").glob("*/claims.json")):
        for e in json.loads(p.read_text()).values():
            rows.append({"paper": e["paper"], "verdict": e["verdict"], "world": e["world"]["name"]})
    df = pd.DataFrame(rows)
    counts = pd.crosstab(df["paper"], df["verdict"]).reindex(columns=list(VERDICTS), fill_value=0)
    counts.loc["all"] = counts.sum()
    counts.columns.name = None
    worlds = ", ".join(sorted(set(df["world"])))
    return (results.to_markdown(counts.reset_index().rename(columns={"paper": f"paper ({worlds})"}), floatfmt=".0f"))


#: "Structured" methods for the room target: every merge that is not weight averaging or task arithmetic.
UNSTRUCTURED = ("weight_averaging", "task_arithmetic")


def gamma_card_table(card_dir: str | Path, tau: float = 0.3) -> pd.DataFrame:
    """ACE's γ per layer type from a committed regime card (``card_per_layer.csv``): the median
    γ, the share of matrices above τ_γ, and the mean and sd of the log energies that γ is made
    of (γ = Var / Mean² of the log energies, so small updates give a small γ)."""
    per_layer = pd.read_csv(Path(card_dir) / "card_per_layer.csv")
    out = per_layer[["layer_type", "n_matrices", "gamma_median", "gated_fraction", "log_energy_mean",
                     "log_energy_sd"]].copy()
    out["layer_type"] = out["layer_type"].str.replace(".weight", "", regex=False)
    out["gated_fraction"] = 100 * out["gated_fraction"]  # the card stores a fraction per layer type
    return out.rename(columns={"gamma_median": "γ median", "gated_fraction": f"share above τ_γ = {tau:g} (%)",
                               "log_energy_mean": "mean log energy", "log_energy_sd": "sd of log energies"})


def text_world_tables(results_dir: str | Path, builds_dir: str | Path, suite: str = "text8",
                      card_dir: str | Path | None = None) -> str:
    """docs/results.md's text-world tables (markdown) from the committed files only: the benchmark
    (mean ± sd over seeds, beside RoBERTa-GLUE), the targets of the text-world issue and, with
    ``card_dir`` (a committed regime card), ACE's γ per layer type."""
    per_seed, mean = benchmark_tables(results_dir, suite)
    m = mean.set_index("method")
    n = int(m["n_seeds"].max())

    def cell(method: str) -> str:
        r = m.loc[method]
        sd = lambda c: "" if math.isnan(r[f"{c}_sd"]) else f" ± {r[f'{c}_sd']:.1f}"  # noqa: E731
        return f"{r['test_acc']:.1f}{sd('test_acc')} / {r['test_normalized']:.1f}{sd('test_normalized')}"

    out = [f"| method | {suite}: absolute / normalized ({n} seed{'s' if n > 1 else ''}) | RoBERTa-base GLUE "
           "(normalized) |", "|---|---|---|"]
    for method in m.index:
        anchor = ROBERTA_GLUE.get("pretrained" if str(method).startswith("base (") else method)
        kind = "variant: " if m.loc[method, "kind"] == "variant" else ""
        out.append(f"| {kind}{method} | {cell(method)} | {'' if anchor is None else f'{anchor:.1f}'} |")
    base = next(x for x in m.index if str(x).startswith("base ("))
    norm = m["test_normalized"]
    structured = norm[[x for x in norm.index if m.loc[x, "kind"] != "reference" and
                       str(x).split(" (")[0] not in UNSTRUCTURED]]
    best = structured.idxmax()
    builds = [json.loads(p.read_text()) for p in sorted(Path(builds_dir).glob(f"build_{suite}_seed*.json"))]
    build_min = [b["build_seconds_recorded"] / 60 for b in builds]
    rows = [("experts, absolute (%)", m.loc["experts (individual)", "test_acc"], "≥ 85", lambda v: v >= 85),
            ("base (zero-shot heads) below the experts (normalized points)", 100 - norm[base], "≥ 25",
             lambda v: v >= 25),
            ("TSV-M − task arithmetic (normalized points)", norm["tsv_m"] - norm["task_arithmetic"], "≥ 10",
             lambda v: v >= 10),
            (f"best structured ({best}) − task arithmetic", norm[best] - norm["task_arithmetic"], "≥ 15",
             lambda v: v >= 15),
            ("eight experts built (min, seed 0 as recorded)", build_min[0] if build_min else math.nan, "≤ 40",
             lambda v: v <= 40)]
    out += ["", "| target | measured | threshold | met |", "|---|---|---|---|"]
    out += [f"| {name} | {v:.1f} | {th} | {'yes' if ok(v) else 'no'} |" for name, v, th, ok in rows]
    growth = growth_table(results_dir, [suite, "text12"] if suite == "text8" else [suite])
    if growth.shape[1] > 2:
        out += ["", "| lead over task arithmetic (normalized points) | " + " | ".join(growth.columns[1:]) + " |",
                "|---|" + "---|" * (growth.shape[1] - 1)]
        out += ["| " + " | ".join([str(r[0])] + [f"{v:.1f}" for v in r[1:]]) + " |"
                for r in growth.itertuples(index=False)]
    if card_dir is not None and (Path(card_dir) / "card_per_layer.csv").is_file():
        g = gamma_card_table(card_dir)
        out += ["", "| " + " | ".join(g.columns) + " |", "|" + "---|" * len(g.columns)]
        out += ["| " + " | ".join(f"{v:.3g}" if isinstance(v, float) else str(v) for v in r) + " |"
                for r in g.itertuples(index=False)]
    return "\n".join(out)


def text_world_table(repo: Path = REPO) -> str:
    return text_world_tables(repo / "figures" / "benchmark", repo / "benchmarks" / "results" / "text_world", "text8",
                             repo / "figures" / "regime" / "text8_seed0")


def _f(values, fmt: str = "{:.1f}") -> str:
    return " / ".join(fmt.format(v) for v in values)


def _record(repo: Path, folder: str, claim_id: str) -> dict:
    return json.loads((repo / "figures" / folder / "claims.json").read_text())[claim_id]


def mini_world_prose(repo: Path = REPO) -> str:
    """The paragraph on what the mini-world's variant rows add (ACE at the paper's ε, the gate, WUDI's step
    size), every number from the benchmark's result files, the step-size study and the ace.sota record."""
    agg = results.aggregate(_summary(repo))
    t = results.wide(agg, "test_normalized")
    suites = list(t.columns)
    n = agg.drop_duplicates("suite").set_index("suite")["n_tasks"]
    ts = " / ".join(str(int(n[c])) for c in suites)
    ace, paper, first = t.loc["ace"], t.loc["ace (eps 1e-5)"], suites[0]
    real = [m for m in t.index if m not in ("base (frozen heads)", "experts (individual)")
            and not m.startswith(("ace", "wudi ("))]
    best = {c: str(t.loc[real, c].idxmax()) for c in suites}
    step = results.load_wudi_step_size(repo / "figures" / "benchmark", size="small")
    tuned, start = [], []
    for c in suites:
        d = step[step["suite"] == c]
        w = d[d["method"] == "wudi"]
        tuned.append(float(w.loc[w["val_normalized"].idxmax(), "test_normalized"]) if len(w) else math.nan)
        ta = d[d["method"] == "task_arithmetic"]
        start.append(float(ta["test_normalized"].iloc[0]) if len(ta) else math.nan)
    lrs = sorted({float(w.loc[w["val_normalized"].idxmax(), "lr"]) for _, w in
                  step[step["method"] == "wudi"].groupby("suite")})
    sota = _record(repo, "04_benchmark", "ace.sota")
    return (f"Two results the variant rows add: **ACE at the paper's ε = 1e-5 is {paper[first] - ace[first]:.1f} "
            f"points better than at the code's 1e-2** on `{first}` ({paper[first]:.1f} against {ace[first]:.1f}; "
            f"{paper[first] - t.loc['tsv_m', first]:+.1f} against TSV-M's {t.loc['tsv_m', first]:.1f}; the "
            f"`ace.sota` record, paired over seeds and test examples: {sota['measured'].split(';')[0]}), and "
            f"{_f((paper - ace)[suites[1:]])} points better at {' / '.join(str(int(n[c])) for c in suites[1:])} "
            f"tasks; with the gate off ACE moves {_f((t.loc['ace (gate off)'] - ace)[suites], '{:+.1f}')} points, "
            f"as expected when most matrices are below the gate anyway. WUDI (whoever started the interference "
            f"should end it) at its default step size scores "
            f"{_f(t.loc['wudi', suites])} against task arithmetic's {_f(t.loc['task_arithmetic', suites])} at {ts} "
            f"tasks; it starts from the sum of the task vectors (task arithmetic at λ = 1: {_f(start)} % normalized, "
            f"seed 0) and 300 Adam steps at lr 1e-5 do not move it far enough from there. With the learning rate "
            f"chosen on validation (`benchmarks/wudi_step_size.py`, seed 0: {' and '.join(f'{x:g}' for x in lrs)}) "
            f"the same steps give **{_f(tuned)} %** (one seed), against the best method of the table, "
            + ", ".join(f"{best[c]} at {t.loc[best[c], c]:.1f} ({int(n[c])} tasks)" for c in suites)
            + ". The table keeps the default of docs/methods.md §WUDI.\n")


def text_world_prose(repo: Path = REPO, suite: str = "text8") -> str:
    """The paragraph on what the text world's table shows, every number from its result files (means over
    seeds) and the ace.language_sota record."""
    _, mean = benchmark_tables(repo / "figures" / "benchmark", suite)
    m = mean.set_index("method")
    norm, n = m["test_normalized"], int(m["n_seeds"].max())
    base = next(x for x in m.index if str(x).startswith("base ("))
    structured = norm[[x for x in norm.index if m.loc[x, "kind"] != "reference"
                       and str(x).split(" (")[0] not in UNSTRUCTURED and not str(x).startswith("ace")]]
    best = str(structured.idxmax())
    ace_p = "ace (eps 2e-4)"
    ahead = [r for r in ("wudi", "ties", "regmean") if norm[r] < norm[ace_p]]
    behind = [r for r in ("esm", "tsv_m", "iso_cts", "wudi (lr on val)") if r in norm and norm[r] > norm[ace_p]]
    lang = _record(repo, "07_language", "ace.language_sota")
    room_g = ROBERTA_GLUE["tsv_m"] - ROBERTA_GLUE["task_arithmetic"]
    return (f"What it shows ({n} expert seeds, coefficients searched with patience 3). The experts reach "
            f"{m.loc['experts (individual)', 'test_acc']:.1f} % and the zero-shot base stands "
            f"{100 - norm[base]:.1f} normalized points below them. TSV-M − task arithmetic is "
            f"{norm['tsv_m'] - norm['task_arithmetic']:.1f} normalized points (RoBERTa-GLUE {room_g:.1f}), and the "
            f"best structured merge, {best} at {norm[best]:.1f}, is {norm[best] - norm['task_arithmetic']:.1f} "
            f"points above task arithmetic. ACE at the official code's ε = 1e-2 scores {norm['ace']:.1f} (task "
            f"arithmetic {norm['task_arithmetic']:.1f}); at the paper's RoBERTa ε = 2e-4 it gains "
            f"{norm[ace_p] - norm['ace']:.1f} points ({norm[ace_p]:.1f}), ahead of "
            + ", ".join(f"{r} ({norm[r]:.1f})" for r in ahead)
            + (", behind " + ", ".join(f"{r} ({norm[r]:.1f})" for r in behind) if behind else "")
            + f". The gate's effect at 2e-4 is {norm[ace_p] - norm['ace (eps 2e-4, gate off)']:+.1f} points "
            f"({norm['ace (eps 2e-4, gate off)']:.1f} with it off); the scale-free γ (`gamma_mode=\"cv\"`) gives "
            f"{norm['ace (eps 2e-4, gamma cv)']:.1f}. The official name rule of CART (centered arithmetic "
            f"with rank-reduced task vectors: `attn`/`mlp` in the key) misses "
            f"every BERT block weight, so its plain row is weight averaging ({norm['cart']:.1f}, and the merge "
            f"warns); with `targets=\"blocks\"` (every block matrix) it reaches {norm['cart (block matrices)']:.1f}. "
            f"With trained heads (lesson 07's protocol) the `ace.language_sota` record reads: {lang['measured']}.\n")


GENERATORS = {"benchmark": benchmark_table, "room": room_text, "targets": targets_table, "claims": claims_table,
              "text_world": text_world_table, "mini_world_prose": mini_world_prose,
              "text_world_prose": text_world_prose}
#: The pages that hold generated blocks, relative to the repository.
PAGES = ("README.md", "docs/results.md")


def blocks(text: str) -> list[str]:
    """The names of the generated blocks in ``text``, in order."""
    return [m.group("name") for m in BLOCK.finditer(text)]


def render(text: str, repo: Path = REPO, *, page: str = "the page") -> str:
    """``text`` with every generated block in it rewritten from the files under ``repo``."""

    def sub(m: re.Match) -> str:
        name = m.group("name")
        if name not in GENERATORS:
            raise KeyError(f"{page}: block {name!r} has no generator; known: {sorted(GENERATORS)}")
        return m.group(1) + GENERATORS[name](repo) + m.group(4)

    return BLOCK.sub(sub, text)


def render_pages(texts: dict[str, str], repo: Path = REPO) -> dict[str, str]:
    """Every page of ``texts`` ({relative path: text}) rendered; raises ValueError when a generator's
    block is missing from all of them or appears more than once."""
    found = [name for text in texts.values() for name in blocks(text)]
    missing = sorted(set(GENERATORS) - set(found))
    if missing:
        raise ValueError(f"no page of {sorted(texts)} holds the generated blocks {missing}")
    twice = sorted({n for n in found if found.count(n) > 1})
    if twice:
        raise ValueError(f"the generated blocks {twice} appear more than once in {sorted(texts)}")
    return {path: render(text, repo, page=path) for path, text in texts.items()}


#: The pages that state each lesson's reading time (``| `NN_x` | … | N min |`` and ``(read N min``).
READING_PAGES = ("README.md", "docs/teaching.md")


def reading_times(text: str, repo: Path = REPO) -> str:
    """``text`` with every lesson's stated reading time set to the one its notebook gives."""
    import importlib.util

    import nbformat

    spec = importlib.util.spec_from_file_location("build_site", repo / "scripts" / "build_site.py")
    site = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(site)
    for path in sorted((repo / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        n = site.reading_minutes(nbformat.read(str(path), as_version=4))
        text = re.sub(rf"^(\| `{path.stem}` \|[^|\n]*\| )\d+( min \|)", rf"\g<1>{n}\g<2>", text, flags=re.M)
        text = re.sub(rf"(`{path.stem}` \(read )\d+( min)", rf"\g<1>{n}\g<2>", text)
    return text


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if a page differs from the files")
    args = ap.parse_args(argv)
    pages = sorted(set(PAGES) | set(READING_PAGES))
    old = {page: (REPO / page).read_text() for page in pages}
    new = {**old, **render_pages({p: old[p] for p in PAGES})}
    new.update({p: reading_times(new[p]) for p in READING_PAGES})
    stale = [page for page in pages if new[page] != old[page]]
    if args.check:
        for page in stale:
            print(f"{page}'s generated tables differ from the committed files: run python3 scripts/readme_tables.py")
        return 1 if stale else 0
    for page in stale:
        path = REPO / page
        tmp = path.with_suffix(".md.tmp")
        tmp.write_text(new[page])
        tmp.replace(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
