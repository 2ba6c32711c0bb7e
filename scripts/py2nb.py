"""Build a clean course notebook from a percent-format Python file (a development tool).

    python3 scripts/py2nb.py SOURCE.py notebooks/NN_name.ipynb

Cells start at lines ``# %%`` (code) or ``# %% [markdown]`` (markdown; each line's leading
``# `` is removed). ``# %% tags=["parameters"]`` marks papermill's parameters cell. The
notebook is written without outputs or execution counts, with the ``python3`` kernelspec
and ``language_info`` (docs/style.md §12). ``--reverse`` turns a notebook back into such a file.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import nbformat

HEADER = re.compile(r"^# %%(?P<md> \[markdown\])?(?: tags=(?P<tags>\[.*\]))?\s*$")


def to_notebook(text: str) -> nbformat.NotebookNode:
    cells, kind, tags, lines = [], None, [], []

    def flush():
        if kind is None:
            return
        src = "\n".join(lines).strip("\n")
        if kind == "markdown":
            src = "\n".join(line[2:] if line.startswith("# ") else line.lstrip("#") for line in src.splitlines())
            cell = nbformat.v4.new_markdown_cell(src)
        else:
            cell = nbformat.v4.new_code_cell(src)
        if tags:
            cell.metadata["tags"] = tags
        cell["id"] = f"cell-{len(cells):02d}"  # deterministic ids: stable diffs
        cells.append(cell)

    for line in text.splitlines():
        m = HEADER.match(line)
        if m:
            flush()
            kind = "markdown" if m.group("md") else "code"
            tags = json.loads(m.group("tags")) if m.group("tags") else []
            lines = []
        elif kind is not None:
            lines.append(line)
    flush()
    nb = nbformat.v4.new_notebook(cells=cells)
    nb.metadata = {
        "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
        "language_info": {"name": "python", "pygments_lexer": "ipython3", "file_extension": ".py",
                          "mimetype": "text/x-python", "codemirror_mode": {"name": "ipython", "version": 3},
                          "nbconvert_exporter": "python"},
    }
    return nb


def to_percent(nb) -> str:
    out = []
    for c in nb.cells:
        tags = c.get("metadata", {}).get("tags", [])
        t = f" tags={json.dumps(tags)}" if tags else ""
        if c.cell_type == "markdown":
            out.append(f"# %% [markdown]{t}")
            out += [("# " + line) if line else "#" for line in c.source.splitlines()]
        else:
            out.append(f"# %%{t}")
            out += c.source.splitlines()
        out.append("")
    return "\n".join(out)


def main(argv: list[str]) -> int:
    if len(argv) >= 1 and argv[0] == "--reverse":
        nb = nbformat.read(argv[1], as_version=4)
        Path(argv[2]).write_text(to_percent(nb))
        return 0
    if len(argv) != 2:
        print(__doc__)
        return 2
    nb = to_notebook(Path(argv[0]).read_text())
    nbformat.validate(nb)
    Path(argv[1]).write_text(nbformat.writes(nb) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
