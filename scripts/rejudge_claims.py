"""Re-decide the committed claims from the numbers they already hold, with today's rules.

The course's verdict rules change (the fifth verdict "undecidable here", the papers' own rival
sets, the stage claims decided where the stage runs); the measurements behind the committed
``figures/<notebook>/claims.json`` do not. :func:`rejudge` applies today's rules to what the
committed files hold — the benchmark's result files for notebook 04's claims, the numbers each
claim record stores for the others — without training or merging anything, and rewrites the
records with the world they were judged in. What the stored numbers cannot decide under a new
rule (a measurement the notebook now makes and did not then) is said in the record:
``numbers["pending_rerun"]`` and the reason name the rerun that would decide it.

    python3 scripts/rejudge_claims.py            # rewrite figures/*/claims.json, print what changed
    python3 scripts/rejudge_claims.py --check    # exit 1 if a committed verdict differs from today's rules

Every notebook run (``acetools report --profile full``) decides its claims afresh; this script
only carries the committed verdicts across a change of rules (tests/test_rejudge_claims.py).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from acetools.errors import InputError
from acetools_course import claims as C
from acetools_course.power import load_stage_results, stage_difference
from acetools_course.verdicts import Effect, Verdict, World, power_rule

REPO = Path(__file__).resolve().parents[1]

#: The reruns the committed numbers wait for, by claim id, while a record is still from before
#: them (:func:`pending_rerun`).
PENDING: dict[str, str] = {
    "ace.csp": "notebook 02 at the paper's eps 1e-5 with the ridge/prior sizes (the committed run is at the code "
               "default eps 1e-2, where the ridge may swamp the prior)",
    "ace.spectrum": "notebook 02 at the paper's eps 1e-5 (the committed run is at the code default eps 1e-2)",
    "ace.refinement": "notebook 02 with the gate forced (refined - not refined on every layer; the committed run "
                      "refines the 2 of 26 flagged matrices only)",
    "ace.normalization": "notebook 02 at the paper's eps 1e-5",
}


#: Text that :func:`rejudge` appends to a reason it carries over; cut before appending again.
_MARKS: tuple[str, ...] = (" (decided at the code default eps", "; pending rerun:")


def _base(text: str) -> str:
    for m in _MARKS:
        if m in text:
            text = text[: text.index(m)]
    return text


def _carried(e: Mapping[str, Any], value: Any = None, *, reason: str | None = None, seeds: int | None = None
             ) -> Verdict:
    """A committed record's verdict carried over as it stands (its stored numbers cannot decide
    it again, or today's rule for it is the one it was decided with), with its stored effects (their
    margins and standard errors); ``reason`` replaces the stored one; ``seeds`` the expert seeds its settings rest
    on, where the stored effects do not say (a stage ablation's one)."""
    keep = ("setting", "paper", "paper_room", "world_room", "predicted", "floor", "measured", "se", "seeds")
    effects = [Effect(**{**{k: x.get(k) for k in keep}, **({"seeds": seeds} if x.get("seeds") is None else {})})
               for x in e.get("effects") or []]
    return Verdict(e["measured"], e["verdict"], e["reason"] if reason is None else reason, dict(e["numbers"]),
                   effects, value=value)


def _per_suite(numbers: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The per-suite dicts a stage claim's numbers hold (``{suite: {"suite": ..., ...}}``)."""
    return [dict(v) for v in numbers.values() if isinstance(v, dict) and "suite" in v]


def _at_paper_eps(numbers: Mapping[str, Any], paper_eps: float) -> bool:
    """Whether a record was decided at ``paper_eps``, its world's family's (``claims.paper_setting``)."""
    eps = numbers.get("eps")
    return eps is not None and abs(float(eps) - paper_eps) <= 1e-12


def _n_tasks(suite: str) -> int:
    """The number of tasks of a vision or text suite (the T the paper's effects are scaled at)."""
    from acetools.world.text.tasks import SUITES as TEXT_SUITES
    from acetools.world.vision.data import SUITES as VISION_SUITES

    return len({**VISION_SUITES, **TEXT_SUITES}[suite])


def pending_rerun(claim_id: str, entry: Mapping[str, Any]) -> str | None:
    """The rerun (:data:`PENDING`) that ``entry``, a committed record of ``claim_id``, still waits
    for, or None: notebook 02's stage claims wait until a run decided them at the paper's eps for the record's
    world (``numbers["eps"]`` = 1e-5 in a vision world, 2e-4 in the text world) and, for refinement, with the gate
    forced where ACE's gate flags few layers (its per-suite numbers carry ``gate_forced``)."""
    from acetools_course.claims import paper_setting

    if claim_id not in PENDING:
        return None
    n = entry.get("numbers") or {}
    if claim_id == "ace.refinement":
        done = any("gate_forced" in s for s in _per_suite(n))
    else:
        done = _at_paper_eps(n, paper_setting((entry.get("world") or {}).get("name")).eps)
    return None if done else PENDING[claim_id]


def _ace_from_files(per: list[dict[str, Any]], claim_id: str, folder: Path | None) -> list[dict[str, Any]]:
    """Notebook 02's per-suite stage differences (the fields of
    ``acetools_course.lesson02_ace_step_by_step.ablation_effects``) with each ``d…`` and its ``se…``
    recomputed from the suite's committed per-example results in the notebook's ``folder``
    (``02_ace_step_by_step[-<world>]/ablation_<suite>_correct.npz``) where they exist; the stored ones elsewhere."""
    from acetools_course import lesson02_ace_step_by_step as L

    pairs = {"ace.normalization": {"auto": (L.NO_REFINE, L.GATE_OFF), "forced": (L.GATE_ON_NO_REFINE, L.GATE_OFF)},
             "ace.csp": {"": (L.FULL, L.NO_PRIOR)}}[claim_id] if claim_id != "ace.refinement" else None
    out = []
    for s in per:
        files = None if folder is None else load_stage_results(folder, f"ablation_{s['suite']}")
        if files is None:
            out.append(s)
            continue
        hits, experts = files
        want = pairs or ({"": (L.GATE_ON, L.GATE_ON_NO_REFINE)} if s.get("gate_forced")
                         else {"": (L.FULL, L.NO_REFINE)})
        new = dict(s)
        for tag, (a, b) in want.items():
            d, se = stage_difference(hits, experts, f"{s['suite']}|{a}", f"{s['suite']}|{b}")
            new["d" + (f"_{tag}" if tag else "")], new["se" + (f"_{tag}" if tag else "")] = d, se
        if claim_id == "ace.refinement" and s.get("gate_forced"):
            new["d_ace_gate"] = stage_difference(hits, experts, f"{s['suite']}|{L.FULL}",
                                                 f"{s['suite']}|{L.NO_REFINE}")[0]
        out.append(new)
    return out


def _ace_verdicts(entries: Mapping[str, Any], world: World, figures_root: Path | None = None,
                  folder: str = "02_ace_step_by_step") -> dict[str, Verdict]:
    """Notebook 02's claims (recorded in ``folder``: the mini-world's, or ``02_ace_step_by_step-text8``) from their
    stored numbers and per-example results. A record decided at the paper's eps for the world's model family
    (:func:`acetools_course.claims.paper_setting`; a notebook run since issue 23) keeps that eps, its ridge/prior
    size and the code default's verdict beside it; an older one is decided at the code default eps 1e-2 it was
    measured at."""
    from acetools_course import lesson02_ace_step_by_step as A
    from acetools_course.claims import paper_setting

    out: dict[str, Verdict] = {}
    setting = paper_setting(world.name)
    root = None if figures_root is None else figures_root / folder
    fresh = {cid: _at_paper_eps(e["numbers"], setting.eps) for cid, e in entries.items()}
    if "ace.normalization" in entries:
        out["ace.normalization"] = A.verdict_normalization(
            _ace_from_files(_per_suite(entries["ace.normalization"]["numbers"]), "ace.normalization", root))
    if "ace.csp" in entries:
        n = entries["ace.csp"]["numbers"]
        per = _ace_from_files(_per_suite(n), "ace.csp", root)
        if fresh["ace.csp"]:
            out["ace.csp"] = A.verdict_csp(per, ridge_over_prior=n.get("ridge_over_prior"), eps=n["eps"])
        else:
            out["ace.csp"] = A.verdict_csp(per, eps=1e-2)
    if "ace.refinement" in entries:
        per = _ace_from_files(_per_suite(entries["ace.refinement"]["numbers"]), "ace.refinement", root)
        if not any("gate_forced" in s for s in per):  # a record from before the gate-forced rerun
            per = [{**s, "what": "full - no refinement (ACE's gate: the flagged matrices only)"} for s in per]
        out["ace.refinement"] = A.verdict_refinement(per, world=world,
                                                     n_tasks={s["suite"]: _n_tasks(s["suite"]) for s in per})
    if "ace.spectrum" in entries:
        e = entries["ace.spectrum"]
        n = {k: v for k, v in e["numbers"].items() if k != "pending_rerun"}
        import pandas as pd

        one = pd.DataFrame({"top_energy_pre": [n["median_top5_energy"]], "cond_pre_trim": [n["median_cond_trim"]],
                            "cond_pre": [n["median_cond_raw"]]})
        v = A.verdict_spectrum(one)
        out["ace.spectrum"] = Verdict(e["measured"], v.verdict, _base(e["reason"]), n, value=v.value)
    for cid, key in (("ace.gamma_vit", "median_gamma"), ("ace.direction", "median_cos_hooked")):
        if cid in entries:
            e = entries[cid]
            out[cid] = _carried(e, e["numbers"].get(key), reason=_base(e["reason"]))
    for cid in ("ace.normalization", "ace.csp", "ace.spectrum", "ace.refinement"):
        if cid not in out:
            continue
        n = entries[cid]["numbers"]
        if fresh[cid]:
            if cid != "ace.spectrum":  # its stored reason already says so
                out[cid] = A.decided_at(out[cid], n["eps"], setting.family)
                if isinstance(n.get("beside"), dict):
                    out[cid] = A.with_beside(out[cid], n["beside"])
        elif cid != "ace.refinement":
            out[cid] = out[cid].with_reason(_base(out[cid].reason) + " (decided at the code default eps 1e-2)",
                                            eps=1e-2)
    return out


#: Notebook 03's ablation-grid claims: the rows each gain compares
#: (``acetools_course.lesson03_esm_step_by_step.ablation_verdicts``), by the prefix of the record's numbers
#: that holds it per suite (``<prefix><suite>``, its ``se_`` beside).
ESM_PAIRS: dict[str, dict[str, tuple[str, str]]] = {
    "esm.esd_alone": {"gain_": ("ESD, no scaling", "TSV-M")},
    "esm.ps_on_svd": {"gain_": ("SVD, all levels", "TSV-M")},
    "esm.layer_first": {"layer_gain_": ("ESD, layer only", "ESD, no scaling"),
                        "all_gain_": ("ESD, all levels", "ESD, no scaling")},
    "esm.reciprocal": {"drop_": ("ESD, all levels", "ESD, reciprocal (-1)")},
}


def _esm_from_files(numbers: Mapping[str, Any], claim_id: str, folder: Path | None) -> dict[str, Any]:
    """A notebook-03 ablation claim's numbers with each suite's gain and paired standard error recomputed from the
    grid's committed per-example results in the notebook's ``folder`` (``ablation_grid_correct.npz``, absolute
    points) where they exist; the stored numbers otherwise."""
    from acetools_course.lesson03_esm_step_by_step import TSV_M_ROW

    files = None if folder is None else load_stage_results(folder, "ablation_grid")
    if files is None or claim_id not in ESM_PAIRS:
        return dict(numbers)
    hits, _ = files
    out = dict(numbers)
    for prefix, (a, b) in ESM_PAIRS[claim_id].items():
        a, b = (TSV_M_ROW if r == "TSV-M" else r for r in (a, b))
        se_key = "se_all_" if prefix == "all_gain_" else "se_"
        for k in [k for k in numbers if k.startswith(prefix) and not k.startswith(prefix + "vs_")]:
            suite = k[len(prefix):]
            out[k], out[se_key + suite] = stage_difference(hits, None, f"{suite}|{a}", f"{suite}|{b}")
    return out


def _proxy_from_files(folder: Path | None) -> tuple[dict[str, float], dict[str, Any]] | None:
    """Notebook 03's proxy study from its committed per-example results (``proxy_correct.npz`` in the notebook's
    ``folder``): each run's test accuracy (%, the mean over tasks) and its per-task correctness, by run label; None
    where not committed."""
    import numpy as np

    files = None if folder is None else load_stage_results(folder, "proxy")
    if files is None:
        return None
    hits = {k.split("|", 1)[1]: v for k, v in files[0].items()}
    return {k: 100 * float(np.mean([h.mean() for h in v.values()])) for k, v in hits.items()}, hits


def _esm_verdicts(entries: Mapping[str, Any], world: World, figures_root: Path | None = None,
                  folder: str = "03_esm_step_by_step") -> dict[str, Verdict]:
    """Notebook 03's claims (recorded in ``folder``: the mini-world's, or ``03_esm_step_by_step-text8``) from their
    stored numbers and per-example results."""
    from acetools_course import lesson03_esm_step_by_step as E

    out: dict[str, Verdict] = {}
    root = None if figures_root is None else figures_root / folder
    entries = {cid: {**e, "numbers": _esm_from_files(e["numbers"], cid, root)} for cid, e in entries.items()}

    def suites_of(nums: Mapping[str, Any], prefix: str) -> dict[str, float]:
        return {k[len(prefix):]: float(v) for k, v in nums.items()
                if k.startswith(prefix) and not k.startswith(prefix + "vs_")}

    def ses(nums: Mapping[str, Any], prefix: str = "se_") -> dict[str, float | None]:
        """The paired standard errors a record keeps per suite: ``se_<suite>`` (or ``se_all_<suite>``)."""
        other = "se_all_" if prefix == "se_" else None
        return {k[len(prefix):]: v for k, v in nums.items()
                if k.startswith(prefix) and not (other and k.startswith(other))}

    for cid, what in (("esm.esd_alone", "ESD (no scaling) minus TSV-M"), ("esm.ps_on_svd",
                                                                          "SVD with all levels minus TSV-M")):
        if cid in entries:
            e = entries[cid]
            g = suites_of(e["numbers"], "gain_")
            v = E.verdict_gain(g, what, e["measured"], ses(e["numbers"]))
            inpipe = {k: v_ for k, v_ in e["numbers"].items() if k.startswith("gain_vs_inpipeline_svd_")}
            v = Verdict(v.measured, v.verdict, v.reason, {**e["numbers"], **v.numbers, **inpipe})
            out[cid] = E._with_effects(v, cid, g, world, {s: _n_tasks(s) for s in g}, se=ses(e["numbers"]))
    if "esm.layer_first" in entries:
        e = entries["esm.layer_first"]
        lg, ag = suites_of(e["numbers"], "layer_gain_"), suites_of(e["numbers"], "all_gain_")
        v = E.verdict_layer_first(lg, ag, e["measured"], ses(e["numbers"]), ses(e["numbers"], "se_all_"))
        v = Verdict(v.measured, v.verdict, v.reason, {**e["numbers"], **v.numbers})
        out["esm.layer_first"] = E._with_effects(v, "esm.layer_first", lg, world, {s: _n_tasks(s) for s in lg},
                                                 se=ses(e["numbers"]))
    if "esm.reciprocal" in entries:
        e = entries["esm.reciprocal"]
        d = suites_of(e["numbers"], "drop_")
        v = E.verdict_reciprocal(d, measured=e["measured"], se=ses(e["numbers"]))
        v = Verdict(v.measured, v.verdict, v.reason, {**e["numbers"], **v.numbers})
        out["esm.reciprocal"] = E._with_effects(v, "esm.reciprocal", d, world, {s: _n_tasks(s) for s in d},
                                                se=ses(e["numbers"]))
    proxy = _proxy_from_files(root)  # the proxy study's per-example results, where committed
    if "esm.proxy" in entries:
        n = entries["esm.proxy"]["numbers"]
        acc = {k: float(v) for k, v in n.items() if k != "diffs"}
        if proxy is not None:
            acc = {k: proxy[0][k] for k in acc}
        # the variants the run compared (the text world has no pretraining pool)
        out["esm.proxy"] = E.verdict_proxy(acc, others=list(n["diffs"]))
    if "esm.four" in entries:
        n = entries["esm.four"]["numbers"]
        if proxy is not None:
            from acetools_course.lesson03_esm_step_by_step import TSV_M_ROW

            acc, hits = proxy
            n = {"esm_4_samples": acc["4 samples"], "tsv_m": acc[TSV_M_ROW], "svd_inpipeline": acc["SVD, no scaling"],
                 "se": E.paired_se(hits["4 samples"], hits[TSV_M_ROW])}
        out["esm.four"] = E.verdict_four(n["esm_4_samples"], n["tsv_m"], n.get("svd_inpipeline"), se=n.get("se"))
    # the ESD-vs-SVD and norm-order comparisons, which the paper states without a number: re-decided from the
    # numbers their records keep (the norm order from its per-example results where committed), one setting each
    if "esm.energy" in entries:
        out["esm.energy"] = E.energy_verdict(entries["esm.energy"]["numbers"], entries["esm.energy"]["measured"])
    if "esm.cka" in entries:
        out["esm.cka"] = E.cka_verdict(entries["esm.cka"]["numbers"], entries["esm.cka"]["measured"])
    if "esm.norm_importance" in entries:
        n = dict(entries["esm.norm_importance"]["numbers"])
        files = None if root is None else load_stage_results(root, "norm_order")
        if files is not None:
            hits, experts = files
            if experts is None:
                raise InputError(f"{root}: norm_order_correct.npz lacks its norm_order_experts.json (the scale of "
                                 "normalized points); rerun lesson 03 in full")
            n.update(E.norm_gaps(hits, experts))
        out["esm.norm_importance"] = E.norm_gaps_verdict(n)
    return out


def _theorem1_verdicts(entries: Mapping[str, Any], world: World) -> dict[str, Verdict]:
    import numpy as np

    out: dict[str, Verdict] = {}
    for cid in entries:
        e, n = entries[cid], entries[cid]["numbers"]
        if cid == "ace.theorem1":
            val = n["cosine"]
        elif cid == "ace.theorem1_vit":
            val = float(np.median(list(n["median_cosine"].values())))  # the median over layer types
        else:
            val = max(n["identity_vs_wa"], n["identity_route_vs_wa"])
        out[cid] = _carried(e, val)
    return out


def _benchmark_verdicts(figures_root: Path, world: World, folder: str = "04_benchmark",
                        kind: str = "mini", heads: str = "zeroshot") -> dict[str, Verdict]:
    """Notebook 04's claims from the benchmark's result files, as the notebook decides them with
    ``world=kind``: the mini-world's tables, or a text world's (its claims as analogues); ``heads="trained"``:
    the text world's trained-heads tables (:func:`_with_heads`)."""
    from acetools_course import lesson04_benchmark as bench_claims
    from acetools_course import lesson04_benchmark as lesson
    from acetools_course import lesson_worlds as course

    bd = lesson.load_benchmark(quick=False, suites=["tasks8", "tasks14", "tasks20"], size="small", suite="tasks8",
                               seed=0, results_dir=figures_root / "benchmark", figures_dir=figures_root / folder,
                               speed_dir=figures_root.parent / "benchmarks" / "results",
                               wudi_dir=figures_root / "benchmark", world_options=course.world_options(kind))
    out = bench_claims.claim_verdicts(_with_heads(bd, heads), world=world)
    if heads != "zeroshot":  # the merges' time does not depend on the heads: the cost claims are judged once, on
        for cid in TIMED:    # the zero-shot tables (04_benchmark-text8)
            out.pop(cid, None)
    return out


#: Notebook 04's claims about merge time, judged once per world's model (not again per head protocol).
TIMED: tuple[str, ...] = ("ace.cost", "esm.overhead")


def _with_heads(bd: Any, heads: str) -> Any:
    """Notebook 04's data on a text world (``bd``) with the result files of head protocol ``heads`` in place of
    the zero-shot heads' (``text8`` -> ``text8_trained``): the same methods, suite and paper columns."""
    if heads == "zeroshot":
        return bd
    import dataclasses

    from acetools import results
    from acetools.world.text.finetune import protocol_tag

    old = bd.main_suite
    suite = protocol_tag(old, heads)
    runs = results.require_results(bd.res_dir, [suite], bd.size)
    summary = results.load_summary(runs)
    agg = results.aggregate(summary)
    return dataclasses.replace(
        bd, suites=[suite], main_suite=suite, runs=runs, summary=summary, per_task=results.load_per_task(runs),
        agg=agg, n_tasks={suite: bd.n_tasks[old]}, paper_n={suite: bd.paper_n[old]},
        paper_cols={(t, suite): c for (t, s), c in bd.paper_cols.items() if s == old},
        methods=[m for m in dict.fromkeys(summary["method"]) if m in set(bd.methods) | set(summary["method"])
                 and m not in results.REFERENCES],
        seeds=sorted(int(x) for x in summary["seed"].unique()))


def _language_lesson(entries: Mapping[str, Any], world: World, figures_root: Path) -> dict[str, Verdict]:
    """Lesson 07's claims: the benchmark claim from the committed text tables, the spectrum from
    the committed regime card; γ and the stage ablation need the experts' weights, so their
    stored verdicts are carried over (a 07 run decides them afresh)."""
    from acetools.regime import RegimeCard
    from acetools.world.text.finetune import protocol_tag
    from acetools_course import lesson07_language as lang_claims
    from acetools_course import lesson07_language as lesson

    out: dict[str, Verdict] = {}
    suite = protocol_tag("text8", _heads(world.name))  # the tables of the head protocol the claims were judged in
    if "ace.language_sota" in entries:
        per_seed, _ = lesson.benchmark_tables(figures_root / "benchmark", suite)
        n_text = int(per_seed["n_tasks"].iloc[0])
        out["ace.language_sota"] = lang_claims.verdict_sota(per_seed, world=world, n_tasks=n_text,
                                                            folder=figures_root / "benchmark")
    if "ace.spectrum_language" in entries:
        card = RegimeCard.load(figures_root / "regime" / f"{suite}_seed0")
        out["ace.spectrum_language"] = lang_claims.verdict_spectrum(card.value("wpre_top5_energy"))
    if "ace.gamma_bert" in entries:  # γ needs the experts' weights: carried over
        out["ace.gamma_bert"] = _carried(entries["ace.gamma_bert"], entries["ace.gamma_bert"].get("measured_effect"))
    files = load_stage_results(figures_root / "07_language", "stage_ablation")
    for cid, (stage, without) in STAGE_NAMES.items():  # re-decided from their per-example results, else the
        if cid not in entries:                          # gains and paired standard errors their record keeps
            continue
        n = entries[cid]["numbers"]
        gains = {float(k): float(v) for k, v in n["gains"].items()}
        ses = {float(k): (None if v is None else float(v)) for k, v in (n.get("se") or {}).items()}
        if files is not None:
            hits, experts = files
            for e in gains:
                gains[e], ses[e] = stage_difference(hits, experts, f"eps {e:g}|gate on (forced)",
                                                    f"eps {e:g}|{without}")
        out[cid] = lang_claims.stage_verdict(gains, ses, stage, forced=bool(n.get("forced", True)))
    return out


#: Lesson 07's stage claims: the stage each measures (``stage`` of
#: ``acetools_course.lesson07_language.verdict_stage``) and the ablation row with it off (compared with
#: ``gate on (forced)``).
STAGE_NAMES: dict[str, tuple[str, str]] = {
    "ace.normalization_language": ("normalization", "gate on, no normalization"),
    "ace.csp_language": ("the prior", "gate on, no prior"),
    "ace.refinement_language": ("refinement", "gate on, no refinement")}


def inputs(folder: str, claim_id: str, figures_root: str | Path) -> list[Path]:
    """The committed files the verdict of ``claim_id`` (recorded in ``figures_root/folder``) is recomputed from by
    :func:`rejudge`: the benchmark's result files and per-example results for notebook 04's claims and the
    language lead, a stage ablation's per-example results (:data:`acetools_course.power.STAGE_RESULTS`) for a stage
    claim, the regime card for the language spectrum, and the record itself for a measurement it stores."""
    root = Path(figures_root)
    bench = root / "benchmark"

    def results_of(suites: tuple[str, ...], size: str) -> list[Path]:
        out = []
        for s in suites:
            for seed in (0, 1, 2):
                stem = bench / f"{s}_{size}_seed{seed}"
                out += [stem.with_name(stem.name + "_summary.csv"), stem.with_name(stem.name + "_correct.npz")]
        return [p for p in out if p.name.endswith("_summary.csv") or p.name.startswith(tuple(PER_EXAMPLE))]

    if folder == "04_benchmark":
        return results_of(("tasks8", "tasks14", "tasks20"), "small")
    if folder == "04_benchmark-text8":
        return results_of(("text8",), "minilm")
    if folder == TRAINED_FOLDER or claim_id == "ace.language_sota":  # the trained-heads tables
        return results_of(("text8_trained",), "minilm")
    if claim_id == "ace.spectrum_language":
        return [root / "regime" / "text8_trained_seed0" / "card.json"]
    names = STAGE_INPUTS.get(claim_id)
    if names and folder == "02_ace_step_by_step-text8":  # the text world's one suite
        names = ("ablation_text8",)
    if names:
        return [root / folder / f"{n}_correct.npz" for n in names]
    return [root / folder / "claims.json"]


#: The suites whose result files keep per-example results (tests/test_rejudge_claims.py
#: PER_EXAMPLE_SUITES): their ``_correct.npz`` are inputs too.
PER_EXAMPLE: tuple[str, ...] = ("tasks8_", "text8_minilm", "text8_trained")
#: The stage claims and the stage-ablation results (:data:`acetools_course.power.STAGE_RESULTS`) they are decided on.
STAGE_INPUTS: dict[str, tuple[str, ...]] = {
    **{c: ("ablation_tasks8", "ablation_tasks20") for c in ("ace.normalization", "ace.csp", "ace.refinement")},
    **{c: ("ablation_grid",) for c in ("esm.esd_alone", "esm.ps_on_svd", "esm.layer_first", "esm.reciprocal")},
    "esm.four": ("proxy", "ablation_grid"), "esm.proxy": ("proxy",), "esm.norm_importance": ("norm_order",),
    **{c: ("stage_ablation",) for c in STAGE_NAMES}}


def _language(entries: Mapping[str, Any], world: World) -> dict[str, Verdict]:
    e = entries["ace.language"]
    return {"ace.language": Verdict(e["measured"].replace("the mini-world has", "this world has"), e["verdict"],
                                    e["reason"], dict(e["numbers"]))}


#: Notebook 04's claims (ACE's and ESM's, as analogues) judged on the text world's trained-heads tables, the
#: world lesson 07 judges the language claims in: notebook 04 has no head-protocol parameter, so this script
#: writes the folder from the committed ``text8_trained`` result files where they hold ESM's rows.
TRAINED_FOLDER: str = "04_benchmark-text8_trained"

#: notebook folder -> how its claims are re-decided: ``rule(entries, world, figures_root)``.
RULES: dict[str, Callable[[Mapping[str, Any], World, Path], dict[str, Verdict]]] = {
    "01_theorem1": lambda entries, world, root: _theorem1_verdicts(entries, world),
    "02_ace_step_by_step": _ace_verdicts,
    "03_esm_step_by_step": _esm_verdicts,
    "04_benchmark": lambda entries, world, root: _benchmark_verdicts(root, world),
    "05_claims": lambda entries, world, root: _language(entries, world),
    "04_benchmark-text8": lambda entries, world, root: _benchmark_verdicts(root, world, "04_benchmark-text8", "text8"),
    TRAINED_FOLDER: lambda entries, world, root: _benchmark_verdicts(root, world, TRAINED_FOLDER, "text8", "trained"),
    "07_language": _language_lesson,
    "02_ace_step_by_step-text8": lambda entries, world, root: _ace_verdicts(entries, world, root,
                                                                            "02_ace_step_by_step-text8"),
    "03_esm_step_by_step-text8": lambda entries, world, root: _esm_verdicts(entries, world, root,
                                                                            "03_esm_step_by_step-text8"),
}
#: The folders judged in the text world (its room from the text tables), not the mini-world.
TEXT_FOLDERS: frozenset[str] = frozenset({"04_benchmark-text8", TRAINED_FOLDER, "07_language",
                                          "02_ace_step_by_step-text8", "03_esm_step_by_step-text8"})


def _trained_tables_hold_esm(figures_root: Path) -> bool:
    """Whether the committed trained-heads tables (``text8_trained_minilm_seed*_summary.csv``) hold ESM's rows."""
    import pandas as pd

    files = sorted((figures_root / "benchmark").glob("text8_trained_minilm_seed*_summary.csv"))
    return bool(files) and all("esm" in set(pd.read_csv(f)["method"]) for f in files)


def _heads(world_name: str | None) -> str:
    """The head protocol a text claim world's name stands for, read back from the names ``claim_world`` gives
    (:data:`acetools_course.claims.TEXT_CLAIM_WORLDS`: key ``"<profile>"`` for zero-shot heads, ``"<profile> <heads>"``
    otherwise); "zeroshot" for a name it does not give."""
    key = next((k for k, v in C.TEXT_CLAIM_WORLDS.items() if v == world_name), "")
    return key.partition(" ")[2] or "zeroshot"


def rejudge(figures_root: str | Path, *, world: World | None = None, write: bool = True) -> list[dict[str, Any]]:
    """Re-decide every committed claim under ``figures_root`` with today's rules.

    ``world``: the world the committed numbers come from (default: the mini-world, its room
    from ``<figures_root>/benchmark``). Returns one row per claim: ``id, notebook, before,
    after, changed`` and the reason; with ``write`` each ``claims.json`` is rewritten (atomically,
    through :func:`acetools_course.claims.record`), with ``numbers["pending_rerun"]`` where
    a record still waits for the rerun :data:`PENDING` names (:func:`pending_rerun`)."""
    figures_root = Path(figures_root).resolve()
    mini = world or C.claim_world(quick=False, results_dir=figures_root / "benchmark")
    rows = []
    for folder, rule in RULES.items():
        path = figures_root / folder / "claims.json"
        if folder == TRAINED_FOLDER and not path.is_file() and _trained_tables_hold_esm(figures_root):
            entries = {}  # judged afresh in the trained-heads world (its name and description come from the tables)
            recorded = {"name": C.TEXT_CLAIM_WORLDS["full trained"]}
        elif not path.is_file():
            continue
        else:
            entries = json.loads(path.read_text())
            recorded = next(iter(entries.values()), {}).get("world", {})
        if folder in TEXT_FOLDERS:  # the text world's room, from the committed tables of its head protocol
            world = C.claim_world(quick=False, results_dir=figures_root / "benchmark", kind="text8",
                                  description=recorded.get("description"), heads=_heads(recorded.get("name")))
        else:
            world = mini
        new = rule(entries, world, figures_root)
        if write:
            path.unlink(missing_ok=True)  # one file, one world: rewritten whole
        for cid, v in new.items():
            before = entries.get(cid, {}).get("verdict")
            extra: dict[str, Any] = {}
            waits = pending_rerun(cid, entries.get(cid, {}))
            if waits:
                v = v.with_reason(f"{_base(v.reason)}; pending rerun: {waits}")
                extra["pending_rerun"] = waits
            v = power_rule(v)  # the one rule (V.7), last, as acetools_course.claims.record applies it
            rows.append({"id": cid, "notebook": folder, "before": before, "after": v.verdict,
                         "changed": before != v.verdict, "reason": v.reason,
                         "predicted_effect": v.predicted_effect, "noise_floor": v.noise_floor,
                         "measured_effect": v.measured_effect})
            if write:
                C.record(path.parent, cid, v, world=world, show_verdict=False, **extra)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--check", action="store_true", help="only compare; exit 1 on a difference")
    ap.add_argument("--figures", default=str(REPO / "figures"),
                    help="the figures root (default: the repository's figures/)")
    args = ap.parse_args(argv)
    rows = rejudge(args.figures, write=not args.check)
    changed = [r for r in rows if r["changed"]]
    for r in rows:
        mark = "CHANGED" if r["changed"] else "same   "
        print(f"{mark} {r['id']:<22} {str(r['before']):<18} -> {r['after']:<18} {r['reason'][:150]}")
    print(f"{len(changed)} of {len(rows)} verdicts changed")
    return 1 if args.check and changed else 0


if __name__ == "__main__":
    sys.exit(main())
