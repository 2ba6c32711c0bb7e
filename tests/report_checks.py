"""The tests' checks of a rendered lesson page (``acetools report``'s output), docs/style.md §13.

The runner is the library's, :mod:`acetools.notebooks` (:func:`~acetools.notebooks.run_report`,
parameter checks, HTML rendering); this module adds what a reader must be able to trust on a page:
:func:`check_html` (no NaN cells, tracebacks, raw reprs; a lesson shows its code, docs/style.md §13),
:func:`check_rendered` (maths typeset, tables within the page, in headless Chromium) and
:func:`check_report` (both, and the figures' overlapping text).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

__all__ = ["check_html", "equation_code_spans", "mathjax_url", "find_chromium", "chromium_layout",
           "check_rendered", "check_report", "figure_problems", "screenshot", "CHROMIUM_FLAGS", "code_problems",
           "rendered_code_cells", "rendered_dom", "dead_links", "slide_overflows"]


#: What a rendered report must not contain (:func:`check_html`), as regular expressions on its
#: text: a missing value printed as NaN, nbconvert's default alt text, a raw dict or list repr
#: printed by a cell (``{8: 1.05…}``), a traceback.
_BAD = {
    "NaN cell": re.compile(r"<t[dh][^>]*>\s*(?:NaN|nan|None|<NA>)\s*</t[dh]>"),
    "default alt text": re.compile(r"No description has been provided for this image"),
    "raw dict repr": re.compile(r"\{(?:-?\d+|'[^']*'): [^}]*\}"),
    "traceback": re.compile(r"Traceback \(most recent call last\)|[A-Za-z]+Error: |jp-OutputArea-output[^>]*"
                            r"application/vnd\.jupyter\.stderr"),
}
#: A Python list or numpy array printed as such (``['a', 'b']``, ``[2]``, ``[1.14 1.05]``), in printed output.
_ITEM = r"(?:&#x27;[^&]*&#x27;|'[^']*'|-?\d+(?:\.\d+)?(?:e-?\d+)?)"
_LIST_REPR = re.compile(rf"\[{_ITEM}(?:,? +{_ITEM})*\]")
#: A verdict line as :func:`acetools_course.claims.show` renders it, and as plain text.
_VERDICT_LINE = re.compile(r"</strong> · <code>([a-z0-9_]+\.[a-z0-9_]+)</code>:")
_VERDICT_TEXT = re.compile(r"\[(?:reproduced|partly|not reproduced|undecidable here|not testable here)\] "
                           r"([a-z0-9_]+\.[a-z0-9_]+):")


#: Characters that make a code span an equation rather than a name in code.
_MATH_CHARS = set("ΣΔτγσλμηθαβεπ∑‖ᵀ⁻¹²³√≈∝≤≥×·∈→⊤ΘΛΓ∞∂∫")
#: ASCII spellings of maths: ``sum_t``, ``^-1``, ``^T``, ``||x||``, ``f(x) / g``, ``a = b / c``.
_MATH_ASCII = re.compile(r"\bsum_[a-z]\b|\^-?1\b|\^T\b|\|\||\)\^|"
                         r"\b(?:Var|Mean|Tr|Cov|log|mean)_?[a-z]?\(.*\)\s*[/=*]|\s=\s.*[/*^()]")


def equation_code_spans(markdown: str) -> list[str]:
    """The code spans of a notebook's markdown that are equations, not names in code
    (docs/style.md: equations are typeset, ``$…$`` / ``$$…$$``; code spans hold code). A span is
    an equation when it holds a Greek letter or a maths sign (Σ, ∑, ‖, ᵀ, ², ≈, …) or an ASCII
    spelling of maths (``sum_t``, ``^-1``, ``^T``, ``||x||``, ``a = b / c``). Fenced code blocks
    and LaTeX are not looked at."""
    md = re.sub(r"```.*?```", "", markdown, flags=re.S)
    md = re.sub(r"\$\$.*?\$\$|\$[^$\n]+\$", "", md, flags=re.S)
    spans = re.findall(r"(?<!`)`([^`\n]+)`(?!`)", md)
    return [t for t in spans if any(c in _MATH_CHARS for c in t) or _MATH_ASCII.search(t)]


def mathjax_url() -> str | None:
    """The local MathJax of the HTML reports (:func:`acetools.utils.local_mathjax_url`), or None."""
    from acetools.utils import local_mathjax_url

    return local_mathjax_url()


#: The flags of every headless Chromium run (no network, no updates, no first-run dialogs).
CHROMIUM_FLAGS: tuple[str, ...] = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                                   "--disable-component-update", "--no-first-run", "--hide-scrollbars",
                                   "--allow-file-access-from-files")


def find_chromium() -> str | None:
    """The headless browser used to check reports (Debian ``chromium``), or None."""
    import shutil

    for name in (os.environ.get("ACETOOLS_CHROMIUM", ""), "chromium", "chromium-browser", "google-chrome"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


#: Injected into a copy of a report: after MathJax has typeset the page, write what the layout
#: check needs into <pre id="acetools-layout">: the maths elements MathJax rendered and the
#: raw TeX left, and every table wider than the page.
_LAYOUT_JS = r"""
<script>
function acetoolsLayout() {
  var page = document.documentElement.clientWidth;
  var body = document.body.innerText;
  var raw = (body.match(/\$\$[^$]+\$\$/g) || []).length + (body.match(/\\(?:frac|sum|tag|hat|tilde)\b/g) || []).length;
  var rendered = document.querySelectorAll('.MathJax_CHTML, .MathJax, mjx-container').length;
  var errors = document.querySelectorAll('.MathJax_Error, .mjx-merror, merror').length;
  var wide = [];
  document.querySelectorAll('table').forEach(function (t, i) {
    var w = Math.max(t.getBoundingClientRect().width, t.scrollWidth);
    var scrolls = t.scrollWidth > t.clientWidth + 1;  // display:block tables scroll inside the page
    if (w > page + 1 || scrolls) { wide.push([i, Math.round(w), (t.innerText || '').slice(0, 60)]); }
  });
  var cut = [];  // equations, code and outputs wider than the page, or overflowing a box that does not scroll
  var boxes = 'pre, div.highlight, .MJXc-display, .MathJax_Display, .math, mjx-container, .jp-OutputArea-output, ' +
              '.jp-InputArea-editor, .cell_output, .cell_input, img';
  document.querySelectorAll(boxes).forEach(function (e) {
    var r = e.getBoundingClientRect(), ox = getComputedStyle(e).overflowX;
    if (r.width === 0 || e.closest('#acetools-layout')) { return; }
    var box = getComputedStyle(e).display !== 'inline';  // an inline element has no width of its own
    var spills = box && e.scrollWidth > e.clientWidth + 1 && ox !== 'auto' && ox !== 'scroll';
    if (r.right > page + 1 || spills) {
      cut.push([e.tagName.toLowerCase() + '.' + (e.className || '').toString().split(' ')[0], Math.round(r.right),
                Math.round(e.scrollWidth), (e.innerText || '').slice(0, 50)]);
    }
  });
  var out = document.createElement('pre');
  out.id = 'acetools-layout';
  out.textContent = JSON.stringify({page: page, rendered: rendered, raw: raw, errors: errors, wide: wide, cut: cut,
                                    scroll: document.documentElement.scrollWidth});
  document.body.appendChild(out);
}
var acetoolsDone = false;
function acetoolsOnce() { if (!acetoolsDone) { acetoolsDone = true; acetoolsLayout(); } }
function acetoolsWait(tries) {  // after MathJax's typesetting where the page has MathJax (loaded late on a site)
  if (window.MathJax && MathJax.Hub && MathJax.Hub.Queue) { MathJax.Hub.Queue(acetoolsOnce); }
  else if (tries > 0) { setTimeout(function () { acetoolsWait(tries - 1); }, 250); }
  else { acetoolsOnce(); }
}
window.addEventListener('load', function () { acetoolsWait(40); setTimeout(acetoolsOnce, 40000); });
</script>
"""


def chromium_layout(html: str | os.PathLike, *, width: int = 1280, timeout: float = 120.0) -> dict[str, Any]:
    """Render ``html`` in headless Chromium at ``width`` px (:data:`CHROMIUM_FLAGS`) and return
    what :data:`_LAYOUT_JS` measured: ``page`` (px), ``rendered`` (maths elements MathJax
    produced), ``raw`` (TeX left untypeset), ``errors`` (MathJax errors), ``wide`` (tables wider
    than the page: index, width, first text). Raises ``RuntimeError`` without a browser."""
    return _probe(html, _LAYOUT_JS, "acetools-layout", "acetools-probe", (width, 1000), 60000, timeout,
                  "did not lay out")


def _probe(page: str | os.PathLike, js: str, marker: str, prefix: str, size: tuple[int, int], budget: int,
           timeout: float, failed: str) -> Any:
    """Open ``page`` with the script ``js`` before its ``</body>`` in headless Chromium at ``size`` (a copy
    beside the page, so that its relative links resolve, removed after) and return the JSON the script left in
    ``<pre id="marker">``; a ``RuntimeError`` saying Chromium ``failed`` when it left none."""
    import html as _html
    import json as _json
    import subprocess
    import tempfile

    exe = find_chromium()
    if exe is None:
        raise RuntimeError("no headless Chromium: install Debian's `chromium` (scripts/setup.sh does)")
    src = Path(page).read_text()
    head, body, tail = src.rpartition("</body>")
    probe = Path(page).resolve().parent / f".{prefix}-{os.getpid()}-{Path(page).name}"
    with tempfile.TemporaryDirectory() as tmp:
        probe.write_text(head + js + body + tail if body else src + js)
        cmd = [exe, *CHROMIUM_FLAGS, f"--window-size={size[0]},{size[1]}", f"--virtual-time-budget={budget}",
               f"--user-data-dir={tmp}/profile", "--dump-dom", probe.as_uri()]
        try:
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        finally:
            probe.unlink(missing_ok=True)
    m = re.search(rf'<pre id="{marker}"[^>]*>(.*?)</pre>', out.stdout, flags=re.S)
    if not m:
        raise RuntimeError(f"Chromium {failed} {page}: {out.stderr[-400:]}")
    return _json.loads(_html.unescape(m.group(1)))


def screenshot(html: str | os.PathLike, png: str | os.PathLike, *, width: int = 1280, height: int = 900,
               timeout: float = 120.0) -> Path:
    """A PNG of ``html`` as headless Chromium shows it at ``width`` × ``height`` px, after
    MathJax has typeset it (docs/rendered_equation.png is one)."""
    import subprocess
    import tempfile

    exe = find_chromium()
    if exe is None:
        raise RuntimeError("no headless Chromium: install Debian's `chromium` (scripts/setup.sh does)")
    png = Path(png).resolve()
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [exe, *CHROMIUM_FLAGS, f"--window-size={width},{height}", "--virtual-time-budget=60000",
               f"--user-data-dir={tmp}/profile", f"--screenshot={png}", Path(html).resolve().as_uri()]
        subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=True)
    return png


def check_rendered(path: str | os.PathLike, *, width: int = 1280) -> list[str]:
    """What a reader at ``width`` px would see wrong in a rendered report (``[]``: none): maths
    that MathJax did not typeset (raw TeX left, MathJax errors, or TeX in the page with no
    typeset element), tables wider than the page, and equations, code or outputs that run past
    the page or out of a box that does not scroll (cut) instead of wrapping or scrolling."""
    lay = chromium_layout(path, width=width)
    name = Path(path).name
    problems = []
    if lay["raw"] or lay["errors"]:
        problems.append(f"{name}: maths not rendered ({lay['raw']} raw TeX, {lay['errors']} MathJax errors)")
    for i, w, text in lay["wide"]:
        problems.append(f"{name}: table {i} is {w} px wide, wider than the page ({lay['page']} px) or its box: "
                        f"{text!r}")
    for what, right, content, text in lay.get("cut", []):
        problems.append(f"{name}: {what} ends at {right} px (content {content} px), cut or past the page "
                        f"({lay['page']} px) instead of wrapping or scrolling: {text!r}")
    if lay.get("scroll", 0) > lay["page"] + 1:
        problems.append(f"{name}: the page is {lay['scroll']} px wide, wider than the window ({lay['page']} px)")
    return problems


def figure_problems(folder: str | os.PathLike) -> list[str]:
    """The figures of ``folder`` with overlapping text, as :func:`acetools.plotting.save_figure`
    listed them in the folder's ``figures.json`` (``[]``: none, or no record)."""
    import json as _json

    path = Path(folder) / "figures.json"
    if not path.is_file():
        return []
    got = _json.loads(path.read_text()).get("text_overlaps", {})
    return [f"{Path(folder).name}/{name}.png: text overprints text ({len(pairs)}×, e.g. {pairs[0]})"
            for name, pairs in sorted(got.items())]


def check_report(html: str | os.PathLike, figures_dir: str | os.PathLike | None = None, *,
                 browser: bool | None = None) -> list[str]:
    """Everything a reader could not trust on a report page: :func:`check_html`, the figures
    of ``figures_dir`` with overlapping text (:func:`figure_problems`) and, in headless
    Chromium (``browser=None``: when one is installed), maths that did not render and tables
    wider than the page (:func:`check_rendered`)."""
    problems = check_html(html)
    if figures_dir is not None:
        problems += figure_problems(figures_dir)
    if browser or (browser is None and find_chromium() is not None and mathjax_url() is not None):
        problems += check_rendered(html)
    return problems


def check_html(path: str | os.PathLike) -> list[str]:
    """What a reader could not trust in a rendered report: one message per problem (``[]``:
    none). Checks for ``NaN`` (or ``None``) table cells, the default alt text of a figure, raw
    dict reprs, list or array reprs in printed output, tracebacks and error output, a claim's
    verdict shown more than once and, when the executed notebook lies next to the page, a lesson
    shown without its code (:func:`code_problems`)."""
    html = Path(path).read_text()
    # the embedded figures are base64: leave them out of the text checks
    text = re.sub(r'src="data:image/[^"]*"', 'src=""', html)
    text = re.sub(r"<style.*?</style>|<script.*?</script>", "", text, flags=re.S)
    problems = []
    for what, pat in _BAD.items():
        hits = pat.findall(text)
        if hits:
            problems.append(f"{Path(path).name}: {what} ×{len(hits)}: {str(hits[0])[:80]!r}")
    pre = "\n".join(re.findall(r"<pre[^>]*>(.*?)</pre>", text, flags=re.S))  # printed output
    lists = _LIST_REPR.findall(pre)
    if lists:
        problems.append(f"{Path(path).name}: raw list or array repr ×{len(lists)}: {lists[0][:80]!r}")
    ids = _VERDICT_LINE.findall(text) + _VERDICT_TEXT.findall(text)
    twice = sorted({i for i in ids if ids.count(i) > 1})
    if twice:
        problems.append(f"{Path(path).name}: verdict shown more than once: {twice}")
    executed = Path(path).with_suffix(".ipynb")  # render_html writes the page next to its executed notebook
    if executed.is_file():
        problems += code_problems(executed, html)
    return problems


#: Prose that points at code: it needs that code shown on the page.
_POINTS_AT_CODE = re.compile(r"\b(?:here (?:is|are) the (?:\w+ )?(?:code|cells?|functions?|lines?|calls?)|"
                             r"the (?:code|cell)s? (?:below|above)|the (?:next|following) (?:code )?cells?|this cell|"
                             r"in the code below)\b", re.I)


def rendered_code_cells(html: str) -> tuple[int, int]:
    """``(with input, all)``: the code cells of a rendered page that show their input, and all of them."""
    from bs4 import BeautifulSoup

    cells = BeautifulSoup(html, features="html.parser").select("div.jp-CodeCell")
    return sum(1 for c in cells if c.select_one(".jp-InputArea-editor") is not None), len(cells)


def code_problems(executed: str | os.PathLike, html: str) -> list[str]:
    """What a reader of a rendered lesson would miss of its code (``[]``: nothing), from the executed
    notebook and its page ``html`` (docs/style.md §13: lessons render with their code; only cells tagged
    ``hide-input``, setup and plotting, may hide it). A lesson whose page shows fewer inputs than it has
    untagged code cells, and prose that points at code ("the cell below", "here is the code") where
    the next code cell's input is not on the page, are problems."""
    import nbformat

    from acetools.notebooks import HIDE_INPUT, shows_code

    nb = nbformat.read(str(executed), as_version=4)
    name = Path(executed).with_suffix(".html").name
    lesson = shows_code(nb)

    def hidden(cell) -> bool:
        return not lesson or HIDE_INPUT in cell.get("metadata", {}).get("tags", [])

    code = [c for c in nb.cells if c.cell_type == "code"]
    own = [c for c in code if not hidden(c)]
    shown, total = rendered_code_cells(html)
    problems = []
    if lesson and own and shown == 0:
        problems.append(f"{name}: a lesson rendered without its code ({len(own)} code cells, none shown)")
    elif lesson and shown < len(own):
        problems.append(f"{name}: {len(own) - shown} of the lesson's {len(own)} code cells rendered without input")
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "markdown":
            continue
        m = _POINTS_AT_CODE.search(re.sub(r"```.*?```", "", cell.source, flags=re.S))
        if not m:
            continue
        after = [c for c in nb.cells[i + 1:] if c.cell_type == "code"][:1]
        before = [c for c in nb.cells[:i] if c.cell_type == "code"][-1:]
        target = before if "above" in m.group(0).lower() else after
        if not target or hidden(target[0]):
            problems.append(f"{name}: prose points at code that is not shown: {m.group(0)!r} "
                            f"({cell.source.strip().splitlines()[0][:60]!r})")
    return problems




def rendered_dom(page: str | os.PathLike, *, width: int = 1280, timeout: float = 180.0) -> str:
    """The DOM of ``page`` after headless Chromium has run its scripts (``--dump-dom``)."""
    import subprocess
    import tempfile

    exe = find_chromium()
    if exe is None:
        raise RuntimeError("no headless Chromium: install Debian's `chromium` (scripts/setup.sh does)")
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [exe, *CHROMIUM_FLAGS, f"--window-size={width},1000", "--virtual-time-budget=30000",
               f"--user-data-dir={tmp}/profile", "--dump-dom", Path(page).resolve().as_uri()]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout).stdout


def dead_links(page: str | os.PathLike, pattern: str = r"docs/", within: str = "body") -> tuple[list[str], list[str]]:
    """``(links, dead)``: the links in ``page``'s element ``within`` (a CSS selector: ``article`` for
    a site page's text, not its menus) whose URL matches ``pattern``, and those of them whose target
    file is missing or lacks the element the anchor names, in headless Chromium's DOM. Each target
    page is opened in Chromium once."""
    from urllib.parse import unquote, urlparse

    from bs4 import BeautifulSoup

    base = Path(page).resolve()
    links = []
    root = BeautifulSoup(rendered_dom(base), features="html.parser").select_one(within)
    for a in root.find_all("a", href=True) if root is not None else []:
        href = str(a["href"])
        if re.search(pattern, href) and not href.startswith(("http:", "https:")):
            url = urlparse(href if href.startswith("file:") else (base.parent / href.split("#")[0]).as_uri()
                           + ("#" + href.split("#", 1)[1] if "#" in href else ""))
            links.append((Path(unquote(url.path)), url.fragment, href))
    dead, ids = [], {}
    for target, anchor, href in links:
        if not target.is_file():
            dead.append(f"{base.name}: {href} -> no file {target}")
            continue
        if anchor and target not in ids:
            dom = BeautifulSoup(rendered_dom(target), features="html.parser")
            ids[target] = {str(el.get("id")) for el in dom.find_all(id=True)}
        if anchor and anchor not in ids[target]:
            dead.append(f"{base.name}: {href} -> {target.name} has no element #{anchor}")
    return [h for _, _, h in links], dead


#: Injected into a copy of a slide deck (scripts/build_site.py): once the deck has fitted its slides,
#: show every slide in turn at the window's size and list those whose content is taller or wider
#: than the slide (cut at its edge; a slide that scrolls within its height is not), with the deck's
#: slide and speaker-note counts.
_SLIDES_JS = r"""
<script>
function acetoolsSlides() {
  if (document.body.getAttribute('data-acetools-fit') !== 'done' || !window.acetoolsReveal) {
    setTimeout(acetoolsSlides, 200); return;
  }
  var R = window.acetoolsReveal, W = R.getConfig().width, H = R.getConfig().height, cut = [];
  var slides = R.getSlides();
  slides.forEach(function (s, i) {
    var at = R.getIndices(s);
    R.slide(at.h, at.v);
    var st = getComputedStyle(s), scrollsY = st.overflowY === 'auto' || st.overflowY === 'scroll';
    var tall = scrollsY ? s.clientHeight > H + 1 : s.scrollHeight > H + 1;  // a slide that scrolls is not cut
    if (tall || s.scrollWidth > W + 1) {
      cut.push([i, s.scrollWidth, s.scrollHeight, (s.innerText || '').trim().slice(0, 60)]);
    }
  });
  var out = document.createElement('pre');
  out.id = 'acetools-slides';
  out.textContent = JSON.stringify({width: W, height: H, slides: slides.length, cut: cut,
                                    notes: document.querySelectorAll('aside.notes').length});
  document.body.appendChild(out);
}
window.addEventListener('load', function () { setTimeout(acetoolsSlides, 0); });
</script>
"""


def slide_overflows(deck: str | os.PathLike, *, width: int = 1280, height: int = 720,
                    timeout: float = 300.0) -> dict[str, Any]:
    """Show every slide of a reveal.js ``deck`` in headless Chromium at ``width`` × ``height`` and
    return ``{"slides", "notes", "width", "height", "cut"}``: ``cut`` lists the slides whose content
    is taller or wider than the slide (index, content width, content height, first text)."""
    return _probe(deck, _SLIDES_JS, "acetools-slides", "acetools-slides", (width, height), 120000, timeout,
                  "did not show the slides of")
