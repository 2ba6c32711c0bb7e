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


GENERATORS = {"benchmark": benchmark_table, "room": room_text, "targets": targets_table, "claims": claims_table,
              "text_world": text_world_table}
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
