"""Build the executed course as a static site (a Jupyter Book) and as slides, offline.

    python3 scripts/build_site.py                     # full profile: every lesson executed on the mini-world
    python3 scripts/build_site.py --profile quick     # the fixture world (what the tests build)
    python3 scripts/build_site.py --only 00 02        # some lessons
    python3 scripts/build_site.py --executed DIR      # lessons executed before (e.g. build/report/quick/)
    python3 scripts/build_site.py --slides-only --executed DIR

Three steps, into ``--out`` (default ``build/site/<profile>/``):

1. **Execute** the lessons with papermill through the course's one runner
   (:func:`acetools.notebooks.run_report`, as ``acetools report`` does) into ``executed/``, and
   write ``timings.json`` (seconds per lesson). ``--executed DIR`` skips this and reads the
   executed notebooks from DIR.
2. **The site**: Jupyter Book 1 (Sphinx, MyST-NB, sphinx-book-theme) builds ``book/`` (the
   executed notebooks, an index page with the course map, ``_config.yml``, ``_toc.yml``) into
   ``_build/html/`` without executing anything again. The equations are typeset by a copy of the
   local MathJax 2 (Debian's ``libjs-mathjax``, :func:`acetools.utils.local_mathjax_url`) under
   ``_static/``, and MyST-NB's widget scripts are off, so no page loads anything from a network
   (sphinx-thebe's script names a URL that only its launch button would load; the button is off).
3. **Slides**: nbconvert's reveal.js exporter turns each executed lesson into
   ``slides/NN_name.slides.html``. Cells are tagged automatically (:func:`slide_types`): a
   markdown cell that opens with a heading starts a slide (``###`` and deeper: a sub-slide), every
   other cell continues the current one, the parameters cells are skipped; a cell that already
   carries ``slideshow`` metadata keeps it. reveal.js comes from npm's ``reveal.js`` package
   (``scripts/setup.sh`` installs it under ``build/vendor/``; or ``$ACETOOLS_REVEAL``), require.js
   and jQuery from Debian's ``libjs-requirejs`` and ``libjs-jquery``; all are copied beside the
   slides, so the folder works offline and can be moved.

``tests/test_site.py`` builds both on the quick profile and checks them.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import nbformat
from papermill.exceptions import PapermillExecutionError

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # the repository's acetools, however the script is run

from acetools.notebooks import notebook_paths, run_report  # noqa: E402
from acetools.utils import local_mathjax_url  # noqa: E402

REVEAL_VERSION = "4.6.0"  # npm's reveal.js, the 4.x layout nbconvert's template expects (dist/, plugin/)
VENDOR = REPO / "build" / "vendor" / "node_modules"
JS = Path("/usr/share/javascript")  # Debian's libjs-* packages
REQUIRE_JS = (JS / "requirejs" / "require.min.js", JS / "requirejs" / "require.js")
JQUERY = (JS / "jquery" / "jquery.min.js", JS / "jquery" / "jquery.js")
#: The parts of MathJax 2 its TeX-AMS_CHTML configuration loads (about 3 MB of its 54).
MATHJAX_PARTS = ("MathJax.js", "config/TeX-AMS_CHTML.js", "config/TeX-AMS_CHTML-full.js", "extensions",
                 "jax/input/TeX", "jax/output/CommonHTML", "jax/element", "fonts/HTML-CSS/TeX/woff",
                 "localization/en")
MATHJAX_CONFIG = "?config=TeX-AMS_CHTML"
SKIP_TAGS = {"parameters", "injected-parameters", "remove-cell"}


class SiteError(RuntimeError):
    """A missing tool or file the build needs (the message names it and how to install it)."""


# --------------------------------------------------------------------------- the pieces
def mathjax_root() -> Path:
    """The folder of the local MathJax 2 (the one the HTML reports use)."""
    url = local_mathjax_url()
    if url is None:
        raise SiteError("no local MathJax: install Debian's libjs-mathjax (scripts/setup.sh does) "
                        "or set ACETOOLS_MATHJAX to a MathJax.js")
    from urllib.parse import unquote, urlparse

    return Path(unquote(urlparse(url).path)).parent


def copy_mathjax(dest: Path) -> Path:
    """Copy the parts of MathJax 2 a page needs into ``dest`` (a folder); returns ``dest``."""
    src = mathjax_root()
    for part in MATHJAX_PARTS:
        s, d = src / part, dest / part
        if not s.exists():
            raise SiteError(f"MathJax at {src} lacks {part}")
        d.parent.mkdir(parents=True, exist_ok=True)
        if s.is_dir():
            shutil.copytree(s, d, dirs_exist_ok=True)
        else:
            shutil.copy2(s, d)
    return dest


def reveal_root() -> Path:
    """npm's reveal.js package: ``$ACETOOLS_REVEAL`` or ``build/vendor/node_modules/reveal.js``."""
    import os

    root = Path(os.environ.get("ACETOOLS_REVEAL") or VENDOR / "reveal.js")
    if not (root / "dist" / "reveal.js").is_file():
        raise SiteError(f"no reveal.js at {root}: run scripts/setup.sh, or `npm install --prefix build/vendor "
                        f"reveal.js@{REVEAL_VERSION}`, or set ACETOOLS_REVEAL to an unpacked reveal.js 4 package")
    return root


def _first(paths: tuple[Path, ...], what: str) -> Path:
    for p in paths:
        if p.is_file():
            return p
    raise SiteError(f"no {what} at {[str(p) for p in paths]}: install Debian's "
                    f"{'libjs-requirejs' if 'require' in what else 'libjs-jquery'} (scripts/setup.sh does)")


def title_of(nb: nbformat.NotebookNode, fallback: str) -> str:
    """The text of the notebook's first markdown heading, or ``fallback``."""
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            m = re.search(r"^#\s+(.+?)\s*$", cell.source, re.M)
            if m:
                return m.group(1)
    return fallback


#: Reading speed of a lesson: its prose in words a minute, its code in lines a minute.
WORDS_PER_MINUTE, CODE_LINES_PER_MINUTE = 150, 10


def reading_minutes(nb: nbformat.NotebookNode) -> int:
    """Time to read a lesson, rounded to 5 minutes (at least 5): its markdown at
    :data:`WORDS_PER_MINUTE` plus its code at :data:`CODE_LINES_PER_MINUTE` (the README's course
    map and docs/teaching.md state these; tests/test_repo.py keeps them in step)."""
    words = sum(len(c.source.split()) for c in nb.cells if c.cell_type == "markdown")
    lines = sum(len(c.source.splitlines()) for c in nb.cells if c.cell_type == "code")
    minutes = words / WORDS_PER_MINUTE + lines / CODE_LINES_PER_MINUTE
    return 5 * max(1, round(minutes / 5))


def slide_types(nb: nbformat.NotebookNode) -> list[str]:
    """The reveal.js slide type of every cell: a cell's own ``slideshow`` metadata if it has one;
    else ``skip`` for the parameters cells, ``slide`` for a markdown cell that opens with a ``#`` or
    ``##`` heading (``subslide`` for ``###`` and deeper), ``-`` (continue the slide) otherwise. The
    first cell always starts a slide."""
    out = []
    for i, cell in enumerate(nb.cells):
        own = cell.get("metadata", {}).get("slideshow", {}).get("slide_type")
        tags = set(cell.get("metadata", {}).get("tags", []))
        if own:
            kind = own
        elif tags & SKIP_TAGS:
            kind = "skip"
        elif cell.cell_type == "markdown" and (m := re.match(r"\s*(#{1,6})\s", cell.source)):
            kind = "slide" if len(m.group(1)) <= 2 else "subslide"
        else:
            kind = "-"
        out.append("slide" if i == 0 and kind in ("-", "subslide") else kind)
    return out


def _for_pages(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """A copy without widget state (its renderer would load from a CDN)."""
    nb = nbformat.from_dict(nb)
    nb.metadata.pop("widgets", None)
    return nb


#: Put in each slide page's head: MathJax without its fast preview and its hidden MathML copy (on
#: slides, which are hidden while MathJax typesets them, both showed beside the typeset maths), and
#: long code lines and wide equations wrapped or scrolled inside the slide, not cut off at its edge.
SLIDES_HEAD = """<script type="text/x-mathjax-config">MathJax.Hub.Config({"fast-preview": {disabled: true},
  menuSettings: {assistiveMML: false}, "CommonHTML": {linebreaks: {automatic: true}}, messageStyle: "none"});</script>
<style>.reveal pre, .reveal pre code { white-space: pre-wrap; word-break: break-word; }
.reveal .MathJax_CHTML_Display, .reveal .MJXc-display { overflow-x: auto; overflow-y: hidden; }</style>
"""


def _offline(html: str) -> str:
    """The slide page without the template's mermaid import (a CDN module; the lessons draw no
    mermaid diagrams), with :data:`SLIDES_HEAD` at the top of its head."""
    html = re.sub(r'<script type="module">\s*import mermaid from [^<]*</script>', "", html)
    return html.replace("<head>", "<head>\n" + SLIDES_HEAD, 1)


def network_urls(html: str) -> list[str]:
    """The scripts, style sheets and fonts a page would load from a network."""
    return re.findall(r'(?:src|href)="((?:https?:)?//[^"]+\.(?:js|mjs|css|woff2?)(?:\?[^"]*)?)"', html) + \
        re.findall(r"import [^;]*? from '((?:https?:)?//[^']+)'", html)


# --------------------------------------------------------------------------- steps
def execute(profile: str, out: Path, only: list[str] | None) -> tuple[list[Path], dict[str, float]]:
    """Run the lessons under ``profile`` into ``out`` (no HTML); the executed paths and seconds each."""
    recs = run_report(profile, only=only, out=out, html=False)
    return [Path(r["executed"]) for r in recs], {r["notebook"]: r["seconds"] for r in recs}


def executed_lessons(folder: Path, only: list[str] | None) -> list[Path]:
    """The executed lessons in ``folder`` (named as the lessons), in course order."""
    wanted = [p.name for p in notebook_paths(only=only)]
    found = [folder / n for n in wanted if (folder / n).is_file()]
    if not found:
        raise SiteError(f"no executed lesson in {folder} (looked for {wanted})")
    return found


def _index_page(lessons: list[Path], profile: str, timings: dict[str, float]) -> str:
    rows = []
    for p in lessons:
        nb = nbformat.read(str(p), as_version=4)
        t = timings.get(p.stem)
        rows.append(f"| [{p.stem[:2]}]({p.stem}.ipynb) | {title_of(nb, p.stem)} | {reading_minutes(nb)} min | "
                    f"{f'{t:.0f} s' if t is not None else '—'} |")
    where = ("the fixture world of the quick profile: the numbers show that every cell runs, not what the "
             "mini-world measures" if profile == "quick" else "the mini-world (full profile)")
    return "\n".join([
        "# acetools: a course in data-free model merging", "",
        f"The nine lessons of `notebooks/`, executed on {where}. Each page is the notebook as it ran: its "
        "code, its tables and its figures. The exercises and their solutions are in `notebooks/exercises/` "
        "and `notebooks/solutions/`; the syllabus is `docs/teaching.md`.", "",
        "| lesson | title | read | executed in |", "|---|---|---|---|", *rows, ""])


def build_book(lessons: list[Path], out: Path, profile: str, timings: dict[str, float]) -> Path:
    """Lay out ``out/book`` and build it with Jupyter Book; returns the site's ``index.html``."""
    book = out / "book"
    if book.exists():
        shutil.rmtree(book)
    book.mkdir(parents=True)
    for p in lessons:
        nbformat.write(_for_pages(nbformat.read(str(p), as_version=4)), str(book / p.name))
    (book / "index.md").write_text(_index_page(lessons, profile, timings))
    toc = {"format": "jb-book", "root": "index", "chapters": [{"file": p.stem} for p in lessons]}
    (book / "_toc.yml").write_text(json.dumps(toc, indent=1))  # JSON is YAML
    config = {
        "title": "acetools course", "author": "acetools", "only_build_toc_files": True,
        "execute": {"execute_notebooks": "off"},
        "parse": {"myst_enable_extensions": ["dollarmath", "amsmath", "colon_fence"]},
        "html": {"use_repository_button": False, "use_issues_button": False, "use_edit_page_button": False,
                 "use_download_button": False, "home_page_in_navbar": True},
        "launch_buttons": {"notebook_interface": "classic", "binderhub_url": "", "jupyterhub_url": "",
                           "thebe": False, "colab_url": ""},
        "sphinx": {"config": {
            "mathjax_path": "mathjax/MathJax.js" + MATHJAX_CONFIG,  # relative: under _static
            "mathjax2_config": {"tex2jax": {"processClass": "math|output_area|tex2jax_process",
                                            "ignoreClass": "tex2jax_ignore"}},
            # not "_static": Jupyter Book would add every .js file there to every page
            "html_static_path": ["_vendor"],
            "nb_ipywidgets_js": {},  # no widget manager from a CDN
            "suppress_warnings": ["mystnb.unknown_mime_type", "myst.header"],
        }},
    }
    (book / "_config.yml").write_text(json.dumps(config, indent=1))
    copy_mathjax(book / "_vendor" / "mathjax")  # served as _static/mathjax/
    jb = shutil.which("jupyter-book") or str(Path(sys.executable).parent / "jupyter-book")
    if not Path(jb).is_file():
        raise SiteError("jupyter-book is not installed: pip install -e '.[course]' (scripts/setup.sh does)")
    proc = subprocess.run([jb, "build", str(book), "--path-output", str(out), "--builder", "html", "--quiet"],
                          capture_output=True, text=True)
    index = out / "_build" / "html" / "index.html"
    if proc.returncode != 0 or not index.is_file():
        raise SiteError(f"jupyter-book build failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return index


def build_slides(lessons: list[Path], out: Path) -> list[Path]:
    """One reveal.js page per lesson in ``out/slides`` with its scripts beside it; the pages."""
    from nbconvert import SlidesExporter

    slides = out / "slides"
    slides.mkdir(parents=True, exist_ok=True)
    reveal = reveal_root()
    for part in ("dist", "plugin/notes"):
        shutil.copytree(reveal / part, slides / "reveal.js" / part, dirs_exist_ok=True)
    vendor = slides / "vendor"
    vendor.mkdir(exist_ok=True)
    shutil.copy2(_first(REQUIRE_JS, "require.js"), vendor / "require.min.js")
    shutil.copy2(_first(JQUERY, "jQuery"), vendor / "jquery.min.js")
    copy_mathjax(slides / "mathjax")
    exporter = SlidesExporter(reveal_url_prefix="reveal.js", require_js_url="vendor/require.min.js",
                              jquery_url="vendor/jquery.min.js", mathjax_url="mathjax/MathJax.js" + MATHJAX_CONFIG,
                              exclude_input_prompt=True, exclude_output_prompt=True, reveal_scroll=True)
    pages = []
    for p in lessons:
        nb = _for_pages(nbformat.read(str(p), as_version=4))
        for cell, kind in zip(nb.cells, slide_types(nb)):
            cell.metadata["slideshow"] = {"slide_type": kind}
        body, _ = exporter.from_notebook_node(nb, resources={"metadata": {"name": title_of(nb, p.stem)}})
        page = slides / f"{p.stem}.slides.html"
        page.write_text(_offline(body))
        pages.append(page)
    return pages


def build(profile: str = "full", out: Path | None = None, *, only: list[str] | None = None,
          executed: Path | None = None, site: bool = True, slides: bool = True) -> dict:
    """The whole build; returns a record of what was written and the seconds each step took."""
    out = (Path(out) if out is not None else REPO / "build" / "site" / profile).resolve()
    out.mkdir(parents=True, exist_ok=True)
    rec: dict = {"profile": profile, "out": str(out)}
    t0 = time.perf_counter()
    if executed is None:
        lessons, timings = execute(profile, out / "executed", only)
        (out / "timings.json").write_text(json.dumps(timings, indent=1))
        rec["executed"] = str(out / "executed")
    else:
        lessons = executed_lessons(Path(executed), only)
        timings = {}
        rec["executed"] = str(Path(executed).resolve())
    rec["execute_seconds"] = round(time.perf_counter() - t0, 1)
    rec["lessons"] = [p.stem for p in lessons]
    if site:
        t = time.perf_counter()
        rec["site"] = str(build_book(lessons, out, profile, timings))
        rec["site_seconds"] = round(time.perf_counter() - t, 1)
    if slides:
        t = time.perf_counter()
        rec["slides"] = [str(p) for p in build_slides(lessons, out)]
        rec["slides_seconds"] = round(time.perf_counter() - t, 1)
    (out / "build.json").write_text(json.dumps(rec, indent=1))
    return rec


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", choices=["full", "quick"], default="full",
                    help="full: the mini-world (default); quick: the fixture world, minutes")
    ap.add_argument("--out", type=Path, default=None, help="output folder (default build/site/<profile>)")
    ap.add_argument("--only", nargs="+", default=None, metavar="LESSON", help="lessons (number, stem or name)")
    ap.add_argument("--executed", type=Path, default=None, metavar="DIR",
                    help="use the executed notebooks in DIR instead of running the lessons")
    group = ap.add_mutually_exclusive_group()
    group.add_argument("--slides-only", action="store_true", help="build only the slides")
    group.add_argument("--no-slides", action="store_true", help="build only the site")
    args = ap.parse_args(argv)
    try:
        rec = build(args.profile, args.out, only=args.only, executed=args.executed, site=not args.slides_only,
                    slides=not args.no_slides)
    except SiteError as err:
        print(f"build_site: error: {err}", file=sys.stderr)
        return 2
    except PapermillExecutionError as err:  # a lesson failed: name it and its cell, not papermill's traceback
        print(f"build_site: error: a lesson failed in cell [{err.exec_count}]: {err.ename}: {err.evalue}; "
              "its partly executed copy is in the output folder's executed/", file=sys.stderr)
        return 1
    if "site" in rec:
        print(f"site:   {rec['site']}  ({rec['site_seconds']} s)")
    if "slides" in rec:
        print(f"slides: {Path(rec['slides'][0]).parent}/  ({len(rec['slides'])} lessons, {rec['slides_seconds']} s)")
    print(f"lessons executed in {rec['execute_seconds']} s" if args.executed is None else "lessons read from "
          f"{args.executed}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
