"""Run the course notebooks as parameterised reports (``acetools report``), and check them.

The runner is the library's (:mod:`acetools.notebooks`: :func:`run_notebook`,
:func:`run_report`, parameter checks, HTML rendering), re-exported here; this module adds
:func:`check_html`, the course's rules for a rendered lesson.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from ..notebooks import *  # noqa: F403  (the course's runner is the library's)
from ..notebooks import __all__ as _RUNNER

__all__ = [*_RUNNER, "check_html"]


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
_VERDICT_TEXT = re.compile(r"\[(?:reproduced|partly|not reproduced|not testable here)\] ([a-z0-9_]+\.[a-z0-9_]+):")


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


