"""LoRA adapters merged in the span of their factors by ``merge_files`` (docs/methods.md §Low-rank updates,
docs/your-models.md §LoRA adapters as experts): every method with a low-rank form equals fold-then-merge to
1e-5 relative where the full-space result is determined (ranks large enough that no null-space basis enters),
on a BERT classifier's adapters with the classifier in modules_to_save and on a tiny Llama's; the choice is
named in the dry run and in acetools_merge.json; full checkpoints among the experts take the task vectors."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import torch

from acetools.cli import main
from acetools.errors import InputError
from acetools.files.checkpoints import open_checkpoint
from acetools.files.heads import task_state_dict
from acetools.files.merge_files import merge_files
from acetools.merging.lowrank import LOWRANK_METHODS
from tests.test_lora import _adapter, _base, _folded

try:
    import peft
    import transformers
except ImportError:
    peft = transformers = None

pytestmark = [pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning"),
              pytest.mark.skipif(peft is None, reason="peft (the oracle extra) is not installed")]

# hyperparameters that reach every branch: ACE flagged (gate on: the refinement runs), Iso-CTS's split, weights
HPARAMS = {"task_arithmetic": {"lam": 0.7, "weights": [1.0, -0.5, 2.0]}, "weight_averaging": {"weights": [3, 1, 2]},
           "tsv_m": {"alpha": 1.3}, "iso_c": {"alpha": 0.9}, "iso_cts": {"alpha": 1.1},
           "ace": {"gate": "on", "scaling": 1.2}}


#: the factors' and modules_to_save copies' standard deviation here (tests/test_lora.py's _adapter)
SCALES = (0.05, 0.05)


@pytest.fixture(scope="module")
def bert(tmp_path_factory):
    """A tiny BERT classifier (hidden 16) and three adapters of ranks 6, 7 and 6 on every attention and MLP
    matrix (sum 19 >= 16: the merges are determined), modules_to_save=["classifier"], and peft's folds."""
    root = tmp_path_factory.mktemp("bert_span")
    cfg = transformers.BertConfig(vocab_size=40, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                  intermediate_size=24, max_position_embeddings=16, num_labels=3)
    fresh = _base(transformers.BertForSequenceClassification, cfg, root / "base")

    targets = ["query", "key", "value", "dense"]
    ads = [_adapter(fresh, root / "base", root / f"task_{t}", t + 1, scales=SCALES, r=r, lora_alpha=2 * r,
                    target_modules=targets, modules_to_save=["classifier"], task_type="SEQ_CLS", use_rslora=t == 2)
           for t, r in enumerate((6, 7, 6))]
    return {"base": root / "base", "adapters": ads, "fresh": fresh,
            "folded": [_folded(fresh, a, root / f"fold_{a.name}") for a in ads]}


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    """A tiny Llama (hidden 16, one KV head) and three adapters of rank 8 on every attention and MLP matrix."""
    root = tmp_path_factory.mktemp("llama_span")
    cfg = transformers.LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=24, num_hidden_layers=1,
                                   num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=16)
    fresh = _base(transformers.LlamaForCausalLM, cfg, root / "base")

    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    ads = [_adapter(fresh, root / "base", root / f"task_{t}", 10 + t, scales=SCALES, r=8, lora_alpha=8,
                    target_modules=targets)
           for t in range(3)]
    return {"base": root / "base", "adapters": ads, "fresh": fresh,
            "folded": [_folded(fresh, a, root / f"fold_{a.name}") for a in ads]}


def _updates(folder: Path, base: Path) -> dict[str, torch.Tensor]:
    W0 = open_checkpoint(base).state_dict()
    return {k: v.double() - W0[k].double() for k, v in open_checkpoint(folder).state_dict().items() if k in W0}


def _assert_close_updates(a: Path, b: Path, base: Path, rtol: float, what: str) -> None:
    """Every key's merged update (merge - W0) of ``a`` within ``rtol`` of ``b``'s, relative to ``b``'s norm."""
    ua, ub = _updates(a, base), _updates(b, base)
    assert ua.keys() == ub.keys()
    for k, v in ub.items():
        err = float((ua[k] - v).norm())
        assert err <= rtol * float(v.norm()) + 1e-9, f"{what} {k}: {err / max(float(v.norm()), 1e-30):.2e} relative"


@pytest.mark.oracle
@pytest.mark.parametrize("world", ["bert", "llama"])
def test_span_equals_fold_then_merge_every_lowrank_method(world, request, tmp_path):
    """Every method with a low-rank form, merged in the span of the adapters' factors, equals the same method on
    peft's folds of them (merged from the task vectors) to 1e-5 relative, heads per task alike."""
    w = request.getfixturevalue(world)
    ads, folded = [str(p) for p in w["adapters"]], [str(p) for p in w["folded"]]
    for method in LOWRANK_METHODS:
        hp = HPARAMS[method]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            a = merge_files(method, w["base"], ads, tmp_path / f"{method}_span", hparams=hp)
            b = merge_files(method, w["base"], folded, tmp_path / f"{method}_fold", hparams=hp)
        low = a.info["lowrank"]
        assert low["mode"] == "auto" and len(low["keys"]) == 7, low  # BERT: q, k, v, 3 dense + the pooler
        assert "lowrank" not in b.info  # no adapter among the experts: nothing to say
        _assert_close_updates(a.out, b.out, w["base"], 1e-5, method)
        for ta, tb in zip(a.info["heads"]["tasks"], b.info["heads"]["tasks"]):
            ha, _ = task_state_dict(a.out, ta)
            hb, _ = task_state_dict(b.out, tb)
            torch.testing.assert_close(ha["classifier.weight"], hb["classifier.weight"])
        recorded = json.loads((a.out / "acetools_merge.json").read_text())["lowrank"]
        assert recorded == low


def test_mixed_experts_take_the_span_only_where_every_expert_is_an_adapter(bert, tmp_path):
    """A full checkpoint among the experts: every key from the task vectors (the plan says so), equal to the fold;
    two adapters and one checkpoint merged as three folds."""
    ads, folded = [str(p) for p in bert["adapters"]], [str(p) for p in bert["folded"]]
    mixed = [ads[0], folded[1], ads[2]]
    for method in ("tsv_m", "ace"):
        a = merge_files(method, bert["base"], mixed, tmp_path / f"{method}_mixed", hparams=HPARAMS[method])
        b = merge_files(method, bert["base"], folded, tmp_path / f"{method}_fold", hparams=HPARAMS[method])
        assert a.info["lowrank"]["keys"] == [] and "no key is updated as a LoRA by every expert" in \
            a.info["lowrank"]["reason"]
        _assert_close_updates(a.out, b.out, bert["base"], 1e-5, method)


def test_the_choice_is_named_in_the_dry_run_and_never_takes_the_task_vectors(bert, tmp_path, capsys):
    ads = [str(p) for p in bert["adapters"]]
    assert main(["merge", "--method", "tsv_m", "--base", str(bert["base"]), "--experts", *ads, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "lowrank=auto: 7 of" in out and "merged in the span of their factors" in out
    assert main(["merge", "--method", "tsv_m", "--base", str(bert["base"]), "--experts", *ads, "--dry-run",
                 "--lowrank", "never"]) == 0
    assert "lowrank=never: every key from the folded task vectors" in capsys.readouterr().out
    plan = merge_files("ties", bert["base"], ads, None, dry_run=True).plan
    assert plan.lowrank_keys == [] and "ties has no form in the factors' span" in plan.lowrank_reason
    plan = merge_files("ace", bert["base"], ads, None, dry_run=True, hparams={"estimator": "identity"}).plan
    assert plan.lowrank_keys == [] and "estimator='identity'" in plan.lowrank_reason
    plan = merge_files("tsv_m", bert["base"], ads, None, dry_run=True, mode="memory").plan
    assert plan.lowrank_keys == [] and "in memory" in plan.lowrank_reason
    with pytest.raises(InputError, match="lowrank='sometimes' must be one of"):
        merge_files("tsv_m", bert["base"], ads, None, dry_run=True, lowrank="sometimes")
    # never: the folded task vectors, equal to the folds' merge (the span's is another result at these ranks)
    a = merge_files("iso_c", bert["base"], ads, tmp_path / "never", lowrank="never")
    b = merge_files("iso_c", bert["base"], [str(p) for p in bert["folded"]], tmp_path / "fold")
    assert a.info["lowrank"] == {"mode": "never", "keys": [], "reason": a.plan.lowrank_reason}
    _assert_close_updates(a.out, b.out, bert["base"], 1e-5, "iso_c never")


def test_the_span_merge_loads_back_as_a_full_model(llama, tmp_path):
    """The CLI's merge of adapters by ACE in the span loads with from_pretrained and computes."""
    ads = [str(p) for p in llama["adapters"]]
    assert main(["merge", "--method", "ace", "--base", str(llama["base"]), "--experts", *ads,
                 "--out", str(tmp_path / "ace")]) == 0
    model = transformers.LlamaForCausalLM.from_pretrained(tmp_path / "ace")
    with torch.no_grad():
        logits = model(torch.tensor([[1, 2, 3]])).logits
    assert logits.shape == (1, 3, 32) and bool(torch.isfinite(logits).all())
    assert len(json.loads((tmp_path / "ace" / "acetools_merge.json").read_text())["lowrank"]["keys"]) == 7


def _best_rank(U: torch.Tensor, k: int) -> tuple[torch.Tensor, float]:
    u, s, vh = torch.linalg.svd(U, full_matrices=False)
    return (u[:, :k] * s[:k]) @ vh[:k], float(s[k:].square().sum() / s.square().sum())


@pytest.mark.oracle
def test_lora_rank_adapter_loads_with_peft_and_is_the_truncated_merge(llama, tmp_path):
    """--lora-rank 5: the adapter loads with PeftModel.from_pretrained, and folded by peft it is a best rank-5
    approximation of the full merge (in the span), key by key: rank 5 and an error of exactly the discarded energy;
    equal to the SVD's cut to 1e-5 relative where the spectrum makes that cut unique (not Iso-C's and Iso-CTS's
    flat ones); the discarded energy per key and in total is the truncation's."""
    ads = [str(p) for p in llama["adapters"]]
    W0 = open_checkpoint(llama["base"]).state_dict()
    for method in LOWRANK_METHODS:
        hp = HPARAMS[method]
        full = merge_files(method, llama["base"], ads, tmp_path / f"{method}_full", hparams=hp)
        res = merge_files(method, llama["base"], ads, None, hparams=hp, lora_out=tmp_path / f"{method}_r5",
                          lora_rank=5)
        record = json.loads((res.out / "acetools_merge.json").read_text())
        assert record == res.info["lora_record"] and record["lora_rank"] == 5
        cfg = json.loads((res.out / "adapter_config.json").read_text())
        assert cfg["r"] == cfg["lora_alpha"] == 5 and not cfg["rank_pattern"]
        got = peft.PeftModel.from_pretrained(llama["fresh"](), str(res.out)).merge_and_unload().state_dict()
        want = open_checkpoint(full.out).state_dict()
        num = den = 0.0
        for k, v in want.items():
            U = v.double() - W0[k].double()
            if k not in record["discarded"]:
                torch.testing.assert_close(got[k], W0[k], rtol=0, atol=0)  # a module no adapter updates
                continue
            cut, share = _best_rank(U, 5)
            D = got[k].double() - W0[k].double()
            assert int(torch.linalg.matrix_rank(D, rtol=1e-6)) <= 5
            # a best rank-5 approximation (Eckart-Young): its error is the discarded energy; Iso-C's spectrum is
            # flat, so which best one is not unique; where it is, it is the SVD's cut of the full merge
            residual = float((U - D).square().sum()) / float(U.square().sum())
            assert abs(residual - share) <= 1e-5, (method, k, residual, share)
            if method not in ("iso_c", "iso_cts"):
                err = float((D - cut).norm())
                assert err <= 1e-5 * float(cut.norm()) + 1e-8, (method, k, err / float(cut.norm()))
            assert abs(record["discarded"][k] - share) <= 1e-5, (method, k)
            num += share * float(U.square().sum())
            den += float(U.square().sum())
        assert len(record["discarded"]) == 7
        assert abs(record["discarded_total"] - num / den) <= 1e-5


def test_lora_rank_refusals_and_the_printed_energy(bert, tmp_path, capsys):
    ads = [str(p) for p in bert["adapters"]]
    # TSV-M keeps int(16 / 3) = 5 triplets per task: a merged update of rank 15
    with pytest.raises(InputError, match=r"--lora-rank 17 exceeds the rank available at '.*': its merged update has "
                                         r"15 singular values"):
        merge_files("tsv_m", bert["base"], ads, None, lora_out=tmp_path / "r17", lora_rank=17)
    with pytest.raises(InputError, match="ties has no form in the factors' span"):
        merge_files("ties", bert["base"], ads, None, lora_out=tmp_path / "ties", lora_rank=4)
    with pytest.raises(InputError, match="give lora_out / --lora-out too"):
        merge_files("tsv_m", bert["base"], ads, tmp_path / "full", lora_rank=4)
    with pytest.raises(InputError, match="updated by 1 of the 2 adapters"):
        merge_files("iso_c", bert["base"], [ads[0], str(_adapter(bert["fresh"], bert["base"], tmp_path / "q_only", 7,
                                                                    scales=SCALES, r=4, target_modules=["query"]))],
                    None, lora_out=tmp_path / "partial", lora_rank=2)
    assert main(["merge", "--method", "iso_cts", "--base", str(bert["base"]), "--experts", *ads,
                 "--lora-out", str(tmp_path / "cli"), "--lora-rank", "3"]) == 0
    printed = capsys.readouterr().out
    record = json.loads((tmp_path / "cli" / "acetools_merge.json").read_text())
    assert f"rank 3: {100 * record['discarded_total']:.2f} % of the merged updates' energy discarded in total " \
           "(7 modules)" in printed
    assert sum("of its merged update's energy discarded" in line for line in printed.splitlines()) == 7
    assert (tmp_path / "cli" / "heads").is_dir()  # the classifiers, per task, beside the adapter


@pytest.mark.oracle
@pytest.mark.parametrize("method,hp,peft_weights", [
    ("weight_averaging", {"weights": [3, 1, 2]}, [0.5, 1 / 6, 1 / 3]),
    ("task_arithmetic", {"lam": 0.4, "weights": [1.0, -0.5, 2.0]}, [0.4, -0.2, 0.8]),
])
def test_linear_adapter_output_is_peft_cat(llama, tmp_path, method, hp, peft_weights):
    """peft's add_weighted_adapter(combination_type="cat") concatenates B_t and weight_t · scaling_t · A_t with
    lora_alpha = r (scale 1): our exact adapter of rank sum_t r_t for the linear rules, with peft's weight_t = our
    coefficient c_t (task arithmetic: lam w_t; weight averaging: w_t / sum_u w_u). Every module's delta alike."""
    ads = [str(p) for p in llama["adapters"]]
    res = merge_files(method, llama["base"], ads, None, hparams=hp, lora_out=tmp_path / "ours")
    assert res.info["lora_record"]["coefficients"] == pytest.approx(peft_weights)
    pm = peft.PeftModel.from_pretrained(llama["fresh"](), ads[0], adapter_name="t0")
    for t, path in enumerate(ads[1:], 1):
        pm.load_adapter(path, adapter_name=f"t{t}")
    pm.add_weighted_adapter([f"t{t}" for t in range(len(ads))], peft_weights, "cat", combination_type="cat")
    from acetools.files.lora import LoraCheckpoint
    ours = LoraCheckpoint(res.out, open_checkpoint(llama["base"]))
    modules = dict(pm.base_model.model.named_modules())
    assert len(ours.targets) == 7
    for key, target in ours.targets.items():
        theirs = modules[target.module].get_delta_weight("cat")
        torch.testing.assert_close(ours.delta(key), theirs, rtol=1e-6, atol=1e-8)


def test_every_data_free_method_from_the_cli_loads_back(llama, tmp_path, capsys):
    """``acetools merge`` of the adapters folder by every registered data-free method: the merge loads with
    from_pretrained and computes finite logits; the methods with a span form also write an adapter of rank 4 that
    PeftModel.from_pretrained loads."""
    from acetools.merging import METHODS

    ads = [str(p) for p in llama["adapters"]]
    data_free = sorted(name for name, info in METHODS.items() if not info.per_key or name == "ace")
    assert set(LOWRANK_METHODS) <= set(data_free)
    for method in data_free:
        lora = tmp_path / f"{method}_lora"
        extra = ["--lora-out", str(lora), "--lora-rank", "4"] if method in LOWRANK_METHODS else []
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            assert main(["merge", "--method", method, "--base", str(llama["base"]), "--experts", *ads,
                         "--out", str(tmp_path / method), *extra]) == 0, method
        model = transformers.LlamaForCausalLM.from_pretrained(tmp_path / method)
        with torch.no_grad():
            assert bool(torch.isfinite(model(torch.tensor([[1, 2, 3]])).logits).all()), method
        if extra:
            pm = peft.PeftModel.from_pretrained(llama["fresh"](), str(lora))
            with torch.no_grad():
                assert bool(torch.isfinite(pm(torch.tensor([[1, 2, 3]])).logits).all()), method
    capsys.readouterr()
