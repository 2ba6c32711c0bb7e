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
import os
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
    "run_notebook",
    "run_report",
    "UnknownParameterError",
]

#: The repository root (the parent of the ``acetools`` package).
REPO = Path(__file__).resolve().parents[2]
#: Parameter overrides per profile.
PROFILES: dict[str, dict[str, Any]] = {"quick": {"quick": True}, "full": {}}


class UnknownParameterError(ValueError):
    """A parameter was passed that the notebook's ``parameters`` cell does not declare."""


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


def parse_parameter(text: str) -> tuple[str, Any]:
    """``"KEY=VALUE"`` -> ``(key, value)``; the value is a Python literal when it parses as one
    (``3``, ``0.5``, ``True``, ``[1, 2]``), else the string."""
    if "=" not in text:
        raise ValueError(f"parameter {text!r} must look like KEY=VALUE")
    key, raw = text.split("=", 1)
    key = key.strip()
    if not key.isidentifier():
        raise ValueError(f"parameter name {key!r} is not a Python identifier")
    try:
        value = ast.literal_eval(raw)
    except (ValueError, SyntaxError):
        value = raw
    return key, value


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
    try:
        pm.execute_notebook(str(path), str(out_nb), parameters=params, kernel_name=kernel_name, cwd=str(path.parent),
                            progress_bar=False, log_output=False, execution_timeout=timeout,
                            start_timeout=start_timeout)
    finally:
        if old is None:
            os.environ.pop("ACETOOLS_PROGRESS", None)
    seconds = time.perf_counter() - t0
    rec: dict[str, Any] = {"notebook": path.stem, "seconds": round(seconds, 1), "executed": str(out_nb)}
    if html:
        rec["html"] = str(render_html(out_nb))
    return rec


def render_html(executed: str | os.PathLike) -> Path:
    """``jupyter nbconvert --to html --no-input`` of an executed notebook, next to it."""
    import nbformat
    from nbconvert import HTMLExporter

    executed = Path(executed)
    nb = nbformat.read(str(executed), as_version=4)
    body, _ = HTMLExporter(exclude_input=True, exclude_input_prompt=True, exclude_output_prompt=True).from_notebook_node(nb)
    out = executed.with_suffix(".html")
    from ..utils import atomic_write

    with atomic_write(out, "w") as fh:
        fh.write(body)
    return out


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
    records = []
    for path in notebook_paths(notebooks, only):
        params = {**PROFILES[profile], "figures_dir": str(figures / path.stem), **dict(parameters or {})}
        declared = notebook_parameters(path)
        params = {k: v for k, v in params.items() if k in declared or k in (parameters or {})}
        rec = run_notebook(path, out, params, html=html, timeout=timeout, start_timeout=start_timeout)
        rec["profile"] = profile
        records.append(rec)
        if on_result is not None:
            on_result(rec)
    return records
