"""How a lesson's page shows things: :func:`table` (meaningful digits, ``—`` for missing values,
scrolling wide tables) and :func:`setup` (the plotting theme, figure titles as alt text)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from acetools.plotting import set_theme

#: How a missing value reads in a table.
NA = "—"


def alt_text(fig: Any) -> str:
    """A figure's description for screen readers: its suptitle and axes' titles (else their axis labels)."""
    parts = []
    sup = getattr(fig, "_suptitle", None)
    if sup is not None and sup.get_text():
        parts.append(sup.get_text())
    for ax in fig.get_axes():
        title = ax.get_title() or ax.get_title("left") or ax.get_title("right")
        if title:
            parts.append(title)
        elif ax.get_ylabel() or ax.get_xlabel():
            parts.append(f"{ax.get_ylabel() or 'value'} against {ax.get_xlabel() or 'index'}")
    text = "; ".join(dict.fromkeys(p.replace("$", "").strip() for p in parts if p.strip()))
    return f"Figure: {text}" if text else "Figure"


def setup() -> None:
    """The plotting theme, and alt text for inline figures (inside IPython only)."""
    set_theme()
    from IPython.core.getipython import get_ipython  # ipykernel, a dependency, brings IPython
    shell = get_ipython()
    if shell is None:
        return
    import matplotlib.pyplot as plt  # noqa: F401 - activates the inline backend and its png formatter
    from matplotlib.figure import Figure

    display_formatter = getattr(shell, "display_formatter", None)  # a traitlets Instance (untyped)
    if display_formatter is None:
        return
    png = display_formatter.formatters["image/png"]
    try:
        inner = png.lookup_by_type(Figure)
    except KeyError:
        return
    if getattr(inner, "_acetools_alt", False):
        return

    def with_alt(fig: Figure):
        data = inner(fig)
        return (data, {"alt": alt_text(fig)}) if data is not None else None

    with_alt._acetools_alt = True  # type: ignore[attr-defined]
    png.for_type(Figure, with_alt)


def table(df: Any, digits: int | Mapping[str, int | str] = 2, *, caption: str | None = None, index: bool = True,
          na: str = NA) -> Any:
    """``df`` styled for a report: floats to ``digits`` decimals (or per-column formats), missing as
    ``na``, an optional caption; a MultiIndex header is flattened to ``"value · column"``. A ``Styler``."""
    if isinstance(df, pd.Series):
        df = df.to_frame()
    if isinstance(df.columns, pd.MultiIndex):
        df = df.copy()
        flat = [" · ".join(str(x) for x in c if str(x) != "") for c in df.columns]
        if isinstance(digits, Mapping):  # a per-value format applies to each of its flattened columns
            digits = {**{f: digits[c[0]] for f, c in zip(flat, df.columns) if c[0] in digits}, **digits}
        df.columns = pd.Index(flat)
    if index and df.index.nlevels == 1 and df.index.name is not None and df.columns.name is None:
        df = df.rename_axis(index=None, columns=df.index.name)
    numeric = [c for c in df.columns if pd.api.types.is_float_dtype(df[c])]
    fmt: dict[Any, Any] = {}
    for c in numeric:
        d = digits.get(c, 2) if isinstance(digits, Mapping) else digits
        fmt[c] = d if isinstance(d, str) else f"{{:.{int(d)}f}}"
    if isinstance(digits, Mapping):  # explicit format strings apply to any column; digits to float columns only
        fmt.update({c: f for c, f in digits.items() if c in df.columns and isinstance(f, str)})
    def text(v: Any) -> Any:
        return na if v is None or (isinstance(v, float) and np.isnan(v)) else v

    for c in df.columns:  # one format call: Styler.format resets the columns a dict leaves out
        if c not in fmt:
            fmt[c] = text if not pd.api.types.is_numeric_dtype(df[c]) else None
    styler = df.style.format(fmt, na_rep=na).format_index(na_rep=na)
    if caption:
        styler = styler.set_caption(caption)
    if not index:
        styler = styler.hide(axis="index")
    return styler
