"""Run the course notebooks as parameterised reports (``acetools report``).

Each notebook in ``notebooks/`` (``NN_name.ipynb``) is executed with papermill into a
build folder — never in place (docs/style.md §13) — with explicit ``cwd`` and ``kernel_name``, then
rendered to HTML without code cells (``nbconvert --no-input``). Figures go to
``<figures>/<notebook-stem>/``: the repository's ``figures/`` for the full profile, the
build folder for the quick one (so a quick run never overwrites the committed figures).

Profiles:

* ``quick`` — every notebook on the fixture world (``quick=True``); what CI runs.
* ``full`` — the notebooks' own defaults (the mini-world at size ``small``).

Parameters a notebook does not declare are an error, not a warning (docs/style.md §13).
"""

from __future__ import annotations

import ast
import logging
import os
import re
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "PROFILES",
    "REPO",
    "notebook_paths",
    "notebook_parameters",
    "parse_parameter",
    "check_parameters",
    "coerce_parameter",
    "ParameterTypeError",
    "run_notebook",
    "run_report",
    "UnknownParameterError",
    "render_html",
    "check_html",
    "equation_code_spans",
    "mathjax_url",
    "find_chromium",
    "chromium_layout",
    "check_rendered",
    "check_report",
    "figure_problems",
    "screenshot",
    "CHROMIUM_FLAGS",
]

log = logging.getLogger(__name__)

#: The repository root (the parent of the ``acetools`` package).
REPO = Path(__file__).resolve().parents[2]
#: Parameter overrides per profile.
PROFILES: dict[str, dict[str, Any]] = {"quick": {"quick": True}, "full": {}}


class UnknownParameterError(ValueError):
    """A parameter was passed that the notebook's ``parameters`` cell does not declare."""


class ParameterTypeError(ValueError):
    """A parameter value does not match the type annotated in the notebook's ``parameters`` cell."""


def notebook_paths(folder: str | os.PathLike | None = None, only: Sequence[str] | None = None) -> list[Path]:
    """The course notebooks (``NN_*.ipynb``) in order; ``only`` selects by stem, number or
    name (``"02"``, ``"02_ace_step_by_step"``, ``"ace_step_by_step"``)."""
    folder = Path(folder) if folder is not None else REPO / "notebooks"
    if not folder.is_dir():
        raise FileNotFoundError(f"no notebooks folder at {folder}; run from a clone of the acetools repository "
                                "or pass --notebooks DIR")
    paths = sorted(p for p in folder.glob("[0-9][0-9]_*.ipynb") if not p.name.startswith("."))
    if not only:
        return paths
    chosen = []
    for name in only:
        hits = [p for p in paths if name in (p.stem, p.stem[:2], p.stem[3:])]
        if not hits:
            raise ValueError(f"no notebook matches {name!r}; notebooks: {[p.stem for p in paths]}")
        chosen += [p for p in hits if p not in chosen]
    return chosen


def notebook_parameters(path: str | os.PathLike) -> dict[str, dict]:
    """The declared parameters of a notebook (papermill's inspection of its ``parameters`` cell)."""
    import papermill as pm

    return dict(pm.inspect_notebook(str(path)))


def parse_parameter(text: str, *, literal: bool = True) -> tuple[str, Any]:
    """``"KEY=VALUE"`` -> ``(key, value)``; the value is a Python literal when it parses as one
    (``3``, ``0.5``, ``True``, ``[1, 2]``), else the string. ``literal=False`` keeps the
    value's text (for :func:`check_parameters`, which parses it by the declared type)."""
    if "=" not in text:
        raise ValueError(f"parameter {text!r} must look like KEY=VALUE")
    key, raw = text.split("=", 1)
    key = key.strip()
    if not key.isidentifier():
        raise ValueError(f"parameter name {key!r} is not a Python identifier")
    if not literal:
        return key, raw
    try:
        value = ast.literal_eval(raw)
    except (ValueError, SyntaxError):
        value = raw
    return key, value


_TYPES: dict[str, tuple[type, ...]] = {"bool": (bool,), "int": (int,), "float": (float, int), "str": (str,),
                                       "list": (list, tuple), "tuple": (tuple, list), "dict": (dict,),
                                       "None": (type(None),)}


def _declared_types(type_name: str | None) -> list[str] | None:
    """``"int"`` -> ``["int"]``; ``"int | None"`` / ``"Optional[int]"`` -> ``["int", "None"]``;
    ``None`` for annotations it cannot check (then any literal passes); papermill reports an
    unannotated parameter as ``"None"``."""
    if not type_name or type_name == "None":
        return None
    t = type_name.replace(" ", "")
    if t.startswith("Optional[") and t.endswith("]"):
        t = t[len("Optional["):-1] + "|None"
    names = [n.split("[", 1)[0] for n in t.split("|")]
    names = ["list" if n == "List" else "tuple" if n == "Tuple" else "dict" if n == "Dict" else n for n in names]
    return names if all(n in _TYPES for n in names) else None


def coerce_parameter(name: str, value: Any, info: Mapping[str, Any], notebook: str = "the notebook") -> Any:
    """``value`` for parameter ``name`` checked against its declaration ``info`` (an entry of
    :func:`notebook_parameters`: ``inferred_type_name``, ``default``). A string is parsed as
    a Python literal unless the parameter is a ``str``; an ``int`` for a ``float`` becomes a
    float; ``list`` elements must have the types of the default's elements. Raises
    :class:`ParameterTypeError` naming the parameter, the notebook and the expected type."""
    kinds = _declared_types(info.get("inferred_type_name"))
    text = value if isinstance(value, str) else None
    if text is not None and not (kinds and "str" in kinds):
        try:
            value = ast.literal_eval(text.strip())
        except (ValueError, SyntaxError):
            value = text
    if kinds is None:
        return value
    want = " | ".join(kinds)
    default = info.get("default")

    def bad(extra: str = "") -> ParameterTypeError:
        shown = text if text is not None else repr(value)
        return ParameterTypeError(f"parameter {name!r} of {notebook} expects {want} (default {default}), "
                                  f"got {shown!r}{extra}")

    ok = [k for k in kinds if isinstance(value, _TYPES[k]) and not (k in ("int", "float") and isinstance(value, bool))]
    if not ok:
        hint = " (use True or False)" if "bool" in kinds else ""
        if "list" in kinds and isinstance(value, str):
            hint = " (write a Python list, e.g. -p 'name=[\"a\", \"b\"]')"
        raise bad(hint)
    if ok[0] == "float" and isinstance(value, int):
        value = float(value)
    if ok[0] in ("list", "tuple"):
        value = list(value) if ok[0] == "list" else tuple(value)
        try:
            ref = ast.literal_eval(default) if isinstance(default, str) else default
        except (ValueError, SyntaxError):
            ref = None
        elem = {type(v) for v in ref} if isinstance(ref, (list, tuple)) and ref else set()
        if len(elem) == 1:
            (et,) = elem
            accept = (float, int) if et is float else (et,)
            wrong = [v for v in value if not isinstance(v, accept) or (et is not bool and isinstance(v, bool))]
            if wrong:
                raise bad(f" (elements must be {et.__name__}; {wrong[0]!r} is not)")
            if et is float:
                value = type(value)(float(v) for v in value)
    return value


def _known_values() -> dict[str, tuple[str, list[str]]]:
    """Parameters whose values come from a library registry: name -> (what, allowed names).
    A list parameter's elements are checked one by one."""
    from ..world.vision.data import SUITES
    from ..merging import METHODS
    from ..world.vision.models import SIZES

    suites, sizes, methods = list(SUITES), list(SIZES), list(METHODS)
    return {"suite": ("suite", suites), "suites": ("suite", suites), "ablation_suites": ("suite", suites),
            "size": ("size", sizes), "sweep_method": ("method", methods)}


def _check_known_value(name: str, value: Any, notebook: str) -> None:
    known = _known_values().get(name)
    if known is None:
        return
    what, allowed = known
    for v in value if isinstance(value, (list, tuple)) else [value]:
        if isinstance(v, str) and v not in allowed:
            raise ParameterTypeError(f"parameter {name!r} of {notebook}: unknown {what} {v!r}; {what}s: {allowed}")


def check_parameters(paths: Sequence[str | os.PathLike], parameters: Mapping[str, Any]) -> dict[str, Any]:
    """Check ``parameters`` against every notebook in ``paths`` before anything runs: each name
    must be declared by each notebook (:class:`UnknownParameterError`) and each value must
    match its annotation (:func:`coerce_parameter`; :class:`ParameterTypeError`) and, for the
    suite, size and method parameters, name a registered one. Returns the typed values
    (strings parsed as literals where the parameter is not a ``str``)."""
    out: dict[str, Any] = dict(parameters)
    for path in paths:
        path = Path(path)
        declared = notebook_parameters(path)
        unknown = sorted(set(parameters) - set(declared))
        if unknown:
            raise UnknownParameterError(
                f"{path.stem} has no parameter(s) {unknown}; its parameters are {sorted(declared)}")
        for name, value in parameters.items():
            out[name] = coerce_parameter(name, value, declared[name], path.stem)
            _check_known_value(name, out[name], path.stem)
    return out


def _check_parameters(path: Path, params: Mapping[str, Any]) -> None:
    declared = notebook_parameters(path)
    unknown = sorted(set(params) - set(declared))
    if unknown:
        raise UnknownParameterError(
            f"{path.name} has no parameter(s) {unknown}; its parameters are {sorted(declared)}"
        )


#: Seconds to wait for a notebook kernel to start (see :func:`run_notebook`).
START_TIMEOUT = 300


def run_notebook(path: str | os.PathLike, out_dir: str | os.PathLike, parameters: Mapping[str, Any] | None = None,
                 *, html: bool = True, kernel_name: str = "python3", timeout: int | None = None,
                 start_timeout: int = START_TIMEOUT) -> dict[str, Any]:
    """Execute one notebook with papermill into ``out_dir`` (and render HTML); return a record.

    ``timeout``: seconds one cell may run (``None``: no limit). ``start_timeout``: seconds to
    wait for the kernel to start (papermill's default of 60 s is too short on a loaded
    2-core machine, where importing torch in a fresh kernel can take longer).

    Raises :class:`UnknownParameterError` before running when a parameter is not declared,
    and papermill's ``PapermillExecutionError`` when a cell fails (the partly executed
    notebook is still written to ``out_dir`` for inspection).
    """
    import papermill as pm

    path = Path(path).resolve()
    out_dir = Path(out_dir).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    params = dict(parameters or {})
    _check_parameters(path, params)
    out_nb = out_dir / path.name
    t0 = time.perf_counter()
    # reports are documents: no progress bars in their outputs unless the caller forces them
    old = os.environ.get("ACETOOLS_PROGRESS")
    os.environ.setdefault("ACETOOLS_PROGRESS", "0")
    old_path = os.environ.get("PYTHONPATH")
    # the kernel imports the same acetools as this process (a checkout may differ from the installed one)
    os.environ["PYTHONPATH"] = os.pathsep.join([str(REPO)] + ([old_path] if old_path else []))
    try:
        pm.execute_notebook(str(path), str(out_nb), parameters=params, kernel_name=kernel_name, cwd=str(path.parent),
                            progress_bar=False, log_output=False, execution_timeout=timeout,
                            start_timeout=start_timeout)
    finally:
        if old is None:
            os.environ.pop("ACETOOLS_PROGRESS", None)
        if old_path is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = old_path
    seconds = time.perf_counter() - t0
    rec: dict[str, Any] = {"notebook": path.stem, "seconds": round(seconds, 1), "executed": str(out_nb)}
    if html:
        rec["html"] = str(render_html(out_nb))
    return rec


def _image_alts(nb) -> dict[str, str]:
    """The alt text of every PNG output of an executed notebook, keyed by its base64 data:
    the figure's title (``metadata["image/png"]["alt"]``, set by
    :func:`acetools.course.page.setup`), else the heading of the section it is in."""
    alts: dict[str, str] = {}
    section = nb.metadata.get("title", "") or "the notebook"
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            heads = [ln.lstrip("#").strip() for ln in cell.source.splitlines() if ln.startswith("#")]
            section = heads[-1] if heads else section
            continue
        for out in cell.get("outputs", []):
            data = out.get("data", {})
            if "image/png" in data:
                alt = out.get("metadata", {}).get("image/png", {}).get("alt")
                alts["".join(str(data["image/png"]).split())] = alt or f"Figure of the section {section}"
    return alts


def render_html(executed: str | os.PathLike) -> Path:
    """``jupyter nbconvert --to html --no-input`` of an executed notebook, next to it.

    Three additions make the page readable: every figure's ``<img>`` gets its alt text from the
    figure's title (:func:`_image_alts`; nbconvert's default says "No description has been
    provided"), the CSS :data:`acetools.course.page.REPORT_CSS` lets wide tables scroll
    inside the page and long lines wrap at word boundaries, and the equations are typeset by a
    local MathJax (:func:`mathjax_url`), never one from a CDN; the template's other scripts
    from CDNs (require.js, mermaid; the reports use neither) are dropped, so a page reads the
    same without network.
    """
    import nbformat
    from bs4 import BeautifulSoup
    from nbconvert import HTMLExporter

    from ..utils import atomic_write
    from .page import REPORT_CSS

    executed = Path(executed)
    nb = nbformat.read(str(executed), as_version=4)
    mj = mathjax_url()
    if mj is None:
        raise FileNotFoundError("no local MathJax for the report's equations: install Debian's libjs-mathjax "
                                "(scripts/setup.sh does) or set ACETOOLS_MATHJAX to a MathJax.js; reports never "
                                "load it from a CDN")
    exporter = HTMLExporter(exclude_input=True, exclude_input_prompt=True, exclude_output_prompt=True,
                            mathjax_url=mj)
    body, _ = exporter.from_notebook_node(nb)
    alts = _image_alts(nb)
    soup = BeautifulSoup(body, features="html.parser")
    for img in soup.find_all("img"):
        src = img.get("src", "")
        if src.startswith("data:image/png;base64,"):
            alt = alts.get("".join(src.split(",", 1)[1].split()))
            if alt:
                img["alt"] = alt
    for script in soup.find_all("script"):  # nothing from the network: require.js and mermaid come from CDNs
        if script.get("src", "").startswith(("http://", "https://", "//")) or "cdnjs" in (script.string or ""):
            script.decompose()
    style = soup.new_tag("style")
    style.string = REPORT_CSS
    (soup.head or soup).append(style)
    out = executed.with_suffix(".html")
    with atomic_write(out, "w") as fh:
        fh.write(str(soup))
    return out


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
#: A verdict line as :func:`acetools.course.claims.show` renders it, and as plain text.
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
    from ..utils import local_mathjax_url

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
  var out = document.createElement('pre');
  out.id = 'acetools-layout';
  out.textContent = JSON.stringify({page: page, rendered: rendered, raw: raw, errors: errors, wide: wide});
  document.body.appendChild(out);
}
if (window.MathJax && MathJax.Hub) { MathJax.Hub.Queue(acetoolsLayout); }
else { window.addEventListener('load', function () { setTimeout(acetoolsLayout, 0); }); }
</script>
"""


def chromium_layout(html: str | os.PathLike, *, width: int = 1280, timeout: float = 120.0) -> dict[str, Any]:
    """Render ``html`` in headless Chromium at ``width`` px (:data:`CHROMIUM_FLAGS`) and return
    what :data:`_LAYOUT_JS` measured: ``page`` (px), ``rendered`` (maths elements MathJax
    produced), ``raw`` (TeX left untypeset), ``errors`` (MathJax errors), ``wide`` (tables wider
    than the page: index, width, first text). Raises ``RuntimeError`` without a browser."""
    import json as _json
    import subprocess
    import tempfile

    exe = find_chromium()
    if exe is None:
        raise RuntimeError("no headless Chromium: install Debian's `chromium` (scripts/setup.sh does)")
    src = Path(html).read_text()
    with tempfile.TemporaryDirectory() as tmp:
        probe = Path(tmp) / "probe.html"
        probe.write_text(src.replace("</body>", _LAYOUT_JS + "</body>") if "</body>" in src else src + _LAYOUT_JS)
        cmd = [exe, *CHROMIUM_FLAGS, f"--window-size={width},1000", "--virtual-time-budget=60000",
               f"--user-data-dir={tmp}/profile", "--dump-dom", probe.as_uri()]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    m = re.search(r'<pre id="acetools-layout">(.*?)</pre>', out.stdout, flags=re.S)
    if not m:
        raise RuntimeError(f"Chromium did not lay out {html}: {out.stderr[-400:]}")
    import html as _html

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
    typeset element), and tables wider than the page."""
    lay = chromium_layout(path, width=width)
    name = Path(path).name
    problems = []
    if lay["raw"] or lay["errors"]:
        problems.append(f"{name}: maths not rendered ({lay['raw']} raw TeX, {lay['errors']} MathJax errors)")
    for i, w, text in lay["wide"]:
        problems.append(f"{name}: table {i} is {w} px wide, wider than the page ({lay['page']} px) or its box: "
                        f"{text!r}")
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
    dict reprs, list or array reprs in printed output, tracebacks and error output, and a claim's
    verdict shown more than once."""
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
    return problems


def run_report(profile: str = "quick", *, only: Sequence[str] | None = None,
               parameters: Mapping[str, Any] | None = None, out: str | os.PathLike | None = None,
               figures: str | os.PathLike | None = None, notebooks: str | os.PathLike | None = None,
               html: bool = True, timeout: int | None = None, start_timeout: int = START_TIMEOUT,
               on_result=None) -> list[dict[str, Any]]:
    """Run the course (or ``only`` some notebooks) under ``profile``; return one record each.

    ``out``: build folder (default ``build/report/<profile>`` in the repository).
    ``figures``: figure root (default ``figures/`` for ``full``, ``<out>/figures`` for
    ``quick``); each notebook gets ``figures_dir=<figures>/<stem>``. ``parameters`` apply
    to every notebook selected and must be declared by each. ``timeout`` /
    ``start_timeout``: per cell / kernel start, as in :func:`run_notebook`.
    """
    if profile not in PROFILES:
        raise ValueError(f"unknown profile {profile!r}; profiles: {sorted(PROFILES)}")
    out = Path(out) if out is not None else REPO / "build" / "report" / profile
    if figures is None:
        figures = REPO / "figures" if profile == "full" else out / "figures"
    figures = Path(figures).resolve()
    paths = notebook_paths(notebooks, only)
    parameters = check_parameters(paths, parameters or {})  # every name and type before the first kernel
    records = []
    for path in paths:
        params = {**PROFILES[profile], "figures_dir": str(figures / path.stem), **dict(parameters or {})}
        declared = notebook_parameters(path)
        params = {k: v for k, v in params.items() if k in declared or k in (parameters or {})}
        log.info("running %s (%s profile) into %s", path.stem, profile, out)
        rec = run_notebook(path, out, params, html=html, timeout=timeout, start_timeout=start_timeout)
        rec["profile"] = profile
        records.append(rec)
        if on_result is not None:
            on_result(rec)
    return records
