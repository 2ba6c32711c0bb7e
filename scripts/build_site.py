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
   The docs pages the lessons link (``../docs/glossary.md#cka``, and the pages those link) are the
   book's Reference part (:func:`linked_docs`), with GitHub's heading anchors, so every link resolves.
3. **Slides**: nbconvert's reveal.js exporter turns each executed lesson into
   ``slides/NN_name.slides.html``, 1280 × 720, one idea a slide (:func:`one_idea_slides`): each
   markdown block and each code cell is a slide, each displayed result another; a ``#``/``##``
   heading starts a section, the rest stack under it; a long paragraph shows its first sentence and
   its equations and goes whole into the speaker notes (``s`` in the deck); the parameters cells
   are skipped; a cell that already carries ``slideshow`` metadata keeps it. A slide too full for
   1280 × 720 gets a smaller font (:data:`SLIDES_FOOT`). reveal.js comes from npm's ``reveal.js`` package
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
from bs4 import BeautifulSoup
from papermill.exceptions import PapermillExecutionError

from acetools.notebooks import link_docs, notebook_paths, run_report
from acetools.utils import local_mathjax_url

REPO = Path(__file__).resolve().parents[1]

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


DOCS = REPO / "docs"
#: A markdown link to a docs page: ``](../docs/glossary.md#cka)`` in a lesson, ``](methods.md)`` in a page.
_DOC_LINK = re.compile(r"\]\((?:\.\./docs/)?([\w.-]+\.md)(?:#[^)\s]*)?\)")


def linked_docs(markdown: str) -> list[Path]:
    """The docs pages the lessons' ``markdown`` links to (``../docs/<page>.md``), with the pages those
    link to in turn, in the order first met."""
    found: list[Path] = []
    todo = [m.group(1) for m in _DOC_LINK.finditer(markdown) if m.group(0).startswith("](../docs/")]
    while todo:
        page = DOCS / todo.pop(0)
        if page.is_file() and page not in found:
            found.append(page)
            todo += [m.group(1) for m in _DOC_LINK.finditer(page.read_text(encoding="utf-8"))]
    return found


def copy_docs(pages: list[Path], book: Path) -> list[str]:
    """Copy the docs ``pages`` into ``book/docs/`` and the files they link outside docs (figures) to the same
    place relative to them, so every link resolves in the book; returns their entries for ``_toc.yml``."""
    for page in pages:
        (book / "docs").mkdir(parents=True, exist_ok=True)
        shutil.copy2(page, book / "docs" / page.name)
        for ref in re.findall(r"\]\((\.\./[^)#\s]+)", page.read_text(encoding="utf-8")):
            src, dest = (DOCS / ref).resolve(), (book / "docs" / ref).resolve()
            if src.is_file() and src.is_relative_to(REPO) and dest.is_relative_to(book.resolve()):
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, dest)
    return [f"docs/{p.stem}" for p in pages]


def _for_book(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """A lesson for the book: :func:`_for_pages`, its links to ``../docs/`` pointing at the book's copy."""
    nb = _for_pages(nb)
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            cell.source = cell.source.replace("](../docs/", "](docs/")
    return nb


#: Words of prose a slide shows; a longer paragraph shows its first sentence (and its equations) and
#: goes whole into the speaker notes.
SLIDE_WORDS = 45


def md_blocks(markdown: str) -> list[str]:
    """``markdown`` split at its blank lines into blocks (paragraphs, lists, headings), a ``$$…$$``
    equation or a fenced code block never cut; a heading block joins the block after it."""
    blocks: list[str] = []
    cur: list[str] = []
    fence = math = False
    for line in markdown.splitlines():
        if not line.strip() and not fence and not math:
            if cur:
                blocks.append("\n".join(cur))
            cur = []
            continue
        cur.append(line)
        fence ^= line.lstrip().startswith("```")
        math ^= line.count("$$") % 2 == 1
    if cur:
        blocks.append("\n".join(cur))
    out: list[str] = []
    for b in blocks:
        if out and re.fullmatch(r"#{1,6} .*", out[-1]):  # a lone heading: with what follows it
            out[-1] += "\n\n" + b
        else:
            out.append(b)
    return out


def _words(block: str) -> int:
    return len(re.sub(r"\$\$.*?\$\$|\$[^$]*\$", "x", block, flags=re.S).split())


def _shown(block: str) -> str:
    """What a slide shows of a long block: its heading, its first sentence and its display equations."""
    heading = re.match(r"(#{1,6} .*\n\n)?", block).group(0)  # type: ignore[union-attr]
    body = block[len(heading):]
    if body.lstrip().startswith(("-", "*", "1.")):  # a list: its first item
        first = re.split(r"\n(?=\s*(?:[-*]|\d+\.)\s)", body.strip())[0]
    else:
        first = re.split(r"(?<=[.:;!?])\s+(?=[A-Z(*$])", re.sub(r"\$\$.*?\$\$", "", body, flags=re.S).strip())[0]
    maths = re.findall(r"\$\$.*?\$\$", body, flags=re.S)
    return heading + first.strip() + ("" if first.strip().endswith((".", ":")) else " …") + \
        "".join(f"\n\n{m}" for m in maths)


def _code_slides(cell: nbformat.NotebookNode) -> list[nbformat.NotebookNode]:
    """A code cell as slides: its code (unless tagged ``hide-input``), then each displayed result
    (a table, a figure) on a slide of its own, the printed lines beside the code."""
    tags = list(cell.metadata.get("tags", []))
    shows = [o for o in cell.get("outputs", []) if o.get("output_type") in ("display_data", "execute_result")]
    printed = [o for o in cell.get("outputs", []) if o not in shows]
    out = []
    if "hide-input" not in tags or printed:
        out.append(nbformat.from_dict({**cell, "outputs": printed, "metadata": {**cell.metadata}}))
    hidden = [*tags, "hide-input"] if "hide-input" not in tags else tags
    for o in shows:
        out.append(nbformat.from_dict({**cell, "outputs": [o], "metadata": {**cell.metadata, "tags": hidden}}))
    for i, c in enumerate(out):
        c.metadata["slideshow"] = {"slide_type": "subslide"}
        c.pop("id", None)
        if i:
            c.execution_count = None
    return out


def one_idea_slides(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """The lesson as slides of one idea each, with speaker notes: every markdown block
    (:func:`md_blocks`) and every code cell is a slide of its own (a ``#``/``##`` heading starts a
    new section, the rest stack under it); a block over :data:`SLIDE_WORDS` words shows its first
    sentence and its equations (:func:`_shown`), and goes whole into the slide's speaker notes.
    Cells that carry ``slideshow`` metadata keep it; the parameters cells are skipped."""
    cells = []
    for cell in nb.cells:
        own = cell.get("metadata", {}).get("slideshow", {}).get("slide_type")
        tags = set(cell.get("metadata", {}).get("tags", []))
        if own or tags & SKIP_TAGS:
            kind = own or "skip"
            cells.append(nbformat.from_dict({**cell, "metadata": {**cell.metadata, "slideshow": {"slide_type": kind}}}))
            continue
        if cell.cell_type == "code":
            cells += _code_slides(cell)
            continue
        for block in md_blocks(cell.source):
            m = re.match(r"(#{1,6}) ", block)
            kind = "slide" if m and len(m.group(1)) <= 2 else "subslide"
            long = _words(block) > SLIDE_WORDS
            cells.append(nbformat.v4.new_markdown_cell(_shown(block) if long else block,
                                                       metadata={"slideshow": {"slide_type": kind}}))
            if long:
                cells.append(nbformat.v4.new_markdown_cell(block, metadata={"slideshow": {"slide_type": "notes"}}))
    if cells and cells[0].metadata["slideshow"]["slide_type"] in ("subslide", "-"):
        cells[0].metadata["slideshow"]["slide_type"] = "slide"
    for i, c in enumerate(cells):
        c["id"] = f"slide-{i}"
    return nbformat.v4.new_notebook(cells=cells, metadata=nb.metadata)


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
.reveal .MathJax_CHTML_Display, .reveal .MJXc-display { overflow-x: auto; overflow-y: hidden; }
.reveal .slides section { font-size: 0.75em; }
.reveal .slides section pre, .reveal .slides section table { font-size: 0.8em !important; }
.reveal .slides section pre *, .reveal .slides section table * { font-size: inherit !important; }
.reveal .slides section img { max-height: 540px !important; max-width: 100% !important; width: auto !important;
  height: auto !important; }
.reveal .slides section.acetools-scroll { height: 700px; overflow-y: auto; }</style>
"""

#: Put at the end of each slide page's body: once reveal.js is ready and MathJax has typeset the
#: slides, a slide whose content is taller or wider than the 1280 × 720 slide gets a smaller font,
#: in steps, down to half, so that it shows whole; a slide still too tall (a long table) scrolls
#: inside its 720 px. ``window.acetoolsReveal`` is the deck's reveal.js.
SLIDES_FOOT = """<script>
require(["reveal.js/dist/reveal.js"], function (Reveal) {
  window.acetoolsReveal = Reveal;
  function fit() {
    var W = Reveal.getConfig().width, H = Reveal.getConfig().height;
    Reveal.getSlides().forEach(function (s) {
      var stack = s.parentNode.tagName === 'SECTION' ? s.parentNode : null;  // a hidden stack hides its slides
      var shown = s.style.display, stackShown = stack && stack.style.display, size = 100;
      s.style.display = 'block';
      if (stack) { stack.style.display = 'block'; }
      while ((s.scrollHeight > H || s.scrollWidth > W) && size > 50) { size -= 5; s.style.fontSize = size + '%'; }
      if (s.scrollHeight > H) { s.classList.add('acetools-scroll'); }  // still too tall: it scrolls
      s.style.display = shown;
      if (stack) { stack.style.display = stackShown; }
    });
    Reveal.layout();
    document.body.setAttribute('data-acetools-fit', 'done');
  }
  function afterMaths() { if (window.MathJax && MathJax.Hub) { MathJax.Hub.Queue(fit); } else { fit(); } }
  if (Reveal.isReady()) { afterMaths(); } else { Reveal.on('ready', afterMaths); }
});
</script>
"""


#: The site's own style sheet: a display equation wider than the text scrolls inside it (the theme let
#: it run under the margin), long code and output lines scroll or wrap as in the reports.
SITE_CSS = """.MJXc-display, .MathJax_Display, div.math { max-width: 100%; overflow-x: auto; overflow-y: hidden; }
div.highlight pre { overflow-x: auto; }
div.cell_output pre { white-space: pre-wrap; overflow-wrap: anywhere; }
"""


def _offline(html: str) -> str:
    """The slide page without the template's mermaid import (a CDN module; the lessons draw no
    mermaid diagrams), with :data:`SLIDES_HEAD` at the top of its head."""
    html = re.sub(r'<script type="module">\s*import mermaid from [^<]*</script>', "", html)
    head, _, tail = html.rpartition("</body>")
    html = head + SLIDES_FOOT + "</body>" + tail if head else html
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
    markdown = []
    for p in lessons:
        nb = nbformat.read(str(p), as_version=4)
        markdown += [c.source for c in nb.cells if c.cell_type == "markdown"]
        nbformat.write(_for_book(nb), str(book / p.name))
    (book / "index.md").write_text(_index_page(lessons, profile, timings))
    reference = copy_docs(linked_docs("\n".join(markdown)), book)
    toc = {"format": "jb-book", "root": "index", "parts": [
        {"caption": "Lessons", "chapters": [{"file": p.stem} for p in lessons]},
        *([{"caption": "Reference", "chapters": [{"file": f} for f in reference]}] if reference else [])]}
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
            "html_css_files": ["acetools.css"],  # wide equations and outputs scroll inside the page (SITE_CSS)
            "nb_ipywidgets_js": {},  # no widget manager from a CDN
            "suppress_warnings": ["mystnb.unknown_mime_type", "myst.header"],
            "myst_heading_anchors": 6,  # GitHub's anchors, as the lessons' links to docs/ name them
        }},
    }
    (book / "_config.yml").write_text(json.dumps(config, indent=1))
    copy_mathjax(book / "_vendor" / "mathjax")  # served as _static/mathjax/
    (book / "_vendor" / "acetools.css").write_text(SITE_CSS)
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
    from traitlets.config import Config

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
                              exclude_input_prompt=True, exclude_output_prompt=True, reveal_scroll=False,
                              reveal_width="1280", reveal_height="720", config=Config(
                                  {"TagRemovePreprocessor": {"enabled": True, "remove_input_tags": {"hide-input"}}}))
    pages = []
    for p in lessons:
        nb = one_idea_slides(_for_pages(nbformat.read(str(p), as_version=4)))
        for cell, kind in zip(nb.cells, slide_types(nb)):
            cell.metadata["slideshow"] = {"slide_type": kind}
        body, _ = exporter.from_notebook_node(nb, resources={"metadata": {"name": title_of(nb, p.stem)}})
        page = slides / f"{p.stem}.slides.html"
        soup = BeautifulSoup(_offline(body), features="html.parser")
        link_docs(soup, REPO / "notebooks", slides, "docs/")  # the docs pages, rendered beside the slides
        page.write_text(str(soup))
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
