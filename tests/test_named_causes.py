"""Errors that name the cause (issue #39 item 6; docs/your-models.md §What can be read): an index that maps keys
to the wrong shard, an expert that stores a tied alias untied (tiny GPT-2 folders built with transformers),
and ``python -m acetools`` run from a folder that holds a clone named ``acetools/``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from acetools.cli import main
from acetools.errors import InputError, InputKeyError
from acetools.files.checkpoints import ShardedWriter, open_checkpoint
from acetools.files.merge_files import merge_files

ROOT = Path(__file__).resolve().parents[1]


# --------------------------------------------------------------------------- an index that maps keys wrongly
def _sharded(folder: Path, seed: int = 0) -> dict[str, torch.Tensor]:
    """A checkpoint of 30 tensors in 3 shards with its index, as save_pretrained writes one."""
    g = torch.Generator().manual_seed(seed)
    state = {f"layers.{i}.weight": torch.randn(8, 8, generator=g) for i in range(30)}
    with ShardedWriter(folder, shard_size=3000) as w:
        for k, v in state.items():
            w.add(k, v)
    (folder / "config.json").write_text("{}")
    return state


def _rewrite_index(folder: Path, edit) -> dict:
    path = folder / "model.safetensors.index.json"
    index = json.loads(path.read_text())
    edit(index["weight_map"])
    path.write_text(json.dumps(index))
    return index["weight_map"]


def test_an_index_that_maps_keys_to_the_wrong_shard_names_the_entry_and_the_shard_that_holds_the_key(tmp_path):
    folder = tmp_path / "model"
    _sharded(folder)
    shards = sorted(p.name for p in folder.glob("model-*.safetensors"))
    assert len(shards) >= 3
    assert len(open_checkpoint(folder)) == 30  # the index as written is read as it is

    def all_in_first(wm):  # the last shard is no longer listed: its keys would be "missing"
        for k, name in wm.items():
            if name == shards[-1]:
                wm[k] = shards[0]

    wm = _rewrite_index(folder, all_in_first)
    held = set(open_checkpoint(folder / shards[0]).keys())
    wrong = [k for k, name in wm.items() if name == shards[0] and k not in held]  # the last shard's keys
    assert len(wrong) > 1
    with pytest.raises(InputError) as e:
        open_checkpoint(folder)
    msg = str(e.value)
    assert (f"index {folder / 'model.safetensors.index.json'} maps key {wrong[0]!r} to shard {shards[0]!r}, which "
            f"does not hold it (it is in shard {shards[-1]!r}) (and {len(wrong) - 1} more entries like it)") in msg, msg
    assert "missing key" not in msg

    def to_second(wm):  # a listed shard, the wrong one
        wm["layers.0.weight"] = shards[1]

    _rewrite_index(folder, to_second)
    with pytest.raises(InputError, match=rf"maps key 'layers\.0\.weight' to shard '{shards[1]}', which does not hold "
                                         rf"it \(it is in shard '{shards[0]}'\)"):
        open_checkpoint(folder)

    def unknown(wm):
        wm["layers.99.weight"] = shards[1]

    _sharded(folder)  # written again: a correct index
    _rewrite_index(folder, unknown)
    with pytest.raises(InputError, match=rf"maps key 'layers\.99\.weight' to shard '{shards[1]}', which does not "
                                         rf"hold it \(no shard in {folder} holds it\)"):
        open_checkpoint(folder)


def test_the_merge_command_reports_the_wrong_index_entry_not_missing_keys(tmp_path, capsys):
    base, experts = tmp_path / "base", [tmp_path / "e0", tmp_path / "e1"]
    for i, folder in enumerate([base, *experts]):
        _sharded(folder, seed=i)
    shards = sorted(p.name for p in experts[1].glob("model-*.safetensors"))
    _rewrite_index(experts[1], lambda wm: wm.update({k: shards[0] for k in wm}))
    assert main(["merge", "--method", "task_arithmetic", "--base", str(base), "--experts", *map(str, experts),
                 "--out", str(tmp_path / "out"), "-q"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"index {experts[1] / 'model.safetensors.index.json'} maps key" in err[0], err
    assert "which does not hold it (it is in shard 'model-0000" in err[0] and "missing key" not in err[0], err


# --------------------------------------------------------------------------- a tied alias stored untied
transformers = pytest.importorskip("transformers")


def _gpt2(root: Path) -> tuple[Path, Path, Path]:
    """A tied GPT-2 base (its file holds transformer.wte.weight alone), an expert fine-tuned from it and saved
    untied with lm_head equal to its embeddings, and one whose lm_head was trained apart."""
    def config(tied: bool):
        return transformers.GPT2Config(vocab_size=64, n_positions=16, n_embd=16, n_layer=2, n_head=2,
                                       bos_token_id=0, eos_token_id=0, tie_word_embeddings=tied)

    torch.manual_seed(0)
    base = transformers.GPT2LMHeadModel(config(True))
    base.save_pretrained(root / "base")
    for name, apart in (("equal", False), ("apart", True)):
        ex = transformers.GPT2LMHeadModel(config(False))
        ex.load_state_dict(base.state_dict())
        with torch.no_grad():
            for p in ex.transformer.parameters():
                p.add_(0.01 * torch.randn(p.shape))
            ex.lm_head.weight.copy_(ex.transformer.wte.weight + (0.01 * torch.randn(ex.lm_head.weight.shape)
                                                                  if apart else 0))
        ex.save_pretrained(root / name)
    return root / "base", root / "equal", root / "apart"


@pytest.mark.slow  # four tiny GPT-2 folders saved by transformers
def test_an_expert_that_stores_the_tied_lm_head_untied_is_told_about_the_tie(tmp_path, capsys):
    base, equal, apart = _gpt2(tmp_path)
    assert "lm_head.weight" not in open_checkpoint(base) and "lm_head.weight" in open_checkpoint(equal)
    with pytest.raises(InputKeyError) as e:
        merge_files("task_arithmetic", base, [equal, apart], tmp_path / "out")
    msg = str(e.value)
    assert (f"expert {equal} stores 'lm_head.weight' untied, but in the base {base} it is the tied alias of "
            "'transformer.wte.weight' (config tie_word_embeddings=True)") in msg, msg
    assert "its values equal its 'transformer.wte.weight'" in msg and "tie_word_embeddings=true" in msg, msg
    with pytest.raises(InputKeyError, match=r"its values differ from its 'transformer\.wte\.weight' \(trained "
                                            r"untied\): re-save the base untied \(config tie_word_embeddings=false"):
        merge_files("task_arithmetic", base, [apart, equal], tmp_path / "out")
    # the other way round: an untied base, a tied expert (its file lacks lm_head.weight)
    capsys.readouterr()  # transformers' progress bars of the saves above
    assert main(["merge", "--method", "task_arithmetic", "--base", str(apart), "--experts", str(base), str(equal),
                 "--out", str(tmp_path / "out"), "-q", "--force"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"the base {apart} stores 'lm_head.weight' untied, but in expert {base} it is the " \
                             "tied alias of 'transformer.wte.weight'" in err[0] and "re-save the experts untied" \
                             in err[0], err
    # the fix the line gives works: the expert re-saved tied merges
    ex = transformers.GPT2LMHeadModel.from_pretrained(equal)
    ex.config.tie_word_embeddings = True
    ex.tie_weights()
    ex.save_pretrained(tmp_path / "equal-tied")
    ex2 = transformers.GPT2LMHeadModel.from_pretrained(apart)
    ex2.config.tie_word_embeddings = True
    ex2.tie_weights()
    ex2.save_pretrained(tmp_path / "apart-tied")
    res = merge_files("task_arithmetic", base, [tmp_path / "equal-tied", tmp_path / "apart-tied"], tmp_path / "out")
    assert res.out is not None and transformers.GPT2LMHeadModel.from_pretrained(res.out).config.vocab_size == 64


# --------------------------------------------------------------------------- a clone named acetools/ in the cwd
def _editable_finder(folder: Path, package: Path = ROOT / "acetools") -> Path:
    """The finder module an editable install (setuptools' ``pip install -e``) puts in site-packages, mapping
    ``acetools`` to ``package`` (this checkout's): a meta path finder asked after the path search."""
    from setuptools.command import editable_wheel

    template = getattr(editable_wheel, "_finder_template", None)  # what writes site-packages' finder module
    if template is None:
        pytest.skip("this setuptools writes no editable finder module")
    folder.mkdir(parents=True, exist_ok=True)
    source = template("acetools_under_test", {"acetools": str(package)}, {})
    (folder / "acetools_under_test_finder.py").write_text(source)
    return folder


def _clone(folder: Path) -> Path:
    """A folder holding a checkout named ``acetools/`` (its package one level down) and a small merge's files."""
    clone = folder / "acetools"
    (clone / "acetools").mkdir(parents=True)
    (clone / "pyproject.toml").write_text("[project]\nname = 'acetools'\n")
    (clone / "acetools" / "__init__.py").write_text("raise RuntimeError('the clone was imported')\n")
    g = torch.Generator().manual_seed(0)
    base = {"fc.weight": torch.randn(4, 4, generator=g)}
    save_file(base, str(folder / "base.safetensors"))
    for t in range(2):
        save_file({"fc.weight": base["fc.weight"] + 0.01 * torch.randn(4, 4, generator=g)},
                  str(folder / f"e{t}.safetensors"))
    return folder


#: In a child process: this environment's own editable finders taken out, the test's installed instead (as
#: site-packages' .pth file does at startup). The folder holding it comes on the path after the cwd through the
#: child's PYTHONPATH (:func:`_env_with`), as an installed package's folder is.
INSTALL = ("import sys; "
           "sys.meta_path[:] = [f for f in sys.meta_path if getattr(f, '__name__', '') != '_EditableFinder']; "
           "import acetools_under_test_finder as f; f.install(); ")
#: ``python -m acetools ARGS`` after :data:`INSTALL` (runpy, as ``-m`` runs it).
RUN_M = INSTALL + ("import runpy; sys.argv[0] = 'acetools'; "
                   "runpy.run_module('acetools', run_name='__main__', alter_sys=True)")


def _env_with(finder: Path) -> dict[str, str]:
    """This environment with ``finder``'s folder as the only PYTHONPATH entry (``sys.path[1]``, after the cwd)."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"HF_HUB_OFFLINE": "1",
                                                                        "PYTHONPATH": str(finder)}


MERGE = ["merge", "--method", "task_arithmetic", "--base", "base.safetensors", "--experts", "e0.safetensors",
         "e1.safetensors", "--out", "merged", "-q"]


@pytest.mark.slow  # a child process that imports torch
def test_python_m_acetools_runs_from_a_folder_that_holds_a_clone_named_acetools(tmp_path):
    work = _clone(tmp_path / "work")
    finder = _editable_finder(tmp_path / "site")
    env = _env_with(finder)
    # python -m acetools, as an editable install runs it: the finder installed at startup, the folder first on
    # sys.path (the clone's acetools/ is found there first, as an empty namespace package)
    run_m = RUN_M
    done = subprocess.run([sys.executable, "-c", run_m, *MERGE], cwd=work, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (work / "merged" / "model.safetensors").is_file()
    assert "__version__" not in done.stderr and "the clone was imported" not in done.stderr
    probe = INSTALL + "import acetools; print(acetools.__path__)"
    shadow = subprocess.run([sys.executable, "-c", probe], cwd=work, env=env, capture_output=True,
                            text=True, timeout=60)
    assert str(work / "acetools") in shadow.stdout and "_NamespacePath" in shadow.stdout  # the shadowing itself


def test_a_shadowing_clone_that_cannot_be_worked_around_is_one_line_naming_it(tmp_path):
    """An install whose __main__.py has no __init__.py beside it: one line naming the folder and the fix."""
    work = _clone(tmp_path / "work")
    lone = tmp_path / "lone" / "acetools"
    lone.mkdir(parents=True)
    (lone / "__main__.py").write_text((ROOT / "acetools" / "__main__.py").read_text())
    site = _editable_finder(tmp_path / "site", lone)
    env = _env_with(site)
    run_m = RUN_M
    done = subprocess.run([sys.executable, "-c", run_m, "--help"], cwd=work, env=env,
                          capture_output=True, text=True, timeout=60)
    err = done.stderr.strip().splitlines()
    assert done.returncode == 1 and len(err) == 1, done.stderr
    assert f"the folder {work / 'acetools'} (no __init__.py) shadows the installed acetools package" in err[0]
    assert "cd elsewhere" in err[0] and "rename that folder" in err[0]


@pytest.mark.slow  # a child process that imports torch
def test_the_installed_command_runs_from_a_folder_that_holds_a_clone(tmp_path):
    """The same with the real ``python -m acetools``, where the installed package is this checkout (CI)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"HF_HUB_OFFLINE": "1"}
    where = subprocess.run([sys.executable, "-c", "import importlib.util as u; print(u.find_spec('acetools').origin)"],
                           cwd="/", env=env, capture_output=True, text=True, timeout=60).stdout.strip()
    if Path(where or "/").resolve() != (ROOT / "acetools" / "__init__.py").resolve():
        pytest.skip(f"the installed acetools is {where}, not this checkout")
    work = _clone(tmp_path / "work")
    done = subprocess.run([sys.executable, "-m", "acetools", *MERGE], cwd=work, env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0 and (work / "merged" / "model.safetensors").is_file(), done.stderr[-3000:]
