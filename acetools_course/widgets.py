"""Interactive explorers: thin ipywidgets wrappers around pure plotting functions (docs/style.md §11).

An :class:`Explorer` redraws one figure with ``plot_fn(ax, **values)`` on each control change;
the same function draws the static figure headless runs save. ipywidgets is imported lazily."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from acetools.errors import InputError, InputKeyError


def in_frontend() -> bool:
    """Whether this process is a Jupyter kernel (a notebook, papermill, VS Code): only there
    can a widget's output be shown; elsewhere ``display`` would print the figure's repr."""
    from IPython.core.getipython import get_ipython  # IPython ships with ipywidgets, a dependency
    ip = get_ipython()
    return ip is not None and getattr(ip, "kernel", None) is not None


class Explorer:
    """A figure redrawn by ``plot_fn(ax, **fixed, **values)`` whenever a control of ``controls`` changes;
    ``set(name=value)`` changes one programmatically, ``values`` holds the values last drawn."""

    def __init__(self, plot_fn: Callable[..., Any], controls: dict[str, Any], *, figsize=(6.0, 3.6), **fixed: Any):
        import ipywidgets as w
        import matplotlib.pyplot as plt

        if not controls:
            raise InputError("an Explorer needs at least one control")
        self.plot_fn, self.controls, self.fixed = plot_fn, dict(controls), fixed
        self.figure, self.ax = plt.subplots(figsize=figsize)
        plt.close(self.figure)  # shown through the Output widget, not by pyplot
        self.output = w.Output()
        self.values: dict[str, Any] = {}
        self.draws = 0
        for c in self.controls.values():
            c.observe(lambda _change: self.redraw(), names="value")
        self.widget = w.VBox([w.HBox(list(self.controls.values())), self.output])
        self.redraw()

    def redraw(self) -> None:
        self.values = {k: c.value for k, c in self.controls.items()}
        self.ax.clear()
        self.plot_fn(self.ax, **self.fixed, **self.values)
        self.draws += 1
        if not in_frontend():
            return
        self.output.clear_output(wait=True)
        with self.output:
            from IPython.display import display

            display(self.figure)

    def set(self, **values: Any) -> None:
        """Set control values (each triggers a redraw, as a user's change would)."""
        for k, v in values.items():
            if k not in self.controls:
                raise InputKeyError(f"no control {k!r}; controls: {sorted(self.controls)}")
            self.controls[k].value = v


def _checked(options: list, value: Any, default: Any, noun: str) -> Any:
    """``value`` (``default`` when None), which must be one of ``options`` (the errors name the ``noun``)."""
    if not options:
        raise InputError(f"{noun}s is empty")
    value = default if value is None else value
    if value not in options:
        raise InputError(f"unknown {noun} {value!r}; {noun}s: {options}")
    return value


def rank_slider(plot_fn: Callable[..., Any], ranks: Sequence[int], value: int | None = None, *,
                name: str = "k", description: str = "rank k", **fixed: Any) -> Explorer:
    """A rank / spectrum explorer: an integer slider over ``ranks`` feeding ``plot_fn(ax, k=...)``."""
    import ipywidgets as w

    ranks = [int(r) for r in ranks]
    value = _checked(ranks, None if value is None else int(value), ranks[len(ranks) // 2] if ranks else None, "rank")
    step = ranks[1] - ranks[0] if len(ranks) > 1 else 1
    slider = w.IntSlider(value=value, min=ranks[0], max=ranks[-1], step=step, description=description,
                         continuous_update=False)
    return Explorer(plot_fn, {name: slider}, **fixed)


def alpha_slider(plot_fn: Callable[..., Any], alphas: Sequence[float], value: float | None = None, *,
                 name: str = "alpha", description: str = "alpha", **fixed: Any) -> Explorer:
    """A coefficient explorer over a **precomputed** sweep: the slider only offers the
    swept values (``SelectionSlider``), so every position has a measured result."""
    import ipywidgets as w

    alphas = [float(a) for a in alphas]
    value = _checked(alphas, None if value is None else float(value), alphas[len(alphas) // 2] if alphas else None,
                     "swept coefficient")
    slider = w.SelectionSlider(options=[(f"{a:g}", a) for a in alphas], value=value, description=description,
                               continuous_update=False)
    return Explorer(plot_fn, {name: slider}, **fixed)


def task_picker(plot_fn: Callable[..., Any], tasks: Sequence[str], value: str | None = None, *,
                name: str = "task", description: str = "task", **fixed: Any) -> Explorer:
    """A dropdown over ``tasks`` feeding ``plot_fn(ax, task=...)``."""
    import ipywidgets as w

    tasks = [str(t) for t in tasks]
    value = _checked(tasks, value, tasks[0] if tasks else None, "task")
    return Explorer(plot_fn, {name: w.Dropdown(options=tasks, value=value, description=description)}, **fixed)
