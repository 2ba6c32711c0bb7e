"""Experts with added tokens (docs/your-models.md §Vocabularies): a tiny Llama (tied and untied ``lm_head``),
GPT-2 (Conv1D, tied) and a BERT masked LM, each with a tokenizer trained here, and three experts fine-tuned
from the base, two of which added tokens (``add_tokens`` + ``resize_token_embeddings``) with one token in
common at different ids. Merged by every method with ``vocab="base"`` and ``"union"``, loaded back with
``from_pretrained``. Everything is built offline from configs (HF_HUB_OFFLINE=1).
"""

from __future__ import annotations

import copy
import json
import os
import re
import shutil

import pytest
import torch

from acetools.cli import main
from acetools.errors import InputError
from acetools.files.checkpoints import open_checkpoint
from acetools.files.merge_files import load_config, merge_files, plan_merge
from acetools.files.vocab import TOKENIZER_FILES
from acetools.merging import METHODS
from tests.merge_helpers import perturbed

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

TEXTS = ["the cat sat on the mat", "a dog ran in the park", "merging models is fun", "tokens and words",
         "every expert learns a task"] * 4
ADDED = [["<math>", "<sol>"], ["<sol>", "<code>"]]  # expert 1's and expert 2's added tokens ("<sol>" in both)
EMBED = {"llama": "model.embed_tokens.weight", "llama_untied": "model.embed_tokens.weight",
         "gpt2": "transformer.wte.weight", "bert": "bert.embeddings.word_embeddings.weight"}


def _tokenizer(kind):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    if kind == "bert":
        tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
        tok.pre_tokenizer = pre_tokenizers.Whitespace()
        special = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
        tok.train_from_iterator(TEXTS, trainers.WordPieceTrainer(vocab_size=90, special_tokens=special))
        return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]",
                                                    cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]")
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(TEXTS, trainers.BpeTrainer(vocab_size=90, special_tokens=["<unk>", "<s>", "</s>"]))
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>",
                                                eos_token="</s>")


def _model(kind, n_tokens):
    torch.manual_seed(0)
    if kind.startswith("llama"):
        cfg = transformers.LlamaConfig(vocab_size=n_tokens, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
                                       tie_word_embeddings=kind == "llama", bos_token_id=1, eos_token_id=2)
        return transformers.LlamaForCausalLM(cfg)
    if kind == "gpt2":
        cfg = transformers.GPT2Config(vocab_size=n_tokens, n_positions=16, n_embd=16, n_layer=2, n_head=2,
                                      bos_token_id=1, eos_token_id=2)
        return transformers.GPT2LMHeadModel(cfg)
    cfg = transformers.BertConfig(vocab_size=n_tokens, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                                  intermediate_size=32, max_position_embeddings=24)
    return transformers.BertForMaskedLM(cfg)


def _save(model, tok, path):
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


def _truncated(expert, base, path):
    """``expert`` with the base's rows only (the base's tokens are every expert's first rows here)."""
    shutil.copytree(base, path)
    from safetensors.torch import save_file

    b, e = open_checkpoint(base), open_checkpoint(expert).state_dict()
    save_file({k: e[k][: b.meta(k).shape[0]].contiguous() for k in b.keys()}, str(path / "model.safetensors"),
              metadata={"format": "pt"})
    return path


class World:
    def __init__(self, root, kind):
        self.kind = kind
        tok = _tokenizer(kind)
        self.n = len(tok)
        model = _model(kind, self.n).eval()
        self.base = _save(model, tok, root / "base")
        self.experts = []
        for t in range(3):
            m, tk = copy.deepcopy(model), copy.deepcopy(tok)
            if t:
                tk.add_tokens(ADDED[t - 1])
                m.resize_token_embeddings(len(tk), mean_resizing=False)
            self.experts.append(_save(perturbed(m, 10 + t), tk, root / f"expert{t}"))
        self.truncated = [_truncated(e, self.base, root / f"truncated{t}") for t, e in enumerate(self.experts)]
        self.embed = EMBED[kind]


KINDS = ("llama", "llama_untied", "gpt2", "bert")


@pytest.fixture(scope="module")
def worlds(tmp_path_factory):
    return {kind: World(tmp_path_factory.mktemp(kind), kind) for kind in KINDS}


def _hparams(method, base):
    """Data inputs for the methods that need them (random Grams / activations of the matrix keys)."""
    from acetools.layouts import get_layout

    ck = open_checkpoint(base)
    lay = get_layout("auto", keys=ck.keys(), config=ck.config)
    g = torch.Generator().manual_seed(5)
    info = METHODS[method]
    widths = {k: lay.to_canonical(k, w).shape[1] for k, w in ck.state_dict().items() if lay.is_matrix(k, w)}
    hp = {"steps": 3} if method == "wudi" else {}
    if "grams" in info.data_inputs:
        hp["grams"] = [{k: (X := torch.randn(3 * d, d, generator=g)).T @ X / (3 * d) for k, d in widths.items()}
                       for _ in range(3)]
    if "activations" in info.data_inputs:
        targets = info.resolve({}, layout=lay.name)["targets"]
        hp["activations"] = {k: [torch.randn(12, d, generator=g) for _ in range(3)] for k, d in widths.items()
                             if any(re.search(p, k) for p in targets)}
    return hp


def _load(out, kind):
    cls = transformers.BertForMaskedLM if kind == "bert" else transformers.AutoModelForCausalLM
    model, info = cls.from_pretrained(out, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    return model


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
def test_every_method_merges_added_tokens(tmp_path, worlds, kind):
    """Every method, vocab base and union: the output loads; base = the merge of the experts cut to the base's
    rows; union = base plus the rows only some experts have (the donor's row, or the mean of the rows that
    have it), ties kept, config's vocab_size and the tokenizer's ids matching the rows."""
    w = worlds[kind]
    rows = open_checkpoint(w.experts[1]).state_dict()[w.embed], open_checkpoint(w.experts[2]).state_dict()[w.embed]
    for method in METHODS:
        hp = _hparams(method, w.base)
        ref = merge_files(method, w.base, w.truncated, tmp_path / f"{method}-ref", hparams=hp, hash_inputs=False)
        base = merge_files(method, w.base, w.experts, tmp_path / f"{method}-base", hparams=hp, vocab="base",
                           hash_inputs=False)
        union = merge_files(method, w.base, w.experts, tmp_path / f"{method}-union", hparams=hp, vocab="union",
                            hash_inputs=False)
        assert ref.plan.vocab.mode == "same" and base.plan.vocab.mode == "base", method
        got_ref, got_base = (open_checkpoint(r.out).state_dict() for r in (ref, base))
        got_union = open_checkpoint(union.out).state_dict()
        assert got_base.keys() == got_ref.keys() == got_union.keys(), method
        for k, v in got_ref.items():
            assert torch.equal(got_base[k], v), (method, k)
            assert torch.equal(got_union[k][: v.shape[0]], v), (method, k)  # the rows all share: merged as usual
        emb = got_union[w.embed]
        assert emb.shape[0] == w.n + 3, method
        torch.testing.assert_close(emb[w.n], rows[0][w.n], rtol=0, atol=0)  # <math>: expert 1's row
        torch.testing.assert_close(emb[w.n + 1], (rows[0][w.n + 1] + rows[1][w.n]) / 2)  # <sol>: the mean
        torch.testing.assert_close(emb[w.n + 2], rows[1][w.n + 1], rtol=0, atol=0)  # <code>: expert 2's row
        for res, n in ((base, w.n), (union, w.n + 3)):
            model = _load(res.out, kind)
            assert model.config.vocab_size == n == json.loads((res.out / "config.json").read_text())["vocab_size"]
            out_emb, head = model.get_input_embeddings().weight, model.get_output_embeddings().weight
            assert out_emb.shape[0] == head.shape[0] == n, method
            if kind != "llama_untied":  # tied stays tied: one tensor
                assert head.data_ptr() == out_emb.data_ptr(), method
            else:
                assert "lm_head.weight" in open_checkpoint(res.out).keys()
        tok = transformers.AutoTokenizer.from_pretrained(union.out)
        assert len(tok) == w.n + 3
        assert tok.convert_tokens_to_ids(["<math>", "<sol>", "<code>"]) == [w.n, w.n + 1, w.n + 2]
        ids = tok("<code> the cat <math>", add_special_tokens=False)["input_ids"]
        assert ids[0] == w.n + 2 and ids[-1] == w.n
        assert len(transformers.AutoTokenizer.from_pretrained(base.out)) == w.n
        assert union.info["vocab"]["added"] == ["<math>", "<sol>", "<code>"]


def test_union_untied_head_rows(tmp_path, worlds):
    """An untied ``lm_head`` gets its own extra rows (from the experts' lm_head, not the embedding's)."""
    w = worlds["llama_untied"]
    res = merge_files("task_arithmetic", w.base, w.experts, tmp_path / "out", vocab="union", hash_inputs=False)
    got = open_checkpoint(res.out).state_dict()
    e1, e2 = (open_checkpoint(e).state_dict()["lm_head.weight"] for e in w.experts[1:])
    assert got["lm_head.weight"].shape == (w.n + 3, 32)
    assert not torch.equal(got["lm_head.weight"][w.n:], got[w.embed][w.n:])
    torch.testing.assert_close(got["lm_head.weight"][w.n:], torch.stack([e1[w.n], (e1[w.n + 1] + e2[w.n]) / 2,
                                                                         e2[w.n + 1]]))


def test_default_is_base_with_a_warning(tmp_path, worlds):
    w = worlds["llama"]
    with pytest.warns(UserWarning, match=r"3 rows the base lacks .*'<math>'.*vocab='union'"):
        res = merge_files("task_arithmetic", w.base, w.experts, tmp_path / "out", hash_inputs=False)
    assert res.plan.vocab.mode == "base" and res.plan.vocab.dropped == 3
    assert open_checkpoint(res.out).meta(w.embed).shape == (w.n, 32)
    assert "vocab: base (the default)" in res.plan.summary()


def test_tokens_matched_by_string_not_index(tmp_path, worlds):
    """An expert whose base tokens sit at other rows (a permuted vocabulary) is merged token by token."""
    w = worlds["gpt2"]
    perm = torch.randperm(w.n, generator=torch.Generator().manual_seed(1))
    src = w.truncated[1]
    shuffled = tmp_path / "shuffled"
    shutil.copytree(src, shuffled)
    tok = json.loads((src / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    tok["model"]["vocab"] = {t: int(perm[i]) for t, i in vocab.items()}  # token at row i moves to row perm[i]
    for entry in tok["added_tokens"]:
        entry["id"] = int(perm[entry["id"]])
    (shuffled / "tokenizer.json").write_text(json.dumps(tok))
    cfg = json.loads((src / "tokenizer_config.json").read_text())
    cfg["added_tokens_decoder"] = {str(int(perm[int(i)])): v for i, v in cfg.get("added_tokens_decoder", {}).items()}
    (shuffled / "tokenizer_config.json").write_text(json.dumps(cfg))
    sd = open_checkpoint(src).state_dict()
    emb = torch.empty_like(sd[w.embed])
    emb[perm] = sd[w.embed]
    sd[w.embed] = emb
    from safetensors.torch import save_file

    save_file(sd, str(shuffled / "model.safetensors"), metadata={"format": "pt"})
    experts = [w.truncated[0], shuffled, w.truncated[2]]
    res = merge_files("task_arithmetic", w.base, experts, tmp_path / "out", vocab="base", hash_inputs=False)
    ref = merge_files("task_arithmetic", w.base, w.truncated, tmp_path / "ref", hash_inputs=False)
    got, want = open_checkpoint(res.out).state_dict(), open_checkpoint(ref.out).state_dict()
    for k in want:
        torch.testing.assert_close(got[k], want[k], rtol=0, atol=0)


def test_without_tokenizers_rows_are_matched_by_index(tmp_path, worlds, caplog):
    w = worlds["llama"]
    bare = []
    for t, e in enumerate(w.experts):
        shutil.copytree(e, tmp_path / f"e{t}")
        for name in TOKENIZER_FILES:
            (tmp_path / f"e{t}" / name).unlink(missing_ok=True)
        bare.append(tmp_path / f"e{t}")
    with caplog.at_level("INFO", logger="acetools.files.vocab"):
        res = merge_files("task_arithmetic", w.base, bare, tmp_path / "out", vocab="union", hash_inputs=False)
    assert "rows matched by index, the base's" in caplog.text
    got = open_checkpoint(res.out).state_dict()[w.embed]
    e1, e2 = (open_checkpoint(e).state_dict()[w.embed] for e in w.experts[1:])
    assert got.shape[0] == w.n + 2  # rows n, n+1: both experts have them, by index
    torch.testing.assert_close(got[w.n:], (e1[w.n:] + e2[w.n:]) / 2)
    assert res.info["vocab"]["matched"] == "rows"
    assert len(transformers.AutoTokenizer.from_pretrained(res.out)) == w.n  # the base's tokenizer, copied
    model = _load(res.out, "llama")
    assert model.config.vocab_size == w.n + 2


def test_errors_name_the_key_and_sizes(tmp_path, worlds):
    w = worlds["llama"]
    with pytest.raises(InputError, match=r"lacks the base's token '<math>' \(row \d+ of key "
                                         r"'model.embed_tokens.weight'; base \d+ rows, expert \d+\)"):
        plan_merge("task_arithmetic", w.experts[1], [w.base, w.experts[0]])
    bare = tmp_path / "bare"
    shutil.copytree(w.base, bare)
    for name in TOKENIZER_FILES:
        (bare / name).unlink(missing_ok=True)
    with pytest.raises(InputError, match=rf"expert \S+bare has {w.n} rows at key 'model.embed_tokens.weight', "
                                         rf"the base \S+ {w.n + 2}; without tokenizers"):
        plan_merge("task_arithmetic", w.experts[1], [bare, w.experts[0]])
    untied = worlds["llama_untied"].experts[1]
    with pytest.raises(InputError, match=r"key 'lm_head.weight' has one row per token in expert \S+expert1 but not "
                                         r"in expert \S+expert2; the experts must store the same"):
        plan_merge("task_arithmetic", w.base, [untied, w.experts[2]])
    with pytest.raises(InputError, match="vocab='all' must be one of base, union"):
        plan_merge("task_arithmetic", w.base, w.experts, vocab="all")


def test_cli_and_config_file(tmp_path, worlds, capsys):
    w = worlds["gpt2"]
    args = ["merge", "--method", "ties", "--base", w.base, "--experts", *w.experts, "--vocab", "union"]
    assert main([*map(str, args), "--dry-run"]) == 0
    assert "vocab: union: the base's" in capsys.readouterr().out
    assert main([*map(str, args), "--out", str(tmp_path / "cli")]) == 0
    assert open_checkpoint(tmp_path / "cli").meta(w.embed).shape[0] == w.n + 3
    cfg = tmp_path / "merge.yaml"
    cfg.write_text(f"method: task_arithmetic\nbase: {w.base}\nexperts: [{', '.join(map(str, w.experts))}]\n"
                   "out: merged\nvocab: base\n")
    assert main(["merge", str(cfg)]) == 0
    assert open_checkpoint(tmp_path / "merged").meta(w.embed).shape[0] == w.n
    cfg.write_text(cfg.read_text().replace("vocab: base", "tokenizer_source: union"))
    with pytest.raises(InputError, match="'tokenizer_source' is mergekit's; acetools' key is 'vocab'"):
        load_config(cfg)


@pytest.mark.parametrize("kind", ["llama_untied", "gpt2"])
def test_union_equals_mergekit_task_arithmetic(tmp_path, worlds, kind):
    """mergekit's ``tokenizer_source: union`` (its union tokenizer and PermutedVocabulary's rows for tokens only
    some models have) followed by task arithmetic gives our union merge's token-indexed keys."""
    build = pytest.importorskip("mergekit.tokenizer.build")
    embed = pytest.importorskip("mergekit.tokenizer.embed")
    from mergekit.common import ModelReference

    w = worlds[kind]
    paths = [w.base, *w.experts]
    refs = [ModelReference.parse(str(p)) for p in paths]
    info = build.build_tokenizer(base_model=refs[0], referenced_models=refs, tokenizer_source="union",
                                 trust_remote_code=False, add_tokens=[])
    permuted = embed.PermutedVocabulary.model_construct(tokens=None, pad_to_multiple_of=None, base_model=refs[0],
                                                        vocabulary_axis=0)
    lam = 0.3
    res = merge_files("task_arithmetic", w.base, w.experts, tmp_path / "out", vocab="union", hparams={"lam": lam},
                      hash_inputs=False)
    ours = open_checkpoint(res.out)
    tok = transformers.AutoTokenizer.from_pretrained(res.out)
    assert tok.get_vocab() == info.tokenizer.get_vocab()
    keys = [k for k in ours.keys() if ours.meta(k).shape[0] == w.n + 3]
    assert w.embed in keys and (kind != "llama_untied" or "lm_head.weight" in keys)
    for key in keys:
        rows = permuted.execute(tokenizer_info=info, tensors={r: open_checkpoint(p).get(key) for r, p in
                                                              zip(refs, paths)})
        want = rows[refs[0]] + lam * sum(rows[r] - rows[refs[0]] for r in refs[1:])
        torch.testing.assert_close(ours.get(key), want, rtol=0, atol=1e-6)


def test_bare_base_with_causal_lm_experts(tmp_path, worlds):
    """A bare ``LlamaModel`` base (keys without ``model.``) beside ``LlamaForCausalLM`` experts with added tokens."""
    w = worlds["llama"]
    bare = tmp_path / "bare"
    transformers.AutoModelForCausalLM.from_pretrained(w.base).model.save_pretrained(bare)
    transformers.AutoTokenizer.from_pretrained(w.base).save_pretrained(bare)
    assert "embed_tokens.weight" in open_checkpoint(bare).keys()
    res = merge_files("ties", bare, w.experts, tmp_path / "out", vocab="union", hash_inputs=False)
    ref = merge_files("ties", w.base, w.experts, tmp_path / "ref", vocab="union", hash_inputs=False)
    got, want = open_checkpoint(res.out).state_dict(), open_checkpoint(ref.out).state_dict()
    assert got.keys() == want.keys()
    for k in want:
        assert torch.equal(got[k], want[k]), k
    assert _load(res.out, "llama").config.vocab_size == w.n + 3


def test_diagnose_reads_the_base_rows(tmp_path, worlds):
    """``acetools diagnose`` on experts with added tokens: the rows of the base's tokens, as a merge sees them."""
    from acetools.files.diagnose import check_inputs, diagnose

    w = worlds["llama"]
    assert check_inputs(w.base, w.experts)["n_tasks"] == 3
    got, want = diagnose(w.base, w.experts), diagnose(w.base, w.truncated)
    assert got.summary["value"].tolist() == want.summary["value"].tolist()


def test_union_sharded_bf16(tmp_path, worlds):
    """Union rows in bf16 shards: the index lists them and the model loads with the union's row count."""
    w = worlds["llama_untied"]
    res = merge_files("ties", w.base, w.experts, tmp_path / "out", vocab="union", dtype="bf16", shard_size="8KB",
                      hash_inputs=False)
    assert len(res.files) > 2 and res.files[-1].name == "model.safetensors.index.json"
    ck = open_checkpoint(res.out)
    assert ck.meta("lm_head.weight").shape == (w.n + 3, 32) and ck.meta("lm_head.weight").dtype == torch.bfloat16
    e1 = open_checkpoint(w.experts[1]).get("lm_head.weight")
    assert torch.equal(ck.get("lm_head.weight")[w.n], e1[w.n].to(torch.bfloat16))
    assert _load(res.out, "llama_untied").config.vocab_size == w.n + 3


def test_padding_rows_of_the_base(tmp_path, worlds):
    """A base whose embedding has rows no token names (padded) matches them by index; ``union`` cannot put new
    tokens after them and says so."""
    w = worlds["llama"]
    model = transformers.AutoModelForCausalLM.from_pretrained(w.base)
    model.resize_token_embeddings(w.n + 2, mean_resizing=False)  # rows n, n + 1: no token
    padded = _save(model, transformers.AutoTokenizer.from_pretrained(w.base), tmp_path / "padded")
    plan = plan_merge("task_arithmetic", padded, w.experts[1:], vocab="base")
    assert plan.vocab.base_rows == w.n + 2 and plan.vocab.dropped == 3
    assert [r[w.n:].tolist() for r in plan.vocab.rows] == [[w.n, w.n + 1]] * 2
    with pytest.raises(InputError, match=rf"vocab='union': the base's tokenizer has {w.n} tokens for {w.n + 2} "
                                         "embedding rows"):
        plan_merge("task_arithmetic", padded, w.experts[1:], vocab="union")
    with pytest.raises(InputError, match=rf"lacks the base's padding row \(no token\) \(row {w.n} of key "):
        plan_merge("task_arithmetic", padded, [w.experts[0], w.experts[1]], vocab="base")
