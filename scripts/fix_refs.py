"""Rewrite references to the old, private specification into references to the repository's docs.

Code and notebooks used to cite "spec §3.4", "(spec, Notation)", "the spec's rule", "STYLE 7", …,
documents that are not in the repository. This script maps each of those onto a section of
``docs/`` (``docs/methods.md §TSV-M``, ``docs/methods.md §ACE, Eq. (ACE.10)``, ``docs/style.md §7``)
and rewrites the files in place::

    python3 scripts/fix_refs.py            # rewrite, print a summary per file
    python3 scripts/fix_refs.py --dry-run  # show what would change
    python3 scripts/fix_refs.py --check    # exit 1 if an old reference is left (no writes)

It is idempotent (a second run changes nothing) and finds files by glob, so it can be run again
after files move (e.g. into ``acetools/course/``). Notebooks are rewritten cell by cell through
nbformat and stay output-free. ``tests/test_docs.py`` checks the result: no old references, and
every ``docs/<file>.md §<section>`` reference points at a heading that exists.

Once every branch is merged and the check passes, this script has done its job and can be deleted.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
M = "docs/methods.md"
S = "docs/style.md"

#: Where the old sections went (spec section -> docs/methods.md heading). For the record and for
#: the generic rules below; sub-parts with equations are mapped more precisely in RULES.
SECTIONS: dict[str, str] = {
    "0": "Benchmark protocol",
    "1": "ACE",
    "2": "ESM",
    "3.1": "Weight averaging",
    "3.2": "Task arithmetic",
    "3.3": "TIES",
    "3.4": "TSV-M",
    "3.5": "Iso-C, §Iso-CTS",
    "3.6": "WUDI",
    "3.7": "CART",
    "3.8": "DARE",
    "3.9": "RegMean",
    "3.10": "RegMean",
    "4": "Oracles",
    "5": "Published numbers",
}

#: Exact substrings whose context a generic rule would get wrong; applied first, in order.
EXACT: list[tuple[str, str]] = [
    # registered descriptions and Param docs (code strings: wrapped here, not by the reflow)
    ('"ACE-Merging: closed-form merge with covariances estimated from the task vectors (Xu et al. 2026; spec §1)",',
     (
         '"ACE-Merging: closed-form merge with covariances estimated from the task vectors "\n'
         '    "(Xu et al. 2026; docs/methods.md §ACE)",'
     )),
    ('scaling=Param(1.0, "s in theta = theta0 + s * W_bar, applied to every key (spec §1(a)8)", low=0.0),',
     (
         'scaling=Param(1.0, "s in theta = theta0 + s * W_bar, applied to every key (docs/methods.md §ACE, Eq. (ACE.14))",\n'
         '                  low=0.0),'
     )),
    ((
         'in_out_keys=Param((), "matrices stored in x out (x @ W), transposed around ACE; () = as stored, like the official '
         'code (spec §1(d))", check=_check_in_out_keys),'
     ),
     (
         'in_out_keys=Param((), "matrices stored in x out (x @ W), transposed around ACE; () = as stored, like the "\n'
         '                      "official code (docs/methods.md §ACE)", check=_check_in_out_keys),'
     )),
    ('@register("weight_averaging", "theta0 + (1/T) sum_t tau_t: plain averaging of the experts (spec §3.1)")',
     (
         '@register("weight_averaging",\n'
         '          "theta0 + (1/T) sum_t tau_t: plain averaging of the experts (docs/methods.md §Weight averaging)")'
     )),
    ("ESD needs at least one proxy token (spec §2 uses 32 images)",
     "ESD needs at least one proxy token (the paper uses 32 images)"),
    ('alpha=Param(1.0, "merge coefficient alpha (spec §2 Step D; chosen on validation in the paper)", low=0.0,',
     'alpha=Param(1.0, "merge coefficient alpha (docs/methods.md §ESM, Eq. (ESM.11); chosen on validation)", low=0.0,'),
    ('"RegMean: per-layer least squares on the experts\' input Gram matrices (Jin et al. 2023; spec §3.9; needs data)",',
     (
         '"RegMean: per-layer least squares on the experts\' input Gram matrices "\n'
         '    "(Jin et al. 2023; docs/methods.md §RegMean; needs data)",'
     )),
    ('"TSV-M: per-task top-(r/T) singular triplets, orthogonalised by polar (Gargiulo et al. 2025; spec §3.4)",',
     (
         '"TSV-M: per-task top-(r/T) singular triplets, orthogonalised by polar "\n'
         '    "(Gargiulo et al. 2025; docs/methods.md §TSV-M)",'
     )),
    ('"Iso-CTS: common + task-specific subspaces with a flat spectrum (Marczak et al. 2025; spec §3.5)",',
     (
         '"Iso-CTS: common + task-specific subspaces with a flat spectrum "\n'
         '    "(Marczak et al. 2025; docs/methods.md §Iso-CTS)",'
     )),
    ('"""Iso-CTS, spec §3.5:', f'"""Iso-CTS, {M} §Iso-CTS:'),
    ("# not a matrix by the spec's rule; zero task vectors", "# not a matrix (docs/methods.md §Matrix path); zero"),
    # acetools/merging/ace.py: the stage table's reference column
    ("stage                 function                                             spec / paper",
     "stage                 function                                             docs/methods.md §ACE; paper"),
    ("§1(a)2, eq. 7", "(ACE.5)-(ACE.6), eq. 7"),
    ("§1(a)3, eqs 5-6", "(ACE.3)-(ACE.4), eqs 5-6"),
    ("§1(a)4, eqs 8-10", "(ACE.7)-(ACE.8), eqs 8-10"),
    ("§1(a)5, eqs 11-13", "(ACE.9), eqs 11-13"),
    ("§1(a)6, eq. 14", "(ACE.10), eq. 14"),
    ("§1(a)7, eqs 15-19", "(ACE.11)-(ACE.13), eqs 15-19"),
    ("(spec, verification 1.)", f"({M} §ACE, Eq. (ACE.9))"),
    ("spec verification note 5", f"{M} §ACE"),
    ("(spec verification 2.)", f"({M} §ACE, Eq. (ACE.13))"),
    ("spec §1(a)5 ties this to the flag", f"{M} §ACE, Eq. (ACE.9) ties this to the flag"),
    ("(spec §1(d) Proposal: T-1)", f"({M} §ACE: T-1, as the code)"),
    ("(spec §1(d) Proposal)", f"({M} §ACE)"),
    ("like the official code (spec §1(d))", f"like the official code ({M} §ACE)"),
    # esm.py
    ("spec §2 Step B and verification (i)", f"{M} §ESM, Eq. (ESM.3)"),
    ("(spec §2 uses 32 images)", f"({M} §ESM uses 32 images)"),
    ("spec §2(d) Proposal", f"{M} §ESM"),
    # benchmark.py, search.py
    ("(spec §0, §1 (b), §2 Step D, §3)", f"({M} §Benchmark protocol, §ACE, §ESM and each method's section)"),
    ("(spec §0, §2 Step D)", f"({M} §Benchmark protocol, §ESM)"),
    # svd.py section banners
    ("TSV-M (§3.4)", "TSV-M (docs/methods.md §TSV-M)"),
    ("Iso-C (§3.5)", "Iso-C (docs/methods.md §Iso-C)"),
    ("Iso-CTS (§3.5)", "Iso-CTS (docs/methods.md §Iso-CTS)"),
    ("CART (§3.7)", "CART (docs/methods.md §CART)"),
    ("TSV-M, Iso-C and Iso-CTS (spec §3.5)", f"TSV-M ({M} §TSV-M), Iso-C and Iso-CTS ({M} §Iso-C, §Iso-CTS)"),
    ("(spec §3.4), Iso-C and Iso-CTS (spec §3.5) and CART (spec §3.7)",
     f"({M} §TSV-M), Iso-C and Iso-CTS ({M} §Iso-C, §Iso-CTS) and CART ({M} §CART)"),
    ("sum_t tau_t (spec §3.5)", f"sum_t tau_t ({M} §Iso-C, Eq. (Iso-C.1))"),
    ("Iso-C: the summed task vector with a flat (isotropic) spectrum (Marczak et al. 2025; spec §3.5)",
     f"Iso-C: the summed task vector with a flat (isotropic) spectrum (Marczak et al. 2025; {M} §Iso-C)"),
    ('"""Iso-C, spec §3.5:', f'"""Iso-C, {M} §Iso-C:'),
    ("(spec §3.4, §3.5, §3.7)", f"({M} §TSV-M, §Iso-C, §Iso-CTS, §CART)"),
    # regmean.py
    ("(spec §3.9, transposed back)", f"({M} §RegMean, Eq. (RegMean.3))"),
    ("RegMean's solve (spec §3.9, without the off-diagonal shrink)",
     f"RegMean's solve ({M} §RegMean, without the off-diagonal shrink)"),
    # ties.py
    ("(spec §3.3, oracles.md)", f"({M} §TIES, §Oracles)"),
    ("(spec §3.3, §3.8)", f"({M} §TIES, §DARE)"),
    ("(default, the spec's Proposal; TIES and TALL/TSV)", f"(default, {M} §TIES; TIES and TALL/TSV)"),
    ("(default, the spec's Proposal)", f"(default, {M} §TIES)"),
    ("(spec §3.8 Proposal: the seed is fixed per task)", f"({M} §DARE: the seed is fixed per task)"),
    ('Seeds (spec §3.8 Proposal "fix the seed per task")', f"Seeds ({M} §DARE)"),
    # wudi.py
    ("Defaults follow the spec's Proposal:", f"Defaults ({M} §WUDI):"),
    # averaging.py and its test
    ("(spec §3.1, §3.2)", f"({M} §Weight averaging, §Task arithmetic)"),
    # merging/__init__.py, _linalg.py, diagnostics, tests
    ('The spec\'s "is it a matrix?" rule', f'The "is it a matrix?" rule of {M} §Matrix path'),
    ("(spec, CLIP parameter inventory)", f"({M} §Matrix path)"),
    ("(spec, Notation: the", f"({M} §Notation: the"),
    ("(spec, Notation)", f"({M} §Notation)"),
    ("the spec's rule", f"the rule of {M} §Matrix path"),
    # models.py, zoo.py, finetune.py
    ("the spec's layer rules (CLIP parameter", f"the layer rules of {M} §Matrix path (CLIP parameter"),
    ('spec §0 "Heads"', f"{M} §Benchmark protocol (heads)"),
    ('spec §0 "Fine-tuning recipe"', f"{M} §Benchmark protocol (fine-tuning recipe)"),
    ("(spec §0\n", f"({M} §Benchmark protocol,\n"),
    ("spec §0 / prototype", f"{M} §Benchmark protocol / prototype"),
    # paper_tables.py
    ("the collected table of spec §5 (``shared/spec/algorithms.md``)", f"the collected table of {M} §Published numbers"),
    ("# spec §5; CART's B/32 and L/14 cells use other 8-task checkpoints (spec note *)",
     f"# {M} §Published numbers; CART's B/32 and L/14 cells use other 8-task checkpoints (note *)"),
    ("ESM's and spec §5's use", f"ESM's and {M} §Published numbers use"),
    ("(seed 001 names TIES, spec §5 names TA)", f"(seed 001 names TIES, {M} §Published numbers names TA)"),
    ("table of spec §5 (ViT-B/16", f"table of {M} §Published numbers (ViT-B/16"),
    # tests
    ("against an independent float64 transcription of the spec's pseudocode",
     "against an independent float64 transcription of its equations"),
    ('"""Spec §1(a) pseudocode, line by line', f'"""{M} §ACE, Eqs. (ACE.3)-(ACE.14), line by line'),
    ('"""Spec §3.4 step by step', f'"""{M} §TSV-M, Eqs. (TSV-M.1)-(TSV-M.3), step by step'),
    ('"""Spec §3.3 with explicit', f'"""{M} §TIES, Eqs. (TIES.1)-(TIES.3), with explicit'),
    ("(spec verification (ii))", f"({M} §ESM, Step A)"),
    ("but the spec pads with identity columns", "but ESM pads with identity columns"),
    ("# --------------------------------------------------------------------------- full method vs spec",
     "# --------------------------------------------------------------------------- full method vs docs/methods.md §ESM"),
    ("# --- the spec equations --------------------------------------------------------------------",
     "# --- the equations of docs/methods.md --------------------------------------------------------"),
    ("the spec's key rules (matrix path,", f"the key rules of {M} (matrix path,"),
    # references broken over two lines
    ("(one public function per stage, spec\n§1).", f"(one public function per stage,\n{M} §ACE)."),
    ("(one public function per stage, spec\n§2).", f"(one public function per stage,\n{M} §ESM)."),
    # the paper summaries and the prototype's notes (not in the repository either)
    ("the seed summaries (``shared/seeds/``: ACE-Merging", f"the paper summaries ({M} §Sources: ACE-Merging"),
    ("the ACE-Merging summaries in ``shared/seeds/`` (arXiv 2603.02945)",
     f"the ACE-Merging summaries ({M} §Sources; arXiv 2603.02945)"),
    ((
         "  The prototype found this far better per CPU-second than a tiny CLIP\n"
         "  (``shared/notes/mini-world-prototype.md``, lesson 3)."
     ),
     (
         "  The mini-world's prototype found this far better per CPU-second than a tiny CLIP\n"
         "  (its lesson 3)."
     )),
    ("(spec/oracles.md)", f"({M} §Oracles)"),
    ("(oracles.md)", f"({M} §Oracles)"),
    # README
    ("| method | hyperparameters (defaults) | spec |", "| method | hyperparameters (defaults) | docs/methods.md |"),
    ((
         '"spec" refers to the specification the implementations follow (maths, defaults, and where paper\n'
         "and official code disagree)."
     ),
     (
         "[docs/methods.md](docs/methods.md) has the maths of every method, its defaults, and where paper\n"
         "and official code disagree; [docs/index.md](docs/index.md) maps the rest of the docs."
     )),
    ("The table keeps the\nspec's default;", "The table keeps the\ndefault of docs/methods.md §WUDI;"),
]

_README_ROWS = {"3.1": "Weight averaging", "3.2": "Task arithmetic", "3.3": "TIES", "3.4": "TSV-M",
                "3.5": "Iso-C, §Iso-CTS", "3.6": "WUDI", "3.7": "CART", "3.8": "DARE", "3.9": "RegMean",
                "1": "ACE", "2": "ESM"}

_ESM_STEPS = {
    "Steps A and B1-B6": "Eqs. (ESM.1)-(ESM.9)",
    "Steps A, B1-B6": "Eqs. (ESM.1)-(ESM.9)",
    "Steps B1, B4 and C": "Eqs. (ESM.4), (ESM.7), (ESM.10)",
    "Step A": "Eqs. (ESM.1)-(ESM.2)",
    "Step B1": "Eq. (ESM.4)",
    "Step B2": "Eq. (ESM.5)",
    "Step B3": "Eq. (ESM.6)",
    "Step B4": "Eq. (ESM.7)",
    "Step B5": "Eq. (ESM.8)",
    "Step C": "Eq. (ESM.10)",
    "Step D": "Eqs. (ESM.11)-(ESM.12)",
}
_ACE_PARTS = {
    "1(a)1": "Eq. (ACE.14)",
    "1(a)2": "Eqs. (ACE.5)-(ACE.6)",
    "1(a)3": "Eqs. (ACE.3)-(ACE.4)",
    "1(a)4": "Eqs. (ACE.7)-(ACE.8)",
    "1(a)5": "Eq. (ACE.9)",
    "1(a)6": "Eq. (ACE.10)",
    "1(a)7": "Eqs. (ACE.11)-(ACE.13)",
    "1(a)8": "Eq. (ACE.14)",
}


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, spaces to '-', punctuation other than '-'/'_' dropped."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _readme_links(sections: str) -> str:
    names = [x.strip().lstrip("§") for x in sections.split(",")]
    return ", ".join(f"[§{n}](docs/methods.md#{_slug(n)})" for n in names)


def _esm(m: re.Match) -> str:
    return f"{M} §ESM, {_ESM_STEPS[m.group(1)]}"


#: Generic rules, applied after EXACT, in order (most specific first).
RULES: list[tuple[re.Pattern, object]] = [
    # README's method table: "| §3.4 |"
    (re.compile(r"\| §(\d(?:\.\d+)?) \|"), lambda m: "| " + _readme_links(_README_ROWS[m.group(1)]) + " |"),
    (re.compile(r"[Ss]pec §2 (Steps A and B1-B6|Steps A, B1-B6|Steps B1, B4 and C|Step B[1-5]|Step [ACD])"
                r"(?![\w-])"), _esm),
    (re.compile(r"[Ss]pec §2 \(Steps A-D\)"), lambda m: f"{M} §ESM"),
    (re.compile(r"[Ss]pec §1\(a\) steps 2-7"), lambda m: f"{M} §ACE, Eqs. (ACE.3)-(ACE.13)"),
    (re.compile(r"[Ss]pec §(1\(a\)[1-8])"), lambda m: f"{M} §ACE, {_ACE_PARTS[m.group(1)]}"),
    (re.compile(r"[Ss]pec §1\s?\((?:a|b|d)\)(?: Proposal)?"), lambda m: f"{M} §ACE"),
    (re.compile(r"[Ss]pec §3\.3 a\.([123])"), lambda m: f"{M} §TIES, Eq. (TIES.{m.group(1)})"),
    (re.compile(r"[Ss]pec §3\.4 step 1"), lambda m: f"{M} §TSV-M, Eq. (TSV-M.1)"),
    (re.compile(r"[Ss]pec §3\.5 step 1"), lambda m: f"{M} §Iso-CTS, Eq. (Iso-CTS.1)"),
    (re.compile(r"[Ss]pec §3\.5 steps 1-6"), lambda m: f"{M} §Iso-CTS"),
    (re.compile(r"[Ss]pec §3\.6 \(a\)"), lambda m: f"{M} §WUDI, Eq. (WUDI.1)"),
    (re.compile(r"[Ss]pec §(\d(?:\.\d+)?)\b"), lambda m: f"{M} §{SECTIONS[m.group(1)]}"),
    (re.compile(r"[Ss]pec verification \((?:ii|iii)\)"), lambda m: f"{M} §ESM"),
    # notebooks: "(eq. 7; spec §1(a)2)" is caught above; bare "§1)" / "§2)" after a line break
    (re.compile(r"\bSTYLE (\d+)\b"), lambda m: f"{S} §{m.group(1)}"),
]

#: What counts as an old reference still left (used by --check and by tests/test_docs.py).
LEFTOVER = re.compile(
    r"(?i:\bspec\b\s*§)|\bspec verification\b|\bthe spec's\b|\(spec(?:,\s*[A-Z]|/| §)|\bspec note\b|\bSTYLE \d"
    r"|(?<![\w/])oracles\.md|algorithms\.md|shared/(?:spec|seeds|notes)"
)


WIDTH = 120
#: Spans a line break must not cut: a docs reference with its sections and equation labels.
_HEADS = r"(?:Benchmark protocol|Weight averaging|Task arithmetic|Matrix path|Published numbers|Noise rule|Claim rules|Naming rule|[\w.-]+)"
_PROTECT = re.compile(
    r"docs/[\w-]+\.md(?: §" + _HEADS + r"(?:(?:, | and )§" + _HEADS + r")*)?"
    r"|Eqs?\. \([\w.-]+\)(?:(?:-|, )\([\w.-]+\))*|\(ACE\.\d+\)(?:-\(ACE\.\d+\))?"
)


def _split_at(line: str, width: int = WIDTH) -> int | None:
    """The index of the last space before ``width`` that is outside every protected span."""
    spans = [m.span() for m in _PROTECT.finditer(line)]
    start = len(line) - len(line.lstrip())
    for i in range(min(width, len(line) - 1), start, -1):
        if line[i] == " " and not any(a <= i < b for a, b in spans) and line[:i].strip() not in ('"""', 'r"""', "#", "#:"):
            return i
    return None


def _docstring_lines(text: str) -> set[int]:
    """0-based numbers of the lines that lie inside a docstring (a triple-quoted string statement)."""
    import io
    import tokenize

    lines: set[int] = set()
    prev = tokenize.NEWLINE
    try:
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            statement = prev in (tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.NL, tokenize.ENCODING)
            if (tok.type == tokenize.STRING and statement
                    and tok.string.lstrip("rRbBuU").startswith(('"""', "'''"))):
                lines.update(range(tok.start[0] - 1, tok.end[0]))
            if tok.type not in (tokenize.COMMENT, tokenize.NL):
                prev = tok.type
    except (tokenize.TokenError, SyntaxError):
        return set()
    return lines


def reflow(text: str, width: int = WIDTH) -> str:
    """Break the lines longer than ``width`` that carry a docs reference, where that is safe: full-line
    comments (continued with the same ``#``/``#:`` prefix) and lines inside docstrings (continued at
    the same indentation). Code lines are left alone (EXACT wraps the few code strings)."""
    doc = _docstring_lines(text)
    out = []
    for n, line in enumerate(text.split("\n")):
        while len(line) > width and "docs/" in line:
            body = line.lstrip()
            indent = line[: len(line) - len(body)]
            if body.startswith("#"):
                prefix = indent + ("#: " if body.startswith("#:") else "# ")
            elif n in doc:
                prefix = indent
            else:
                break
            i = _split_at(line, width)
            if i is None:
                break
            out.append(line[:i].rstrip())
            line = prefix + line[i + 1:].lstrip()
        out.append(line)
    return "\n".join(out)


def files(root: Path = ROOT) -> list[Path]:
    """Every file whose references are rewritten (found by glob, so moved files are found too)."""
    out: list[Path] = []
    for pattern in ("acetools/**/*.py", "tests/**/*.py", "benchmarks/**/*.py", "benchmarks/**/*.sh",
                    "scripts/*.py", "notebooks/*.ipynb", "README.md"):
        out += sorted(p for p in root.glob(pattern) if p.is_file())
    return [p for p in out if p.name not in ("fix_refs.py", "test_docs.py")]


def rewrite_text(text: str) -> tuple[str, int]:
    """``text`` with every old reference rewritten, and the number of replacements."""
    n = 0
    for old, new in EXACT:
        if old in text:
            n += text.count(old)
            text = text.replace(old, new)
    for pat, repl in RULES:
        text, k = pat.subn(repl, text)
        n += k
    return text, n


def _notebook_sources(nb) -> list:
    return [c for c in nb.cells]


def rewrite_file(path: Path, write: bool = True) -> int:
    """Rewrite one file in place (notebooks cell by cell); returns the number of replacements."""
    if path.suffix == ".ipynb":
        import nbformat

        nb = nbformat.read(path, as_version=4)
        total = 0
        for cell in _notebook_sources(nb):
            new, n = rewrite_text(cell.source)
            if n:
                cell.source = new
                total += n
        if total and write:
            path.write_text(nbformat.writes(nb) + "\n", encoding="utf-8")
        return total
    text = path.read_text(encoding="utf-8")
    new, n = rewrite_text(text)
    if n and path.suffix == ".py":
        new = reflow(new)
    if n and write:
        path.write_text(new, encoding="utf-8")
    return n


def leftovers(root: Path = ROOT) -> list[str]:
    """``path:line: text`` for every old reference still in the rewritten files."""
    out = []
    for p in files(root):
        for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1):
            if LEFTOVER.search(line):
                out.append(f"{p.relative_to(root)}:{i}: {line.strip()[:160]}")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dry-run", action="store_true", help="count the replacements, write nothing")
    ap.add_argument("--check", action="store_true", help="exit 1 if an old reference is left (writes nothing)")
    args = ap.parse_args(argv)
    if not args.check:
        total = 0
        for p in files():
            n = rewrite_file(p, write=not args.dry_run)
            if n:
                print(f"{p.relative_to(ROOT)}: {n}")
                total += n
        print(f"{'would rewrite' if args.dry_run else 'rewrote'} {total} references")
    left = leftovers()
    for line in left:
        print(f"left: {line}")
    return 1 if (args.check and left) else 0


if __name__ == "__main__":
    sys.exit(main())
