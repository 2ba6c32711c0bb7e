"""Every quantitative claim of the two papers and where the course measures it (docs/course.md §Verdicts).

:data:`CLAIMS` lists them with a stable id and the owning notebook; a notebook calls :func:`record`
to write its verdict into ``<figures_dir>/claims.json``, and ``05_claims`` gathers every file
(:func:`collect`), keyed by ``(world, id)``; a fixture world's records never sit beside a real world's."""

from __future__ import annotations

import datetime as _dt
import json
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from acetools.errors import InputError, InputKeyError, InputTypeError
from acetools.utils import atomic_write
from acetools.world.text.finetune import protocol_tag

from .lesson_worlds import is_text_world, repo_root, text_suite
from .verdicts import VERDICTS, Verdict, World, power_rule

#: The effect fields of every claim record (numbers or None; see :meth:`Verdict.record_fields`).
RECORD_FIELDS: tuple[str, ...] = ("predicted_effect", "noise_floor", "measured_effect", "paper_effect")

#: The names of the text world's claim worlds (:class:`~acetools_course.verdicts.World`) by
#: profile: lesson 07's and the text runs of 02-04 record under the same name, so lesson 05
#: shows them in one column.
#: The text world's claim worlds, per profile and head protocol (docs/text-world.md §Head protocols):
#: a protocol other than the zero-shot heads is part of the name, so lesson 05 counts it apart.
TEXT_CLAIM_WORLDS: dict[str, str] = {"full": "text", "quick": "text fixture",
                                     "full trained": "text (trained heads)",
                                     "quick trained": "text fixture (trained heads)"}


@dataclass(frozen=True)
class PaperSetting:
    """The one setting at which a model family's claims are decided (docs/methods.md §One paper setting
    per model family): ACE's ε and the result-file rows of ACE and ESM run at the papers' setting."""

    family: str  # the papers' model family the world's model stands in for
    eps: float  # ACE's ridge ε, as the ACE paper gives it for this family
    ace_row: str  # the result files' row of ACE at ``eps``
    esm_row: str  # the result files' row of ESM as its official code configures this family
    words: str  # where the setting comes from, in the sources' words


#: One paper setting per model family, the only place the claims take it from. The ACE paper (as
#: its reading notes report it) gives ε "GPT-2 4e-2, RoBERTa-Base 2e-4, others 1e-5"; the official
#: ESM code has a ViT and a RoBERTa configuration. The vision worlds' small ViT is a ViT; the text
#: world's all-MiniLM-L6-v2 is a BERT-family encoder, so it takes RoBERTa-Base's setting, under both
#: head protocols.
PAPER_SETTINGS: dict[str, PaperSetting] = {
    "vit": PaperSetting("ViT", 1e-5, "ace (eps 1e-5)", "esm",
                        "ACE: ε 1e-5 for ViTs ('others'); ESM: its ViT code (ESM-ViT)"),
    "bert": PaperSetting("RoBERTa-Base (BERT family)", 2e-4, "ace (eps 2e-4)", "esm (roberta)",
                         "ACE: ε 2e-4 for RoBERTa-Base; ESM: its RoBERTa code (ESM-RoBERTa)"),
}


def paper_setting(world_name: str | None) -> PaperSetting:
    """The :data:`PAPER_SETTINGS` entry of a claim world (by its name): the text world's (zero-shot or
    trained heads, full or fixture) is the BERT family's, every other world's the ViT's."""
    return PAPER_SETTINGS["bert" if world_name is not None and is_text_world_name(world_name) else "vit"]


class MixedWorldsError(ValueError):
    """A fixture world's claims were found beside a real world's."""

log = logging.getLogger("acetools_course.claims")


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

#: The claims that are not comparisons, decided on their measurement (docs/course.md §Scaling rule): levels of one
#: measurement (a cosine, γ, an energy share or condition number, a time ratio) and a claim of *no* difference
#: (``esm.proxy``), whose verdicts carry no settings. Every other claim is a comparison: its verdict carries one
#: :class:`~acetools_course.verdicts.Effect` per setting and passes the one rule (docs/course.md §One rule, (V.7)),
#: so that a decided comparison without a prediction cannot exist (tests/test_rejudge_claims.py).
NOT_COMPARISONS: frozenset[str] = frozenset({
    "ace.theorem1", "ace.theorem1_vit", "ace.unified", "ace.gamma_vit", "ace.spectrum", "ace.direction", "ace.cost",
    "ace.language", "ace.gamma_bert", "ace.spectrum_language", "esm.proxy", "esm.overhead"})

#: The claims about language models: lesson 07's and ACE's published language results. Every
#: other claim is about the papers' vision setting; judged on the text world it is an analogue.
LANGUAGE_CLAIMS: frozenset[str] = frozenset({c.id for c in CLAIMS if c.notebook == "07_language"} | {"ace.language"})


def is_text_world_name(name: str) -> bool:
    """Whether a claim world's name is the text world's (:data:`acetools_course.lesson_worlds.TEXT_CLAIM_WORLDS`)."""
    return name in TEXT_CLAIM_WORLDS.values()


def is_analogue(claim_id: str, world_name: str) -> bool:
    """A vision or ESM claim judged on the text world: the text world stands in for the papers'
    vision setting (an analogue, labelled so); a language claim there, or any claim on a vision
    world, is judged in its own setting."""
    return is_text_world_name(world_name) and claim_id not in LANGUAGE_CLAIMS


def claim(claim_id: str) -> Claim:
    """The registered claim ``claim_id`` (KeyError listing the valid ids otherwise)."""
    try:
        return _BY_ID[claim_id]
    except KeyError:
        raise InputKeyError(f"unknown claim id {claim_id!r}; valid ids: {sorted(_BY_ID)}") from None


def record(figures_dir: str | os.PathLike, claim_id: str, measured: str | Verdict, verdict: str | None = None,
           reason: str | None = None, *, world: World | None = None, show_verdict: bool = True,
           measured_effect: float | None = None, **numbers: Any) -> dict[str, Any]:
    """Store our measurement of ``claim_id`` in ``<figures_dir>/claims.json`` and show the verdict.

    ``record(fig_dir, claim_id, v, world=w, **extra)`` with a :class:`~acetools_course.verdicts.Verdict`,
    or ``record(fig_dir, claim_id, measured, verdict, reason, world=w, **numbers)``. A file holds one
    world's claims; re-recording replaces the entry. Returns the entry."""
    c = claim(claim_id)
    if not isinstance(world, World):
        raise InputTypeError(f"record({claim_id!r}): world= must be the World the claim was judged in, got {world!r}")
    if isinstance(measured, Verdict):
        if verdict is not None or reason is not None:
            raise InputTypeError("record(fig_dir, claim_id, Verdict, **numbers) takes no verdict= or reason=")
        v = measured
    else:
        if verdict not in VERDICTS:
            raise InputError(f"verdict {verdict!r} must be one of {VERDICTS}")
        if reason is None:
            raise InputTypeError(f"record({claim_id!r}): a reason is required")
        v = Verdict(measured, verdict, reason, {}, (), measured_effect)
    if measured_effect is not None and v.value is None and not v.effects:
        v = Verdict(v.measured, v.verdict, v.reason, v.numbers, v.effects, float(measured_effect))
    v = power_rule(v)  # the one rule of every comparative claim (docs/course.md §One rule, (V.7))
    folder = Path(figures_dir)
    path = folder / "claims.json"
    entries = json.loads(path.read_text()) if path.is_file() else {}
    for other in entries.values():
        w = other.get("world") or {}
        if (w.get("name"), w.get("profile")) != (world.name, world.profile):
            raise MixedWorldsError(
                f"{path} holds {other['id']} judged in world {w.get('name')!r} ({w.get('profile')} profile); "
                f"{claim_id} is judged in {world.name!r} ({world.profile}): one file, one world — use another "
                f"figures folder")
    entry = {"id": c.id, "paper": c.paper, "claim": c.text, "measured": v.measured, "verdict": v.verdict,
             "reason": v.reason, **v.record_fields(), "numbers": {**v.numbers, **numbers}, "notebook": folder.name,
             "world": world.as_dict(),
             "recorded": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")}
    entries[c.id] = entry
    folder.mkdir(parents=True, exist_ok=True)
    with atomic_write(path, "w") as fh:
        json.dump(entries, fh, indent=1, sort_keys=True, default=str)
    if show_verdict:
        show(entry)
    else:
        log.info("[%s] %s: %s — %s", v.verdict, c.id, v.measured, v.reason)
    return entry


def show(entry: dict[str, Any]) -> None:
    """Show a recorded verdict once: a Markdown line in a notebook (it wraps at word
    boundaries), the ``acetools_course.claims`` log elsewhere."""
    text = f"[{entry['verdict']}] {entry['id']}: {entry['measured']} — {entry['reason']}"
    try:
        from IPython.core.getipython import get_ipython

        shell = get_ipython()
    except ImportError:  # pragma: no cover - IPython is a course dependency
        shell = None
    if shell is None:
        log.info(text)
        return
    from IPython.core.display import Markdown
    from IPython.display import display

    def esc(s: str) -> str:
        return s.replace("*", "\\*").replace("_", "\\_").replace("<", "&lt;")

    display(Markdown(f"**{entry['verdict']}** · `{entry['id']}`: {esc(entry['measured'])} — *{esc(entry['reason'])}*"))


def _world_of(entry: dict[str, Any], path: Path) -> dict[str, Any]:
    w = entry.get("world")
    if not isinstance(w, dict) or "name" not in w or "profile" not in w:
        raise InputError(f"{path}: claim {entry.get('id')!r} records no world (name, profile); rerun its notebook")
    return w


def collect(figures_root: str | os.PathLike, *, allow_mixed: bool = False) -> dict[tuple[str, str], dict[str, Any]]:
    """Every ``claims.json`` under ``figures_root`` (one level down), keyed by ``(world name,
    claim id)``: a claim is judged per world, and two worlds' verdicts of one claim are two
    records. Raises :class:`MixedWorldsError` when a fixture world's records (the quick
    profile's, numbers for checking the code) sit beside a real world's, unless
    ``allow_mixed``."""
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for path in sorted(Path(figures_root).glob("*/claims.json")):
        for cid, e in json.loads(path.read_text()).items():
            w = _world_of(e, path)
            out[w["name"], cid] = {**e, "file": str(path)}
    fixture = {k[0] for k, e in out.items() if e["world"].get("fixture")}
    real = {k[0] for k, e in out.items() if not e["world"].get("fixture")}
    if fixture and real and not allow_mixed:
        files = sorted({Path(e["file"]).parent.name for k, e in out.items() if e["world"].get("fixture")})
        raise MixedWorldsError(f"{figures_root} mixes fixture-world claims ({', '.join(sorted(fixture))}: "
                               f"{', '.join(files)}) with claims of {', '.join(sorted(real))}: a fixture world's "
                               "numbers check the code and are not results; read the quick profile's figures folder "
                               "on its own")
    return out


def claims_table(figures_root: str | os.PathLike, *, records: Mapping[tuple[str, str], dict[str, Any]] | None = None):
    """One row per registered claim and world that judged it: id, paper, claim, owner notebook,
    world, profile, ``analogue`` (:func:`is_analogue`), our measurement, verdict, reason, and the
    effect fields (:data:`RECORD_FIELDS`); a claim no world judged yet is one row ``not
    measured``. ``records``: already gathered records (:func:`gather`) instead of
    :func:`collect` of ``figures_root``."""
    import pandas as pd

    got = collect(figures_root) if records is None else records
    rows = []
    for c in CLAIMS:
        mine = [e for (w, cid), e in got.items() if cid == c.id]
        if not mine:
            rows.append({"id": c.id, "paper": c.paper, "claim": c.text, "notebook": c.notebook, "world": "",
                         "profile": "", "analogue": False, "measured": "", "verdict": "not measured",
                         "reason": f"run {c.notebook} first", **{f: None for f in RECORD_FIELDS}})
        for e in mine:
            rows.append({"id": c.id, "paper": c.paper, "claim": c.text, "notebook": c.notebook,
                         "world": e["world"]["name"], "profile": e["world"]["profile"],
                         "analogue": is_analogue(c.id, e["world"]["name"]), "measured": e["measured"],
                         "verdict": e["verdict"], "reason": e["reason"], **{f: e.get(f) for f in RECORD_FIELDS}})
    return pd.DataFrame(rows)


def verdict_counts(table: Any, *, split_analogues: bool = False):
    """Lesson 05's count: claims per world and verdict, every one of the five words a column
    (zeros kept), ``not measured`` last where any claim lacks a verdict. ``split_analogues``:
    a world's analogues (:func:`is_analogue`, a table's ``analogue`` column) get their own row,
    ``<world> · analogues``."""
    import pandas as pd

    cols = list(VERDICTS) + (["not measured"] if (table["verdict"] == "not measured").any() else [])
    world = table["world"].replace("", "(none)")
    if split_analogues and "analogue" in table:
        world = world.where(~table["analogue"].astype(bool), world + " · analogues")
    out = pd.crosstab(world.rename("world"), table["verdict"]).reindex(columns=cols, fill_value=0)
    out["all"] = out.sum(axis=1)
    return out


@dataclass(frozen=True)
class Gathered:
    """Lesson 05's reading of every ``claims.json`` (:func:`gather`): the ``records`` it counts
    (keyed as :func:`collect`'s), the world names among them (vision worlds first), and one
    sentence per thing a reader must know about what is there: a text world missing, from a
    fixture, or left out."""

    records: dict[tuple[str, str], dict[str, Any]]
    worlds: list[str]
    notes: list[str]


def _folders(records: Mapping[tuple[str, str], dict[str, Any]], names: set[str]) -> str:
    return ", ".join(sorted({Path(e["file"]).parent.name for (w, _), e in records.items() if w in names}))


def gather(figures_root: str | os.PathLike) -> Gathered:
    """Every ``claims.json`` under ``figures_root`` (:func:`collect`), ready to show the vision and
    the text world side by side. A fixture world's records (the quick profile's) beside a real
    world's are left out, never counted with them, and a note says which and from where. Notes
    also say when no text world's claims are there (run lesson 07, and 02-04 with
    ``world="text8"``), and when the text world's claims come from the fixture text world."""
    got = collect(figures_root, allow_mixed=True)
    fixture = {w for (w, _), e in got.items() if e["world"].get("fixture")}
    real = {w for (w, _), e in got.items() if not e["world"].get("fixture")}
    notes = []
    if fixture and real:
        notes.append(f"Left out: the claims of {', '.join(sorted(fixture))} ({_folders(got, fixture)}), a fixture "
                     "world's (the quick profile's numbers check the code, they are not results), not counted "
                     f"beside those of {', '.join(sorted(real))}.")
        got = {k: e for k, e in got.items() if k[0] in real}
    worlds = sorted({w for w, _ in got}, key=lambda w: (is_text_world_name(w), w))
    text = [w for w in worlds if is_text_world_name(w)]
    if not text:
        notes.append(f"No text world's claims under {Path(figures_root).name}/: run 07_language (and 02-04 with "
                     "world='text8') in this profile to judge them; only the vision world is shown.")
    for w in text:
        fx = any(e["world"].get("fixture") for (name, _), e in got.items() if name == w)
        where = _folders(got, {w})
        notes.append(f"The text world's claims ({w!r}) come from {where}"
                     + (": the fixture text world of the quick profile, numbers for checking the code, not results."
                        if fx else "."))
    return Gathered(got, worlds, notes)


def side_by_side(table: Any):
    """Lesson 05's comparison of the worlds: one row per claim judged on two or more worlds
    (:func:`claims_table` rows), one column per world with its verdict, an analogue labelled
    ``<verdict> (analogue)`` (:func:`is_analogue`); ``id``, ``paper`` and the claim first."""
    import pandas as pd

    t = table[table["world"] != ""]
    worlds = sorted(set(t["world"]), key=lambda w: (is_text_world_name(w), w))
    both = t.groupby("id")["world"].nunique()
    ids = [c.id for c in CLAIMS if both.get(c.id, 0) >= 2]
    rows = []
    for cid in ids:
        mine = t[t["id"] == cid].set_index("world")
        row = {"id": cid, "paper": claim(cid).paper}
        for w in worlds:
            if w in mine.index:
                v = mine.loc[w, "verdict"]
                row[w] = f"{v} (analogue)" if is_analogue(cid, w) else v
            else:
                row[w] = "—"
        rows.append(row)
    return pd.DataFrame(rows, columns=["id", "paper", *worlds])


def styled_table(table: Any) -> Any:
    """Lesson 05's view of :func:`claims_table`: id, paper, notebook, verdict (coloured as in
    :data:`acetools_course.lesson04_benchmark.VERDICT_COLORS`), measurement and reason, left-aligned."""
    from .lesson04_benchmark import VERDICT_COLORS

    show_cols = table[["id", "paper", "world", "verdict", "predicted_effect", "noise_floor", "measured_effect",
                       "measured", "reason"]]
    if "analogue" in table:  # a vision or ESM claim judged on the text world says so
        show_cols = show_cols.assign(world=show_cols["world"].where(~table["analogue"].astype(bool),
                                                                    show_cols["world"] + " (analogue)"))
    colours = [f"background-color: {VERDICT_COLORS.get(v, '#ffffff')}" for v in show_cols["verdict"]]
    return (show_cols.style.hide(axis="index")
            .format({c: lambda x: "—" if x is None or x != x else f"{x:+.2f}"
                     for c in ("predicted_effect", "noise_floor", "measured_effect")})
            .apply(lambda col: colours, subset=["verdict"], axis=0)
            .set_properties(subset=["measured", "reason"], **{"text-align": "left"}))


def claim_world(*, quick: bool, bench: Any = None, results_dir: str | os.PathLike | None = None,
                size: str = "small", summary: Any = None, kind: str = "mini", description: str | None = None,
                heads: str = "zeroshot"):
    """The :class:`~acetools_course.verdicts.World` a notebook judges its claims in (docs/course.md §Scaling rule).

    Full profile: the mini-world, its room from the committed benchmark files (``results_dir``) or
    ``summary``; quick: the fixture world, its room measured on ``bench`` or from ``summary`` (none:
    claims are decided on their measurements). A text ``kind`` gives the text world's claim world,
    named after its head protocol ``heads`` ("zeroshot" or "trained")."""
    if is_text_world(kind):
        profile = "quick" if quick else "full"
        key = profile if heads == "zeroshot" else f"{profile} {heads}"
        if key not in TEXT_CLAIM_WORLDS:
            raise InputError(f"heads={heads!r}: choose 'zeroshot' or 'trained'")
        return _text_claim_world(quick=quick, bench=bench, results_dir=results_dir, summary=summary,
                                 suite=protocol_tag(text_suite(kind), heads),
                                 description=description, name=TEXT_CLAIM_WORLDS[key])
    if quick:
        desc = description or "the quick profile's fixture world: numbers for checking the code, not results"
        return _quick_world("fixture", desc, bench, summary)
    desc = description or f"the vision mini-world (small ViT, suites tasks8/14/20, model size {size})"
    if summary is None:
        from acetools import results

        folder = Path(results_dir) if results_dir is not None else repo_root() / "figures" / "benchmark"
        runs = results.find_results(folder, None, size)
        if not runs:
            raise FileNotFoundError(f"no benchmark results (*_{size}_seed*_summary.csv) in {folder.resolve()}: the "
                                    "mini-world's room comes from them (bash benchmarks/mini_world.sh)")
        summary = results.load_summary(runs)
    return World.from_summary(summary, "mini-world", "full", description=desc)


def _quick_world(name: str, desc: str, bench: Any, summary: Any):
    """A quick profile's fixture claim world: its room from ``summary``, or measured on ``bench``
    (task arithmetic and TSV-M with their coefficients on validation), or none."""
    import numpy as np

    if summary is not None:
        return World.from_summary(summary, name, "quick", fixture=True, description=desc)
    if bench is None:
        return World(name, "quick", fixture=True, description=desc)
    runs = {m: bench.run(m) for m in ("task_arithmetic", "tsv_m")}
    n = len(bench.tasks)

    def mean(r, attr):
        return 100 * float(np.mean(list(getattr(r, attr).values())))

    return World(name, "quick", {n: mean(runs["tsv_m"], "test_normalized")
                                 - mean(runs["task_arithmetic"], "test_normalized")},
                 fixture=True, description=desc,
                 room_abs={n: mean(runs["tsv_m"], "test") - mean(runs["task_arithmetic"], "test")})


def _text_claim_world(*, quick: bool, bench: Any, results_dir: Any, summary: Any, suite: str,
                      description: str | None, name: str):
    if quick:
        desc = description or ("the quick profile's fixture text world (MiniLM's first layer, three small tasks): "
                               "numbers for checking the code, not results")
        return _quick_world(name, desc, bench, summary)
    if summary is None:
        from .lesson07_language import benchmark_tables

        folder = Path(results_dir) if results_dir is not None else repo_root() / "figures" / "benchmark"
        summary, _ = benchmark_tables(folder, suite)
    desc = description or f"the text world {suite!r} (all-MiniLM-L6-v2 experts on real offline text tasks)"
    return World.from_summary(summary, name, "full", description=desc)
