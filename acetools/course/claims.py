"""Every quantitative claim of the two papers, and where the course measures it.

:data:`CLAIMS` lists the claims of the paper summaries (docs/methods.md §Sources: ACE-Merging
arXiv 2603.02945, ESM arXiv 2602.20208) with a stable id and the notebook that owns the
measurement. A notebook that measures a claim calls :func:`record`, which writes the
measurement and a verdict into ``<figures_dir>/claims.json``; ``05_claims`` gathers every
notebook's file with :func:`collect` and shows one table, listing claims nobody measured.

Verdicts (:data:`VERDICTS`, from :mod:`acetools.course.verdicts`): ``reproduced``,
``partly``, ``not reproduced``, and ``not testable here`` (the claim needs models or data
this toolkit does not have, e.g. GPT-2 on GLUE); each comes with a one-line reason. A
lesson's check returns a :class:`~acetools.course.verdicts.Verdict`, which :func:`record`
stores as it is.
"""

from __future__ import annotations

import datetime as _dt
import json
import logging
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..errors import InputError, InputKeyError, InputTypeError
from ..utils import atomic_write
from .verdicts import VERDICTS, Verdict

__all__ = ["Claim", "CLAIMS", "VERDICTS", "claim", "record", "show", "collect", "claims_table", "styled_table"]

log = logging.getLogger("acetools.course.claims")


@dataclass(frozen=True)
class Claim:
    id: str
    paper: str  # "ACE" or "ESM"
    text: str  # the claim, as the seed states it (numbers included)
    notebook: str  # the notebook that measures it
    measure: str  # what the notebook measures in the mini-world


CLAIMS: tuple[Claim, ...] = (
    # ---------------------------------------------------------------- ACE-Merging
    Claim("ace.theorem1", "ACE", "Theorem 1: a task's input covariance is proportional to the covariance of its "
          "fine-tuning update's rows, Sigma_t ∝ Cov(ΔW_t).", "01_theorem1",
          "cosine between Sigma_hat from ΔW rows and the true Sigma_t for SGD-trained linear tasks"),
    Claim("ace.theorem1_vit", "ACE", "The estimator carries over to Transformer layers under the linear "
          "approximation f(W, x) ≈ Wx (a stated limitation: rows are not independent in attention).", "01_theorem1",
          "per layer type of the mini-world ViT: cosine of Sigma_hat with the hooked input covariance"),
    Claim("ace.unified", "ACE", "Unified framework: weight averaging is the closed form with Sigma_hat = kI; "
          "WUDI-Merging is a norm-weighted outer-product estimator.", "01_theorem1",
          "identity estimator equals weight averaging; the four estimators side by side in one closed form"),
    Claim("ace.gamma_vit", "ACE", "ViTs have low task-vector heterogeneity (ViT-B/16: gamma < 0.25), "
          "RoBERTa high (gamma > 0.3).", "02_ace_step_by_step", "gamma per layer of the mini-world's task vectors"),
    Claim("ace.normalization", "ACE", "Adaptive normalization matters where heterogeneity is high and can be "
          "skipped for ViTs (low gamma).", "02_ace_step_by_step", "ablation: gate / always / never normalise"),
    Claim("ace.csp", "ACE", "The collective structural prior (anisotropic) is a better regulariser than "
          "an isotropic epsilon·I.", "02_ace_step_by_step", "ablation: prior on / off"),
    Claim("ace.spectrum", "ACE", "The preliminary solution's spectrum is extremely concentrated: the top 5% "
          "singular values hold 99%+ of the energy, condition number > 8.7e5.", "02_ace_step_by_step",
          "top-5% energy and condition number of W_pre (or its update) per layer"),
    Claim("ace.direction", "ACE", "The principal directions of the preliminary solution are correct "
          "(cosine ≈ 1); the problem is the energy distribution.", "02_ace_step_by_step",
          "cosine of W_pre's top singular directions with the closed form's under the hooked input "
          "covariances (task-vector sum's beside it)"),
    Claim("ace.refinement", "ACE", "Spectral refinement (top-k singular values replaced by their mean) "
          "improves the merge.", "02_ace_step_by_step", "ablation: refine on / off"),
    Claim("ace.sota", "ACE", "ACE beats every data-free baseline in all vision settings (ViT-B/32 8 tasks 87.9, "
          "ViT-B/16 14 tasks 86.1, ViT-L/14 20 tasks 89.5; TSV-M 85.9 / 84.6 / 87.7).", "04_benchmark",
          "rank of ACE among the data-free methods on tasks8/14/20"),
    Claim("ace.grows", "ACE", "ACE's advantage grows with the number of tasks (8 → 14 → 20).", "04_benchmark",
          "ACE minus task arithmetic at 8, 14, 20 tasks (the paper's own ViT-B/16 numbers show ACE's lead growing "
          "over task arithmetic, +15.2 → +15.6 → +16.3, not over the best rival, +2.0 → +1.5 → +1.6)"),
    Claim("ace.vs_wudi", "ACE", "The closed form is more stable and cheaper than WUDI-Merging's iterative "
          "optimisation.", "04_benchmark", "accuracy and merge time of ACE against WUDI"),
    Claim("ace.cost", "ACE", "Cost O(L·T·n³), matching SVD-based methods.", "04_benchmark",
          "merge time of ACE against TSV-M at 8/14/20 tasks"),
    Claim("ace.ordering", "ACE", "Vision table ordering: weight averaging < task arithmetic < CART ≈ TSV-M < ACE.",
          "04_benchmark", "Kendall tau of our method ordering against the table's"),
    Claim("ace.language", "ACE", "Language: GPT-2 GLUE 74.1 (+4.1 over TIES), RoBERTa-Base 90.4 normalized "
          "(+5.1 over WUDI), RoBERTa-Large 91.7, LLaMA-3 out-of-domain recovery.", "05_claims",
          "nothing: no language models in the mini-world"),
    # ---------------------------------------------------------------- ACE on language (the text world)
    Claim("ace.language_sota", "ACE", "On language models ACE beats WUDI, TIES and TSV-M (RoBERTa-Base GLUE "
          "normalized: ACE 90.4, WUDI 85.3, TSV-M 79.0, TIES 64.7).", "07_language",
          "ACE at the paper's RoBERTa eps (2e-4) against WUDI, TIES and TSV-M on text8, paired over seeds"),
    Claim("ace.gamma_bert", "ACE", "BERT-family models have high task-vector heterogeneity (RoBERTa: gamma > 0.3), "
          "so the gate sends them to the normalised branch.", "07_language",
          "gamma per matrix of the MiniLM experts' task vectors, with scale-free views of the same energies"),
    Claim("ace.normalization_language", "ACE", "Adaptive normalization matters where heterogeneity is high "
          "(the language setting).", "07_language",
          "ACE with the gate forced on every matrix, with and without trace normalization"),
    Claim("ace.csp_language", "ACE", "On the flagged (heterogeneous) layers the collective structural prior "
          "improves the merge.", "07_language", "ACE with the gate forced on, with and without the prior"),
    Claim("ace.refinement_language", "ACE", "Spectral refinement improves the merge on flagged layers.",
          "07_language", "ACE with the gate forced on, with and without the refinement"),
    Claim("ace.spectrum_language", "ACE", "The preliminary solution's spectrum is extremely concentrated (top 5% "
          "singular values hold 99%+ of the energy) on language models too.", "07_language",
          "top-5% energy of W_pre per matrix of the text world"),
    # ---------------------------------------------------------------- ESM
    Claim("esm.energy", "ESM", "ESD concentrates a task update's activation-shift energy in far fewer "
          "components than SVD.", "03_esm_step_by_step", "energy captured at rank k by ESD and SVD"),
    Claim("esm.cka", "ESM", "At 5% retention, ESD's reconstruction has much higher CKA with the full update's "
          "activations than SVD's.", "03_esm_step_by_step", "linear CKA at 5% of the components"),
    Claim("esm.proxy", "ESM", "The proxy data barely matter: out-of-distribution or single-class proxies give "
          "the same accuracy (< 0.1% apart).", "03_esm_step_by_step",
          "ESM accuracy with in-distribution, another task's, one-class proxies"),
    Claim("esm.four", "ESM", "Four proxy samples already beat the SVD baseline.", "03_esm_step_by_step",
          "ESM with 4 proxies against TSV-M (the paper's SVD baseline)"),
    Claim("esm.esd_alone", "ESM", "ESD without scaling beats SVD (+1.9 / +2.2 at 8 / 20 tasks).",
          "03_esm_step_by_step", "ablation grid: ESD without scaling vs TSV-M (the paper's SVD row)"),
    Claim("esm.ps_on_svd", "ESM", "Polarized scaling helps SVD too (+0.6 / +1.5).", "03_esm_step_by_step",
          "ablation grid: SVD with all three levels vs TSV-M (the paper's SVD row)"),
    Claim("esm.layer_first", "ESM", "Layer-level scaling contributes the most of the three levels.",
          "03_esm_step_by_step", "ablation grid: ESD + layer-only vs ESD + all"),
    Claim("esm.reciprocal", "ESM", "Reciprocal scaling costs 5+ points.", "03_esm_step_by_step",
          "ESM with exponent -1 against +2"),
    Claim("esm.norm_importance", "ESM", "High-norm components are the high-confidence directions: loading "
          "components in norm order is best.", "03_esm_step_by_step",
          "accuracy when keeping components by norm order vs reverse"),
    Claim("esm.sota", "ESM", "ESM beats Iso-CTS and TSV-M at 8/14/20 tasks (ViT-B/16 91.8 / 87.4 / 84.9 vs "
          "Iso-CTS 91.1 / 86.4 / 82.4; +3.2 over Iso-CTS at 20 tasks on ViT-B/32).", "04_benchmark",
          "ESM against Iso-CTS and TSV-M on tasks8/14/20"),
    Claim("esm.overhead", "ESM", "Small extra cost: PCA 1.39 s per task plus 13.89 s orthogonalisation (ViT-B/16).",
          "04_benchmark", "ESM merge time against TSV-M"),
)

_BY_ID = {c.id: c for c in CLAIMS}


def claim(claim_id: str) -> Claim:
    """The registered claim ``claim_id`` (KeyError listing the valid ids otherwise)."""
    try:
        return _BY_ID[claim_id]
    except KeyError:
        raise InputKeyError(f"unknown claim id {claim_id!r}; valid ids: {sorted(_BY_ID)}") from None


def record(figures_dir: str | os.PathLike, claim_id: str, measured: str | Verdict, verdict: str | None = None,
           reason: str | None = None, *, show_verdict: bool = True, **numbers: Any) -> dict[str, Any]:
    """Store our measurement of ``claim_id`` in ``<figures_dir>/claims.json`` and show the verdict.

    Either ``record(fig_dir, claim_id, v, **extra)`` with a
    :class:`~acetools.course.verdicts.Verdict` ``v`` (``extra`` numbers are stored beside
    ``v.numbers``), or ``record(fig_dir, claim_id, measured, verdict, reason, **numbers)``
    with ``measured`` the measurement in words with its numbers, ``verdict`` one of
    :data:`VERDICTS`, ``reason`` why (one line) and ``numbers`` the raw values (JSON-able).
    Re-recording a claim replaces its entry. The verdict is shown once, as one wrapped line
    (Markdown in a notebook, the log elsewhere) unless ``show_verdict`` is False (a page
    that shows it in a table anyway). Returns the entry.
    """
    c = claim(claim_id)
    if isinstance(measured, Verdict):
        if verdict is not None or reason is not None:
            raise InputTypeError("record(fig_dir, claim_id, Verdict, **numbers) takes no verdict= or reason=")
        v = measured
        measured, verdict, reason, numbers = v.measured, v.verdict, v.reason, {**v.numbers, **numbers}
    if verdict not in VERDICTS:
        raise InputError(f"verdict {verdict!r} must be one of {VERDICTS}")
    if reason is None:
        raise InputTypeError(f"record({claim_id!r}): a reason is required")
    folder = Path(figures_dir)
    path = folder / "claims.json"
    entries = json.loads(path.read_text()) if path.is_file() else {}
    entry = {"id": c.id, "paper": c.paper, "claim": c.text, "measured": measured, "verdict": verdict,
             "reason": reason, "numbers": numbers, "notebook": folder.name,
             "recorded": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")}
    entries[c.id] = entry
    with atomic_write(path, "w") as fh:
        json.dump(entries, fh, indent=1, sort_keys=True, default=str)
    if show_verdict:
        show(entry)
    else:
        log.info("[%s] %s: %s — %s", verdict, c.id, measured, reason)
    return entry


def show(entry: dict[str, Any]) -> None:
    """Show a recorded verdict once: a Markdown line in a notebook (it wraps at word
    boundaries), the ``acetools.course.claims`` log elsewhere."""
    text = f"[{entry['verdict']}] {entry['id']}: {entry['measured']} — {entry['reason']}"
    try:
        from IPython import get_ipython

        shell = get_ipython()
    except ImportError:  # pragma: no cover - IPython is a course dependency
        shell = None
    if shell is None:
        log.info(text)
        return
    from IPython.display import Markdown, display

    def esc(s: str) -> str:
        return s.replace("*", "\\*").replace("_", "\\_").replace("<", "&lt;")

    display(Markdown(f"**{entry['verdict']}** · `{entry['id']}`: {esc(entry['measured'])} — *{esc(entry['reason'])}*"))


def collect(figures_root: str | os.PathLike) -> dict[str, dict[str, Any]]:
    """Every ``claims.json`` under ``figures_root`` (one level down), merged by claim id."""
    out: dict[str, dict[str, Any]] = {}
    for path in sorted(Path(figures_root).glob("*/claims.json")):
        out.update(json.loads(path.read_text()))
    return out


def claims_table(figures_root: str | os.PathLike):
    """One row per registered claim: paper, claim, owner notebook, our measurement, verdict,
    reason (``not measured`` where no notebook recorded it yet)."""
    import pandas as pd

    got = collect(figures_root)
    rows = []
    for c in CLAIMS:
        e = got.get(c.id)
        rows.append({"id": c.id, "paper": c.paper, "claim": c.text, "notebook": c.notebook,
                     "measured": e["measured"] if e else "", "verdict": e["verdict"] if e else "not measured",
                     "reason": e["reason"] if e else f"run {c.notebook} first"})
    return pd.DataFrame(rows)


def styled_table(table: Any) -> Any:
    """Lesson 05's view of :func:`claims_table`: id, paper, notebook, verdict (coloured as in
    :data:`acetools.course.plotting.benchmark.VERDICT_COLORS`), measurement and reason, left-aligned."""
    from .plotting.benchmark import VERDICT_COLORS

    show_cols = table[["id", "paper", "notebook", "verdict", "measured", "reason"]]
    colours = [f"background-color: {VERDICT_COLORS.get(v, '#ffffff')}" for v in show_cols["verdict"]]
    return (show_cols.style.hide(axis="index")
            .apply(lambda col: colours, subset=["verdict"], axis=0)
            .set_properties(subset=["measured", "reason"], **{"text-align": "left"}))


def as_dict(c: Claim) -> dict[str, str]:
    return asdict(c)
