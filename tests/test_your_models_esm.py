"""docs/your-models.md's ESM example runs as written on tiny GPT-2 folders, and the command line's
merge equals ``acetools.merge`` on the same inputs (before: the default targets were open_clip
names, so ``-p activations=...`` failed on a detected GPT-2 layout)."""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path

import pytest
import torch

import acetools
from acetools.cli import main
from acetools.files.checkpoints import open_checkpoint
from acetools.files.merge_files import load_activations
from tests.merge_helpers import perturbed

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")
DOC = Path(__file__).resolve().parents[1] / "docs" / "your-models.md"


def _blocks() -> tuple[str, str]:
    text = DOC.read_text()
    sec = text[text.index("### ESM on your own model, end to end"):]
    py = re.search(r"```python\n(.*?)```", sec, re.S).group(1)
    sh = re.search(r"```bash\n(.*?)```", sec, re.S).group(1).strip()
    return py, sh


def _folders(root: Path) -> None:
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(vocab_size=64, n_positions=16, n_embd=16, n_layer=2, n_head=2)
    model = transformers.GPT2LMHeadModel(cfg).eval()
    model.save_pretrained(root / "base")
    for t, name in enumerate(("ft_a", "ft_b", "ft_c")):
        perturbed(model, 10 + t).save_pretrained(root / name)


def test_the_documented_esm_example_runs_and_the_cli_equals_merge(tmp_path, monkeypatch):
    _folders(tmp_path)
    monkeypatch.chdir(tmp_path)
    py, sh = _blocks()
    exec(compile(py, str(DOC), "exec"), {"__name__": "__doc_example__"})
    argv = shlex.split(sh)
    assert argv[0] == "acetools"
    with pytest.warns(RuntimeWarning, match=r"c_fc\.weight'.*exceeds the rank"):
        assert main(argv[1:]) == 0
    model, info = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "merged", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    base = open_checkpoint(tmp_path / "base").state_dict()
    experts = [open_checkpoint(tmp_path / e).state_dict() for e in ("ft_a", "ft_b", "ft_c")]
    acts = load_activations(tmp_path / "acts.safetensors", 3)
    with pytest.warns(RuntimeWarning, match="exceeds the rank"):
        ref = acetools.merge("esm", base, experts, layout="gpt2", activations=acts)
    got = open_checkpoint(tmp_path / "merged").state_dict()
    for k, v in ref.items():
        torch.testing.assert_close(got[k], v, rtol=1e-5, atol=1e-6, msg=k)
    assert not torch.allclose(got["transformer.h.0.mlp.c_fc.weight"], base["transformer.h.0.mlp.c_fc.weight"])


def test_esm_activations_load_hf_files_whose_tied_head_is_not_stored(tmp_path):
    """GPT-2 safetensors files without lm_head.weight (tied to wte, stored once) load into the factory's model,
    and the merge of the files takes their activations."""
    from acetools.files.esm_inputs import esm_activations

    _folders(tmp_path)
    files = [tmp_path / n / "model.safetensors" for n in ("base", "ft_a", "ft_b", "ft_c")]
    assert "lm_head.weight" not in open_checkpoint(files[0]).keys()
    g = torch.Generator().manual_seed(1)
    ids = [torch.randint(0, 50, (4, 12), generator=g) for _ in range(3)]
    factory = lambda: transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "base")  # noqa: E731
    acts = esm_activations([str(f) for f in files[1:]], lambda t: ids[t], factory=factory, layout="gpt2")
    with pytest.warns(RuntimeWarning, match="exceeds the rank"):
        merged = acetools.merge("esm", open_checkpoint(files[0]).state_dict(),
                                [open_checkpoint(f).state_dict() for f in files[1:]], layout="gpt2",
                                activations=acts, alpha=1.0)
    assert set(merged) == set(open_checkpoint(files[0]).keys())
    assert all(torch.isfinite(v).all() for v in merged.values() if v.is_floating_point())
