"""The committed claims: every record carries its world and effect fields, and its verdict is
what today's rules give on the numbers it holds (scripts/rejudge_claims.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from acetools_course import claims
from acetools_course.power import POWER_FACTOR
from acetools_course.verdicts import VERDICTS


def _script():
    """``scripts/rejudge_claims.py`` imported as a module."""
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "scripts" / "rejudge_claims.py"
    spec = importlib.util.spec_from_file_location("rejudge_claims", path)
    assert spec is not None and spec.loader is not None, path
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


R = _script()
PENDING, RULES, TEXT_FOLDERS, pending_rerun, rejudge = R.PENDING, R.RULES, R.TEXT_FOLDERS, R.pending_rerun, R.rejudge

ROOT = Path(__file__).resolve().parents[1]
FIGURES = ROOT / "figures"
FILES = sorted(FIGURES.glob("*/claims.json"))


def test_there_are_committed_claims():
    assert len(FILES) >= 5


def _unit_free(x: dict) -> bool:
    """Whether a record's setting ``x`` has a unit-free prediction (Kendall τ against its chance floor): a paper number
    not scaled by the rooms. The one criterion of both tests below (acetools_course.verdicts._unit_free)."""
    return x["predicted"] is not None and (x["paper_room"] is None or x["world_room"] is None)


def _headline(e: dict) -> dict:
    """The setting a record's ``predicted_effect`` and ``noise_floor`` come from (``effect_setting``)."""
    return next(x for x in e["effects"] if x["setting"] == e["effect_setting"])


@pytest.mark.parametrize("path", FILES, ids=[p.parent.name for p in FILES])
def test_every_committed_record_carries_world_and_effects(path):
    for cid, e in json.loads(path.read_text()).items():
        assert e["verdict"] in VERDICTS, cid
        assert e["world"]["name"] and e["world"]["profile"] == "full", cid  # the mini-world, the text world, …
        assert not e["world"]["fixture"], cid
        for f in claims.RECORD_FIELDS:
            assert f in e, (cid, f)
            assert e[f] is None or isinstance(e[f], (int, float)), (cid, f, e[f])
        if e["predicted_effect"] is not None:  # a prediction comes with its floor, measurement and rule
            assert e["noise_floor"] is not None and e["measured_effect"] is not None and e["scaling"], cid
        if e["predicted_effect"] is not None:  # a scaled prediction decides only at >= POWER_FACTOR x its margin,
            unit_free = _unit_free(_headline(e))  # a unit-free one only strictly beyond its chance floor
            need = e["noise_floor"] * (1.0 if unit_free else POWER_FACTOR)
            if e["verdict"] == "undecidable here":
                assert abs(e["predicted_effect"]) < need + 1e-9 if unit_free else abs(e["predicted_effect"]) < need, cid
            elif e["verdict"] in ("reproduced", "partly", "not reproduced"):
                assert abs(e["predicted_effect"]) > need + 1e-9 if unit_free else \
                    abs(e["predicted_effect"]) >= need - 1e-12, (cid, e["predicted_effect"], need)
        waits = pending_rerun(cid, e)
        if waits:
            assert "pending rerun" in e["reason"] and e["numbers"]["pending_rerun"] == waits, cid
        else:
            assert "pending rerun" not in e["reason"] and "pending_rerun" not in e["numbers"], cid


@pytest.mark.parametrize("path", FILES, ids=[p.parent.name for p in FILES])
def test_decided_comparisons_carry_a_paired_standard_error(path):
    """Issue 28: a decided claim that compares two measurements has the paired bootstrap's standard error
    (its margin counts the test set's noise): every committed record of a comparison rests on result files
    with per-example results (test_committed_records_keep_per_example_results)."""
    for cid, e in json.loads(path.read_text()).items():
        key = (path.parent.name, cid)
        if e["verdict"] not in ("reproduced", "partly", "not reproduced") or e["margin_rule"] is None \
                or "chance floor" in e["margin_rule"]:
            continue
        assert e["standard_error"] is not None and "paired bootstrap" in e["margin_rule"], (key, e["margin_rule"])


#: The suites whose committed records keep each test example's correctness (issue 28): the vision
#: tasks8 and the text8 world under both head protocols.
PER_EXAMPLE_SUITES = ("tasks8", "text8", "text8_trained")


@pytest.mark.parametrize("suite", PER_EXAMPLE_SUITES)
def test_committed_records_keep_per_example_results(suite):
    """Every committed record of these suites (three seeds) has its ``_correct.npz``, with every merged or
    reference row on every task, and each row's per-task test accuracy is the mean of its examples."""
    import numpy as np
    import pandas as pd

    from acetools.results import find_results, load_correctness

    runs = find_results(FIGURES / "benchmark", [suite])
    assert sorted(r.seed for r in runs) == [0, 1, 2], (suite, [r.stem for r in runs])
    for r in runs:
        assert r.correct is not None, f"{r.stem}_correct.npz lacks: rerun the bench that wrote {r.summary.name}"
        hits = load_correctness(r.correct)
        assert r.per_task is not None, r.stem
        test = pd.read_csv(r.per_task).query("split == 'test' and method != 'experts (individual)'")
        assert set(test["method"]) == set(hits), (r.stem, set(test["method"]) ^ set(hits))
        for row in test.itertuples():
            assert 100 * np.mean(hits[row.method][row.task]) == pytest.approx(row.accuracy, abs=1e-9), \
                (r.stem, row.method, row.task)


def test_committed_verdicts_are_todays_rules(tmp_path):
    import shutil

    shutil.copytree(FIGURES, tmp_path / "figures")
    rows = rejudge(tmp_path / "figures", write=False)
    # rejudge covers every committed folder: the mini-world's notebooks in the mini-world, the text
    # world's (07, and 04 run with world="text8") in the text world
    assert {p.parent.name for p in FILES} <= set(RULES)
    assert len(rows) == sum(len(json.loads(p.read_text())) for p in FILES)
    for p in FILES:
        worlds = {e["world"]["name"] for e in json.loads(p.read_text()).values()}
        want = {"text"} if p.parent.name in TEXT_FOLDERS else {"mini-world"}
        if p.parent.name in ("07_language", R.TRAINED_FOLDER):  # judged under the papers' protocol: trained heads
            want = {"text (trained heads)"}
        assert worlds == want, (p.parent.name, worlds)
    drift = [(r["id"], r["before"], r["after"]) for r in rows if r["changed"]]
    assert not drift, f"committed verdicts differ from today's rules: {drift}; run scripts/rejudge_claims.py"
    # and rewriting changes no verdict
    rejudge(tmp_path / "figures")
    again = claims.collect(tmp_path / "figures")
    now = claims.collect(FIGURES)
    assert {k: e["verdict"] for k, e in again.items()} == {k: e["verdict"] for k, e in now.items()}
    # each text folder is rejudged on the tables of the head protocol it was judged in (07: trained heads)
    lang = [json.loads((d / "07_language" / "claims.json").read_text())["ace.language_sota"] for d in
            (tmp_path / "figures", FIGURES)]
    assert lang[0]["measured"] == lang[1]["measured"] and lang[0]["world"]["name"] == "text (trained heads)"
    assert R.main(["--check", "--figures", str(tmp_path / "figures")]) == 0  # the command line agrees


def test_pending_rerun_ends_with_the_rerun():
    """A stage claim waits for notebook 02's rerun until its record was decided at the paper's eps
    (refinement: with the gate forced where ACE's gate flags few layers)."""
    old = {"numbers": {"eps": 0.01, "tasks8": {"suite": "tasks8", "d": 0.3}}}
    new = {"numbers": {"eps": 1e-05, "tasks8": {"suite": "tasks8", "d": 0.3}}}
    for cid in ("ace.csp", "ace.spectrum", "ace.normalization"):
        assert pending_rerun(cid, old) == PENDING[cid]
        assert pending_rerun(cid, new) is None
    assert pending_rerun("ace.refinement", old) == PENDING["ace.refinement"]
    forced = {"numbers": {"eps": 1e-05, "tasks8": {"suite": "tasks8", "d": 0.1, "gate_forced": True}}}
    assert pending_rerun("ace.refinement", forced) is None
    assert pending_rerun("ace.gamma_vit", old) is None
    # the text world's records wait for the BERT family's eps (docs/methods.md §One paper setting per model family)
    text = {"world": {"name": "text"}}
    at_vit = {**text, "numbers": {"eps": 1e-05, "text8": {"suite": "text8", "d": 0.3}}}
    at_bert = {**text, "numbers": {"eps": 2e-04, "text8": {"suite": "text8", "d": 0.3}}}
    assert pending_rerun("ace.csp", at_vit) == PENDING["ace.csp"] and pending_rerun("ace.csp", at_bert) is None


def test_lessons_02_and_03_in_the_text_world_are_rejudged_from_their_own_folders():
    """The text world's runs of notebooks 02 and 03 are re-decided by the rejudge too (the only writer of
    verdicts), from their own folders' per-example results: 02's one suite, text8, and 03's grid."""
    assert R.inputs("02_ace_step_by_step-text8", "ace.csp", FIGURES) == \
        [FIGURES / "02_ace_step_by_step-text8" / "ablation_text8_correct.npz"]
    assert R.inputs("03_esm_step_by_step-text8", "esm.four", FIGURES) == \
        [FIGURES / "03_esm_step_by_step-text8" / n for n in ("proxy_correct.npz", "ablation_grid_correct.npz")]
    assert {"02_ace_step_by_step-text8", "03_esm_step_by_step-text8"} <= set(R.RULES) & R.TEXT_FOLDERS


def test_a_record_decided_at_the_papers_eps_keeps_it(tmp_path):
    """Rejudging a notebook-02 record decided at eps 1e-5 keeps that eps, its ridge/prior size and the
    code default's verdict beside it, and names no pending rerun (before the rerun: eps 1e-2, pending)."""
    import shutil

    shutil.copytree(FIGURES, tmp_path / "figures")
    path = tmp_path / "figures" / "02_ace_step_by_step" / "claims.json"
    entries = json.loads(path.read_text())
    csp = entries["ace.csp"]
    per = {k: v for k, v in csp["numbers"].items() if isinstance(v, dict) and "suite" in v}
    side = {"eps": 0.01, "verdict": "not testable here", "measured": "m", "reason": "r"}
    csp["numbers"] = {**per, "eps": 1e-05, "ridge_over_prior": 0.25, "beside": side}
    # a record from before the rerun (the committed ones are all rerun now): eps at the code default
    old = entries["ace.normalization"]["numbers"]
    entries["ace.normalization"]["numbers"] = {k: v for k, v in old.items() if k not in ("beside", "pending_rerun")}
    entries["ace.normalization"]["numbers"]["eps"] = 0.01
    path.write_text(json.dumps(entries))
    rows = {r["id"]: r for r in rejudge(tmp_path / "figures") if r["notebook"] == "02_ace_step_by_step"}
    e = json.loads(path.read_text())["ace.csp"]
    assert e["numbers"]["eps"] == 1e-05 and e["numbers"]["ridge_over_prior"] == 0.25 and e["numbers"]["beside"] == side
    assert "pending_rerun" not in e["numbers"] and "pending rerun" not in e["reason"]
    assert "decided at eps 1e-05" in e["reason"]
    assert "beside it, the code default eps 0.01: not testable here" in e["reason"]
    assert "ridge/prior 0.25 at eps 1e-05" in e["reason"]
    assert rows["ace.csp"]["after"] == e["verdict"]
    # the records not rerun still wait, at the code default eps
    n = json.loads(path.read_text())["ace.normalization"]
    assert n["numbers"]["pending_rerun"] == PENDING["ace.normalization"] and n["numbers"]["eps"] == 0.01


@pytest.mark.parametrize("path", FILES, ids=[p.parent.name for p in FILES])
def test_every_decided_comparative_claim_has_the_power_and_no_contradicting_setting(path):
    """The one rule (V.7) on the committed records: a comparative claim (one with settings) decided reproduced,
    partly or not reproduced has a setting with a paper prediction of at least twice its margin; one decided
    reproduced or partly has no deciding setting measured beyond its margin against the predicted sign; an
    undecidable one names the effect the world would need, and every one says at how many settings it was judged.
    A decided claim without settings must be one that is not a comparison (claims.NOT_COMPARISONS: a level, or a
    claim of no difference); one of those never carries settings."""
    for cid, e in json.loads(path.read_text()).items():
        effects = e.get("effects") or []
        if cid in claims.NOT_COMPARISONS:
            assert not effects, f"{cid} carries settings: a comparison, not in claims.NOT_COMPARISONS"
            continue
        if e["verdict"] == "not testable here":
            continue
        assert effects, (f"{cid} ({path.parent.name}) is {e['verdict']!r}: a comparison decided without settings, "
                         "so without a prediction, a margin and the power test (V.7)")
        deciding = [x for x in effects if x["predicted"] is not None
                    and (abs(x["predicted"]) > x["floor"] * (1 + 1e-9) if _unit_free(x)
                         else abs(x["predicted"]) >= POWER_FACTOR * x["floor"])]
        rule = e["numbers"]["power_rule"]
        assert rule["settings"] == len(effects) and rule["deciding"] == [x["setting"] for x in deciding], cid
        assert f"judged at {len(deciding)} of {len(effects)} settings" in e["reason"], cid
        if e["verdict"] == "undecidable here":
            need = next(x for x in effects if x["setting"] == rule["needed_at"])
            words = "above" if _unit_free(need) else "of at least"
            assert not deciding and f"would need an effect {words} {rule['needed']:.2f}" in e["reason"], cid
            if _unit_free(need) and abs(abs(need["predicted"]) - need["floor"]) <= 1e-9 * need["floor"]:
                assert "equals the floor, and equal is undecidable" in e["reason"], cid
            continue
        assert deciding, f"{cid} ({path.parent.name}) is {e['verdict']!r} without a setting that has the power"
        if e["verdict"] in ("reproduced", "partly"):
            against = [x["setting"] for x in deciding if x["measured"] is not None
                       and x["measured"] * (1 if x["predicted"] > 0 else -1) < -x["floor"]]
            assert not against, f"{cid} ({path.parent.name}) is {e['verdict']!r}, contradicted at {against}"


#: The claims decided on a stage ablation, which runs on one expert seed (docs/course.md §Margin, power and rivals),
#: and notebook 03's ESD-vs-SVD and norm-order studies, on the experts of one seed too.
ONE_SEED = {"ace.normalization", "ace.csp", "ace.refinement", "esm.four", "esm.esd_alone", "esm.ps_on_svd",
            "esm.layer_first", "esm.reciprocal", "ace.normalization_language", "ace.csp_language",
            "ace.refinement_language", "esm.energy", "esm.cka", "esm.norm_importance"}


@pytest.mark.parametrize("path", FILES, ids=[p.parent.name for p in FILES])
def test_one_seed_claims_say_so_in_their_record(path):
    """A stage ablation's settings rest on one expert seed: each effect says ``seeds: 1`` and a margin from per-example
    results says that the seeds' noise is not measured; a multi-seed comparison never says so."""
    for cid, e in json.loads(path.read_text()).items():
        effects = e.get("effects") or []
        if cid in ONE_SEED:
            assert effects and all(x["seeds"] == 1 for x in effects), cid
            if e["standard_error"] is not None:
                assert "one expert seed" in e["margin_rule"], cid
        elif e.get("margin_rule"):
            assert "one expert seed" not in e["margin_rule"], cid


def test_one_paper_setting_per_model_family():
    """Every committed ACE or ESM claim is decided at its world's family setting (claims.PAPER_SETTINGS, the
    only table the claims take it from): the vision worlds' ViT at ACE's eps 1e-5, the text world's MiniLM
    (a BERT-family encoder) at RoBERTa-Base's eps 2e-4 and ESM's RoBERTa code, under both head protocols."""
    assert claims.paper_setting("mini-world").ace_row == "ace (eps 1e-5)"
    for name in claims.TEXT_CLAIM_WORLDS.values():
        s = claims.paper_setting(name)
        assert (s.eps, s.ace_row, s.esm_row) == (2e-4, "ace (eps 2e-4)", "esm (roberta)"), name
    seen = 0
    for path in FILES:
        for cid, e in json.loads(path.read_text()).items():
            want = claims.paper_setting(e["world"]["name"])
            n = e["numbers"]
            if "ace_row" in n:
                assert n["ace_row"] == want.ace_row, (path.parent.name, cid, n["ace_row"])
                seen += 1
            if "esm_row" in n:
                assert n["esm_row"] == want.esm_row, (path.parent.name, cid, n["esm_row"])
                seen += 1
            if "decided_eps" in n:  # lesson 07's stage claims: one eps decides
                assert n["decided_eps"] == [want.eps], (cid, n["decided_eps"])
                seen += 1
    assert seen >= 15


def test_every_decided_verdict_rests_on_committed_files():
    """Every committed verdict is recomputable by scripts/rejudge_claims.py from committed files (R.inputs):
    the result files and per-example results, the regime card, a stage ablation's per-example results, or the
    record's own stored measurement. None may be missing (the full reruns of 02, 03 and 07 commit theirs)."""
    missing = {}
    for path in FILES:
        for cid, e in json.loads(path.read_text()).items():
            if e["verdict"] == "not testable here":
                continue
            files = R.inputs(path.parent.name, cid, FIGURES)
            assert files, (path.parent.name, cid)
            for f in files:
                if not f.is_file():
                    missing.setdefault(f.relative_to(FIGURES).as_posix(), []).append(f"{cid} ({e['verdict']})")
    assert not missing, f"verdicts whose inputs are not committed: {missing}"


def test_lesson_07_stage_claims_are_recomputed_from_their_per_example_results(tmp_path):
    """With lesson 07's stage_ablation_correct.npz committed, the rejudge decides its stage claims from it:
    each eps's gain and paired standard error are the per-example results' (acetools_course.power.stage_difference)."""
    import numpy as np

    from acetools_course import power
    from acetools_course.verdicts import World

    entries = json.loads((FIGURES / "07_language" / "claims.json").read_text())
    stage = {cid: entries[cid] for cid in R.STAGE_NAMES}
    rng = np.random.default_rng(1)
    rows = ["gate on (forced)", *(without for _, without in R.STAGE_NAMES.values())]
    hits = {f"eps {e:g}|{r}": {t: rng.random(300) < 0.6 + 0.02 * i for t in ("x", "y")}
            for e in (0.01, 2e-4, 1e-5) for i, r in enumerate(rows)}
    (tmp_path / "07_language").mkdir()
    power.save_stage_results(tmp_path / "07_language", "stage_ablation", hits, experts={"x": 0.9, "y": 0.7})
    out = R._language_lesson(stage, World("text (trained heads)", "full"), tmp_path)
    for cid, (_, without) in R.STAGE_NAMES.items():
        want = power.stage_difference(hits, {"x": 0.9, "y": 0.7}, "eps 0.0002|gate on (forced)",
                                      f"eps 0.0002|{without}")
        assert out[cid].numbers["gains"][2e-4] == pytest.approx(want[0]), cid
        assert out[cid].numbers["se"][2e-4] == pytest.approx(want[1]), cid
    assert out["ace.csp_language"].numbers["gains"] != {float(k): v for k, v in
                                                         entries["ace.csp_language"]["numbers"]["gains"].items()}


def test_lesson_02_stage_claims_are_recomputed_from_their_per_example_results(tmp_path):
    """With lesson 02's ablation_<suite>_correct.npz committed, the rejudge takes each stage difference and its
    paired standard error from them (the stored ones stand for a suite without the file)."""
    import numpy as np

    from acetools_course import lesson02_ace_step_by_step as L
    from acetools_course import power

    entries = json.loads((FIGURES / "02_ace_step_by_step" / "claims.json").read_text())
    stage = {cid: entries[cid] for cid in ("ace.normalization", "ace.csp", "ace.refinement")}
    rng = np.random.default_rng(2)
    variants = [L.FULL, L.GATE_ON, L.GATE_ON_NO_REFINE, L.GATE_OFF, L.NO_PRIOR, L.NO_REFINE]
    hits = {f"tasks8|{v}": {t: rng.random(400) < 0.5 + 0.03 * i for t in ("a", "b")} for i, v in enumerate(variants)}
    (tmp_path / "02_ace_step_by_step").mkdir()
    power.save_stage_results(tmp_path / "02_ace_step_by_step", "ablation_tasks8", hits, experts={"a": 0.8, "b": 0.6})
    per = R._ace_from_files(R._per_suite(stage["ace.csp"]["numbers"]), "ace.csp", tmp_path / "02_ace_step_by_step")
    want = power.stage_difference(hits, {"a": 0.8, "b": 0.6}, f"tasks8|{L.FULL}", f"tasks8|{L.NO_PRIOR}")
    t8 = next(s for s in per if s["suite"] == "tasks8")
    assert (t8["d"], t8["se"]) == pytest.approx(want)
    t20 = next(s for s in per if s["suite"] == "tasks20")  # no file: the stored numbers
    assert t20 == stage["ace.csp"]["numbers"]["tasks20"]
    out = R._ace_verdicts(stage, claims.claim_world(quick=False, results_dir=FIGURES / "benchmark"), tmp_path)
    assert out["ace.csp"].numbers["tasks8"]["d"] == pytest.approx(want[0])
    per = R._ace_from_files(R._per_suite(stage["ace.normalization"]["numbers"]), "ace.normalization",
                            tmp_path / "02_ace_step_by_step")
    norm = next(s for s in per if s["suite"] == "tasks8")
    assert norm["d_forced"] == pytest.approx(power.stage_difference(
        hits, {"a": 0.8, "b": 0.6}, f"tasks8|{L.GATE_ON_NO_REFINE}", f"tasks8|{L.GATE_OFF}")[0])


def test_lesson_03_grid_claims_are_recomputed_from_their_per_example_results(tmp_path):
    """With lesson 03's ablation_grid_correct.npz committed, each grid claim's gains and paired standard errors
    (absolute points) come from it."""
    import numpy as np

    from acetools_course import power
    from acetools_course.lesson03_esm_step_by_step import TSV_M_ROW

    entries = json.loads((FIGURES / "03_esm_step_by_step" / "claims.json").read_text())
    rows = ["ESD, no scaling", "SVD, all levels", "ESD, layer only", "ESD, all levels", "ESD, reciprocal (-1)",
            TSV_M_ROW]
    rng = np.random.default_rng(3)
    hits = {f"{s}|{r}": {t: rng.random(300) < 0.55 + 0.02 * i for t in ("a", "b")}
            for s in ("tasks8", "tasks20") for i, r in enumerate(rows)}
    (tmp_path / "03_esm_step_by_step").mkdir()
    power.save_stage_results(tmp_path / "03_esm_step_by_step", "ablation_grid", hits)
    got = R._esm_from_files(entries["esm.layer_first"]["numbers"], "esm.layer_first", tmp_path / "03_esm_step_by_step")
    want = power.stage_difference(hits, None, "tasks20|ESD, all levels", "tasks20|ESD, no scaling")
    assert (got["all_gain_tasks20"], got["se_all_tasks20"]) == pytest.approx(want)
    want = power.stage_difference(hits, None, "tasks8|ESD, no scaling", f"tasks8|{TSV_M_ROW}")
    got = R._esm_from_files(entries["esm.esd_alone"]["numbers"], "esm.esd_alone", tmp_path / "03_esm_step_by_step")
    assert (got["gain_tasks8"], got["se_tasks8"]) == pytest.approx(want)
    assert got["gain_vs_inpipeline_svd_tasks8"] == entries["esm.esd_alone"]["numbers"]["gain_vs_inpipeline_svd_tasks8"]
    world = claims.claim_world(quick=False, results_dir=FIGURES / "benchmark")
    out = R._esm_verdicts({"esm.esd_alone": entries["esm.esd_alone"]}, world, tmp_path)
    assert out["esm.esd_alone"].numbers["gain_tasks8"] == pytest.approx(want[0])


def test_lesson_03_proxy_claims_are_recomputed_from_their_per_example_results(tmp_path):
    """With lesson 03's proxy_correct.npz committed, esm.proxy's accuracies and esm.four's difference and paired
    standard error come from it."""
    import numpy as np

    from acetools_course import power
    from acetools_course.lesson03_esm_step_by_step import TSV_M_ROW

    entries = json.loads((FIGURES / "03_esm_step_by_step" / "claims.json").read_text())
    runs = ["in-distribution", "other task", "pretraining pool", "one class", "4 samples", "SVD, no scaling",
            TSV_M_ROW]
    rng = np.random.default_rng(4)
    hits = {f"tasks8|{r}": {t: rng.random(250) < 0.6 for t in ("a", "b")} for r in runs}
    (tmp_path / "03_esm_step_by_step").mkdir()
    power.save_stage_results(tmp_path / "03_esm_step_by_step", "proxy", hits)
    world = claims.claim_world(quick=False, results_dir=FIGURES / "benchmark")
    out = R._esm_verdicts({c: entries[c] for c in ("esm.proxy", "esm.four")}, world, tmp_path)
    acc = {r: 100 * np.mean([h.mean() for h in hits[f"tasks8|{r}"].values()]) for r in runs}
    assert out["esm.proxy"].numbers["one class"] == pytest.approx(acc["one class"])
    n = out["esm.four"].numbers
    assert n["diff_points"] == pytest.approx(acc["4 samples"] - acc[TSV_M_ROW])
    assert n["se"] == pytest.approx(power.paired_se(hits["tasks8|4 samples"], hits[f"tasks8|{TSV_M_ROW}"]))


def test_trained_heads_claims_rest_on_the_trained_heads_result_files():
    """Notebook 04's claims judged on the trained-heads tables (R.TRAINED_FOLDER) are recomputed from the
    ``text8_trained`` result files, not from their own record."""
    for cid in ("ace.sota", "esm.sota", "ace.vs_wudi", "ace.ordering"):
        files = R.inputs(R.TRAINED_FOLDER, cid, FIGURES)
        names = sorted(f.name for f in files)
        assert names == sorted(f"text8_trained_minilm_seed{s}_{x}" for s in (0, 1, 2)
                               for x in ("summary.csv", "correct.npz")), (cid, names)
        assert all(f.parent == FIGURES / "benchmark" for f in files), cid


def test_not_comparisons_are_registered_claims():
    """claims.NOT_COMPARISONS names registered claims, and the ones the tests above exempt from the one rule
    are levels or a claim of no difference, not the comparisons issue 41 found decided without a prediction."""
    assert claims.NOT_COMPARISONS <= {c.id for c in claims.CLAIMS}
    assert not claims.NOT_COMPARISONS & {"esm.norm_importance", "esm.cka", "esm.energy", "ace.csp", "esm.four",
                                         "ace.vs_wudi", *R.STAGE_NAMES}


def test_lesson_03_norm_order_claim_is_recomputed_from_its_per_example_results(tmp_path):
    """With lesson 03's norm_order_correct.npz committed, esm.norm_importance's gaps (normalized points) and their
    paired standard errors come from it; with no paper number to scale it stays undecidable (V.7)."""
    import numpy as np

    from acetools_course import power
    from acetools_course.lesson03_esm_step_by_step import NORM_ORDER_KEYS

    assert NORM_ORDER_KEYS == ("order", "norms")
    entries = json.loads((FIGURES / "03_esm_step_by_step" / "claims.json").read_text())
    rng = np.random.default_rng(5)
    experts = {"a": 0.9, "b": 0.8}
    hits = {f"{o}|{n}": {t: rng.random(200) < p for t in experts}
            for o, n, p in (("norm", "raw", 0.85), ("reverse", "raw", 0.6), ("norm", "equal", 0.75),
                            ("reverse", "equal", 0.7))}
    (tmp_path / "03_esm_step_by_step").mkdir()
    power.save_stage_results(tmp_path / "03_esm_step_by_step", "norm_order", hits, experts=experts)
    world = claims.claim_world(quick=False, results_dir=FIGURES / "benchmark")
    v = R._esm_verdicts({"esm.norm_importance": entries["esm.norm_importance"]}, world, tmp_path)["esm.norm_importance"]
    want = power.stage_difference(hits, experts, "norm|equal", "reverse|equal")
    assert (v.numbers["gap_equal"], v.numbers["se_equal"]) == pytest.approx(want)
    assert v.numbers["norm_raw"] == pytest.approx(100 * np.mean([hits["norm|raw"][t].mean() / experts[t]
                                                                 for t in experts]))
    eff = {e.setting: e for e in v.effects}
    assert eff["equal norms"].se == pytest.approx(want[1]) and eff["equal norms"].predicted is None
    from acetools_course.verdicts import power_rule

    assert power_rule(v).verdict == "undecidable here"
    assert R.inputs("03_esm_step_by_step", "esm.norm_importance", FIGURES) == \
        [FIGURES / "03_esm_step_by_step" / "norm_order_correct.npz"]


def test_a_unit_free_prediction_equal_to_its_floor_is_undecidable_and_says_so():
    """(V.7): a unit-free prediction (Kendall τ, not scaled) decides only strictly beyond its chance floor; equal to
    it, as ace.ordering's claimed τ is, the claim is undecidable, and the reason says so and at how many settings
    it was judged."""
    from acetools_course.verdicts import Effect, Verdict, power_rule

    def tau(setting, predicted):
        return Effect(setting, predicted, None, None, predicted, 0.95, 0.4)

    v = power_rule(Verdict("m", "not reproduced", "r", {}, [tau(f"tasks{n}", 0.95) for n in (8, 14, 20)]))
    assert v.verdict == "undecidable here"
    assert "judged at 0 of 3 settings" in v.reason and "equals the floor, and equal is undecidable" in v.reason
    assert "would need an effect above 0.95" in v.reason
    above = power_rule(Verdict("m", "not reproduced", "r", {}, [tau("tasks8", 0.96)]))
    assert above.verdict == "not reproduced" and "judged at 1 of 1 settings" in above.reason
