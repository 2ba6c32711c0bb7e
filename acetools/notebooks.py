"""Run notebooks as parameterised reports: the one papermill runner of acetools (docs/style.md §13).

``acetools report`` (the course, profiles :data:`PROFILES`) and ``acetools diagnose`` run notebooks
with :func:`run_notebook` into a build folder, never in place, and render HTML with
:func:`render_html`. Parameters a notebook does not declare, or of the wrong type, are an error.
"""

from __future__ import annotations

import ast
import functools
import logging
import os
import re
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .errors import InputError

__all__ = ["PROFILES", "REPO", "notebook_paths", "notebook_parameters", "parse_parameter", "check_parameters",
           "coerce_parameter", "ParameterTypeError", "parameter_choices", "run_notebook", "run_report",
           "UnknownParameterError", "render_html", "link_docs", "render_doc_page", "heading_slug",
           "REPORT_CSS", "START_TIMEOUT", "HIDE_INPUT", "shows_code"]

log = logging.getLogger(__name__)

#: The repository root (the parent of the ``acetools`` package).
REPO = Path(__file__).resolve().parents[1]

#: The CSS of every rendered report (``reports/report.css``: wide tables scroll, figures fit the page).
REPORT_CSS = (Path(__file__).parent / "reports" / "report.css").read_text(encoding="utf-8")
#: Parameter overrides per profile.
PROFILES: dict[str, dict[str, Any]] = {"quick": {"quick": True}, "full": {}}


class UnknownParameterError(InputError):
    """A parameter was passed that the notebook's ``parameters`` cell does not declare."""


class ParameterTypeError(InputError):
    """A parameter value does not match the type annotated in the notebook's ``parameters`` cell."""


def notebook_paths(folder: str | os.PathLike | None = None, only: Sequence[str] | None = None) -> list[Path]:
    """The course notebooks (``NN_*.ipynb``) in order; ``only`` selects by stem, number or
    name (``"02"``, ``"02_ace_step_by_step"``, ``"ace_step_by_step"``)."""
    folder = Path(folder) if folder is not None else REPO / "notebooks"
    if not folder.is_dir():
        raise FileNotFoundError(f"no notebooks folder at {folder}; run from a clone of the acetools repository "
                                "or pass --notebooks DIR")
    paths = sorted(folder.glob("[0-9][0-9]_*.ipynb"))
    if not only:
        return paths
    chosen = []
    for name in only:
        hits = [p for p in paths if name in (p.stem, p.stem[:2], p.stem[3:])]
        if not hits:
            raise InputError(f"no notebook matches {name!r}; notebooks: {[p.stem for p in paths]}")
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
        raise InputError(f"parameter {text!r} must look like KEY=VALUE")
    key, raw = text.split("=", 1)
    key = key.strip()
    if not key.isidentifier():
        raise InputError(f"parameter name {key!r} is not a Python identifier")
    return key, _literal(raw, raw) if literal else raw


def _literal(text: str, fallback: Any) -> Any:
    """``text`` as a Python literal (``3``, ``0.5``, ``[1, 2]``), else ``fallback``."""
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return fallback


_TYPES: dict[str, tuple[type, ...]] = {"bool": (bool,), "int": (int,), "float": (float, int), "str": (str,),
                                       "list": (list, tuple), "tuple": (tuple, list), "dict": (dict,),
                                       "None": (type(None),)}


def _declared_types(type_name: str | None) -> list[str] | None:
    """``"int | None"`` / ``"Optional[int]"`` -> ``["int", "None"]``; None where it cannot check."""
    if not type_name or type_name == "None":
        return None
    t = type_name.replace(" ", "")
    if t.startswith("Optional[") and t.endswith("]"):
        t = t[len("Optional["):-1] + "|None"
    names = [n.split("[", 1)[0] for n in t.split("|")]
    names = ["list" if n == "List" else "tuple" if n == "Tuple" else "dict" if n == "Dict" else n for n in names]
    return names if all(n in _TYPES for n in names) else None


def coerce_parameter(name: str, value: Any, info: Mapping[str, Any], notebook: str = "the notebook") -> Any:
    """``value`` checked against its declaration ``info`` (:func:`notebook_parameters`); a string is parsed
    as a literal unless the parameter is a ``str``, list elements take the default's element type.
    :class:`ParameterTypeError` names the parameter, the notebook and the expected type."""
    kinds = _declared_types(info.get("inferred_type_name"))
    text = value if isinstance(value, str) else None
    if text is not None and not (kinds and "str" in kinds):
        value = _literal(text.strip(), text)
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
    if ok[0] in ("list", "tuple") and isinstance(value, (list, tuple)):  # (ok[0]'s types)
        value = list(value) if ok[0] == "list" else tuple(value)
        ref = _literal(default, None) if isinstance(default, str) else default
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


#: A parameter's comment ``one of acetools.<module>.<NAME>`` names the registry of its values (the
#: runner learns them from the notebook and knows no world itself).
_CHOICES = re.compile(r"\bone of (acetools(?:\.[A-Za-z_]\w*)+)")


def parameter_choices(info: Mapping[str, Any], name: str = "parameter", notebook: str = "the notebook"
                      ) -> tuple[str, list[str]] | None:
    """``(what, allowed)`` for a parameter whose comment names its registry (``one of
    acetools.world.vision.data.SUITES`` -> ``("suite", [...])``), else None."""
    import importlib

    m = _CHOICES.search(str(info.get("help") or ""))
    if m is None:
        return None
    module, _, attr = m.group(1).rpartition(".")
    try:
        registry = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError):
        raise InputError(f"parameter {name!r} of {notebook} names {m.group(1)!r}, "
                         "which acetools does not have") from None
    what = attr.lower().removesuffix("s")
    return what, [str(k) for k in registry]


def _check_names(path: Path, params: Mapping[str, Any], declared: Mapping[str, Any]) -> None:
    unknown = sorted(set(params) - set(declared))
    if unknown:
        raise UnknownParameterError(f"{path.stem} has no parameter(s) {unknown}; its parameters are {sorted(declared)}")


def check_parameters(paths: Sequence[str | os.PathLike], parameters: Mapping[str, Any]) -> dict[str, Any]:
    """Check ``parameters`` against every notebook in ``paths`` before anything runs (names declared,
    values typed by :func:`coerce_parameter` and registered where :func:`parameter_choices` says);
    returns the typed values."""
    out: dict[str, Any] = dict(parameters)
    for path in paths:
        path = Path(path)
        declared = notebook_parameters(path)
        _check_names(path, parameters, declared)
        for name, value in parameters.items():
            out[name] = coerce_parameter(name, value, declared[name], path.stem)
            what, allowed = parameter_choices(declared[name], name, path.stem) or ("", None)
            for v in out[name] if isinstance(out[name], (list, tuple)) else [out[name]]:
                if allowed is not None and isinstance(v, str) and v not in allowed:
                    raise ParameterTypeError(f"parameter {name!r} of {path.stem}: unknown {what} {v!r}; "
                                             f"{what}s: {allowed}")
    return out


#: The kernel's matplotlib backend: figures become cell outputs (whatever this process's MPLBACKEND).
INLINE_BACKEND = "module://matplotlib_inline.backend_inline"

#: Seconds to wait for a notebook kernel to start (see :func:`run_notebook`).
START_TIMEOUT = 300


def run_notebook(path: str | os.PathLike, out_dir: str | os.PathLike, parameters: Mapping[str, Any] | None = None,
                 *, html: bool = True, kernel_name: str = "python3", timeout: int | None = None,
                 start_timeout: int = START_TIMEOUT, cwd: str | os.PathLike | None = None,
                 output_name: str | None = None, require_mathjax: bool = True,
                 code: bool | None = None) -> dict[str, Any]:
    """Execute one notebook with papermill into ``out_dir`` (never in place) and render HTML; return
    ``{"notebook", "seconds", "executed"[, "html"]}``.

    The kernel imports this process's acetools, draws figures inline and shows no progress bars
    unless ``ACETOOLS_PROGRESS`` says so. ``cwd``: where cells run (default the notebook's folder);
    ``timeout``: seconds per cell (None: no limit); ``start_timeout``: seconds for the kernel to start
    (papermill's 60 s is short on a loaded machine). An undeclared parameter raises
    :class:`UnknownParameterError` before running; a failing cell papermill's
    ``PapermillExecutionError`` (the partly executed notebook stays in ``out_dir``).
    """
    import papermill as pm

    path = Path(path).resolve()
    out_dir = Path(out_dir).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    params = dict(parameters or {})
    _check_names(path, params, notebook_parameters(path))
    out_nb = out_dir / (output_name or path.name)
    t0 = time.perf_counter()
    saved = {k: os.environ.get(k) for k in ("ACETOOLS_PROGRESS", "PYTHONPATH", "MPLBACKEND")}
    os.environ.setdefault("ACETOOLS_PROGRESS", "0")
    os.environ["MPLBACKEND"] = INLINE_BACKEND  # figures on the page, whatever backend this process uses
    os.environ["PYTHONPATH"] = os.pathsep.join([str(REPO)] + ([saved["PYTHONPATH"]] if saved["PYTHONPATH"] else []))
    try:
        pm.execute_notebook(str(path), str(out_nb), parameters=params, kernel_name=kernel_name,
                            cwd=str(Path(cwd).resolve() if cwd is not None else path.parent), progress_bar=False,
                            log_output=False, execution_timeout=timeout, start_timeout=start_timeout)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    seconds = time.perf_counter() - t0
    rec: dict[str, Any] = {"notebook": path.stem, "seconds": round(seconds, 1), "executed": str(out_nb)}
    if html:
        rec["html"] = str(render_html(out_nb, require_mathjax=require_mathjax, code=code))
    return rec


def _image_alts(nb) -> dict[str, str]:
    """Alt text per PNG output (keyed by its base64 data): the figure's title, else its section's heading."""
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


#: Cell tag that hides a cell's input in the rendered page, its output kept (docs/style.md §13).
HIDE_INPUT = "hide-input"


def shows_code(nb: Any) -> bool:
    """Whether a notebook renders with its code: a lesson does; a report (metadata ``acetools.kind``) does not."""
    return (nb.metadata.get("acetools") or {}).get("kind") != "report"


def render_html(executed: str | os.PathLike, *, require_mathjax: bool = True, code: bool | None = None) -> Path:
    """HTML of an executed notebook, next to it (``jupyter nbconvert --to html``).

    ``code``: render the input cells (None: :func:`shows_code`); cells tagged :data:`HIDE_INPUT` keep
    only their output. Figures get their alt text (:func:`_image_alts`), :data:`REPORT_CSS` lets wide
    tables scroll, equations use a local MathJax (:func:`acetools.utils.local_mathjax_url`) and no
    script comes from a CDN. Without a local MathJax: ``FileNotFoundError`` unless
    ``require_mathjax=False``.
    """
    import nbformat
    from bs4 import BeautifulSoup
    from nbconvert import HTMLExporter

    from .utils import local_mathjax_url

    executed = Path(executed)
    nb = nbformat.read(str(executed), as_version=4)
    mj = local_mathjax_url()
    if mj is None and require_mathjax:
        raise FileNotFoundError("no local MathJax for the report's equations: install Debian's libjs-mathjax "
                                "(scripts/setup.sh does) or set ACETOOLS_MATHJAX to a MathJax.js; reports never "
                                "load it from a CDN")
    kw: dict[str, Any] = {"mathjax_url": mj} if mj else {}
    code = shows_code(nb) if code is None else code
    if code:
        from traitlets.config import Config

        kw["config"] = Config({"TagRemovePreprocessor": {"enabled": True, "remove_input_tags": {HIDE_INPUT}}})
    exporter = HTMLExporter(exclude_input=not code, exclude_input_prompt=True, exclude_output_prompt=True, **kw)
    body, _ = exporter.from_notebook_node(nb)
    alts = _image_alts(nb)
    soup = BeautifulSoup(body, features="html.parser")
    for img in soup.find_all("img"):
        src = img.get("src")
        if isinstance(src, str) and src.startswith("data:image/png;base64,"):
            alt = alts.get("".join(src.split(",", 1)[1].split()))
            if alt:
                img["alt"] = alt
    source = (nb.metadata.get("papermill") or {}).get("input_path")  # where the lesson's relative links start
    link_docs(soup, Path(source).resolve().parent if source else executed.parent, executed.parent, "docs/")
    return _write_page(soup, executed.with_suffix(".html"))


def _write_page(soup: Any, out: Path) -> Path:
    """Write a rendered page: no script from the network (require.js and mermaid come from CDNs), the
    report's CSS in its head, atomically."""
    from .utils import atomic_write

    for script in soup.find_all("script"):
        src = script.get("src")
        if (isinstance(src, str) and src.startswith(("http://", "https://", "//"))) or "cdnjs" in (script.string or ""):
            script.decompose()
    style = soup.new_tag("style")
    style.string = REPORT_CSS
    (soup.head or soup).append(style)
    with atomic_write(out, "w") as fh:
        fh.write(str(soup))
    return out


def run_report(profile: str = "quick", *, only: Sequence[str] | None = None,
               parameters: Mapping[str, Any] | None = None, out: str | os.PathLike | None = None,
               figures: str | os.PathLike | None = None, notebooks: str | os.PathLike | None = None,
               html: bool = True, timeout: int | None = None, start_timeout: int = START_TIMEOUT,
               on_result=None) -> list[dict[str, Any]]:
    """Run the course (or ``only`` some notebooks) under ``profile``; return one record each.

    ``out``: build folder (default ``build/report/<profile>``); ``figures``: figure root (default
    ``figures/`` for ``full``, ``<out>/figures`` for ``quick``), each notebook gets
    ``figures_dir=<figures>/<stem>``. ``parameters`` apply to every notebook and must be declared by each.
    """
    if profile not in PROFILES:
        raise InputError(f"unknown profile {profile!r}; profiles: {sorted(PROFILES)}")
    out = Path(out) if out is not None else REPO / "build" / "report" / profile
    if figures is None:
        figures = REPO / "figures" if profile == "full" else out / "figures"
    figures = Path(figures).resolve()
    paths = notebook_paths(notebooks, only)
    parameters = check_parameters(paths, parameters or {})  # every name and type before the first kernel
    records = []
    for path in paths:
        params = {**PROFILES[profile], "figures_dir": str(figures / path.stem), **parameters}
        declared = notebook_parameters(path)
        params = {k: v for k, v in params.items() if k in declared or k in parameters}
        log.info("running %s (%s profile) into %s", path.stem, profile, out)
        rec = run_notebook(path, out, params, html=html, timeout=timeout, start_timeout=start_timeout)
        rec["profile"] = profile
        records.append(rec)
        if on_result is not None:
            on_result(rec)
    return records


#: The repository's docs pages; lessons link to them as ``../docs/<page>.md#<heading>``.
DOCS = REPO / "docs"


def heading_slug(heading: str) -> str:
    """GitHub's anchor of a heading (``"Eckart-Young"`` -> ``eckart-young``), the one docs links name."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def link_docs(soup: Any, source_dir: Path, out_dir: Path, prefix: str, done: set[Path] | None = None) -> None:
    """Point a rendered page's links to ``docs/*.md`` (relative to ``source_dir``, the folder of the page's
    source) at those pages rendered by :func:`render_doc_page` into ``out_dir/docs/`` (``prefix``: that
    folder seen from the page), anchors kept; links to other repository files but lessons become ``file:`` URLs."""
    done = set() if done is None else done
    for tag, attr in (("a", "href"), ("img", "src")):
        for el in soup.find_all(tag):
            ref = el.get(attr)
            if not isinstance(ref, str) or not ref or re.match(r"[a-z][a-z0-9+.-]*:|[#/]", ref):
                continue
            path, _, anchor = ref.partition("#")
            target = (source_dir / path).resolve()
            if target.suffix == ".md" and target.parent == DOCS and target.is_file():
                if target not in done:
                    done.add(target)
                    render_doc_page(target, out_dir / "docs", done)
                el[attr] = f"{prefix}{target.stem}.html" + (f"#{anchor}" if anchor else "")
            elif target.suffix != ".ipynb" and target.is_relative_to(REPO) and target.exists():
                el[attr] = target.as_uri() + (f"#{anchor}" if anchor else "")


def render_doc_page(md: Path, out_dir: Path, done: set[Path] | None = None) -> Path:
    """``docs/<page>.md`` as ``out_dir/<page>.html``, styled and typeset as the reports are, its headings
    carrying GitHub's anchors (:func:`heading_slug`) and its links to other docs pages rendered too."""
    import nbformat
    from bs4 import BeautifulSoup

    out = out_dir / f"{md.stem}.html"
    if out.is_file() and out.stat().st_mtime > max(md.stat().st_mtime, Path(__file__).stat().st_mtime):
        return out  # rendered by an earlier lesson of this report, with the pages it links
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell(md.read_text(encoding="utf-8"))])
    body, _ = _doc_exporter().from_notebook_node(nb, resources={"metadata": {"name": md.stem}})
    soup = BeautifulSoup(body, features="html.parser")
    for h in soup.find_all(re.compile(r"^h[1-6]$")):
        for a in h.find_all("a", class_="anchor-link"):
            a.decompose()
        h["id"] = heading_slug(h.get_text())
    link_docs(soup, md.parent, out_dir.parent, "", {md} if done is None else done)
    return _write_page(soup, out)


@functools.cache
def _doc_exporter() -> Any:
    """The HTML exporter of :func:`render_doc_page` (built once: nbconvert loads its templates)."""
    from nbconvert import HTMLExporter

    from .utils import local_mathjax_url

    mj = local_mathjax_url()
    return HTMLExporter(exclude_input_prompt=True, exclude_output_prompt=True, **({"mathjax_url": mj} if mj else {}))
