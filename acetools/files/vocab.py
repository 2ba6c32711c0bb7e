"""Vocabularies: merge experts whose embedding and output rows differ from the base's (added tokens,
``resize_token_embeddings``), by ``vocab="base"`` or ``"union"`` (docs/your-models.md §Vocabularies).

:func:`plan_vocab` matches every model's rows to the base's by token string (through the folders'
tokenizers; by row index when a model has none) and gives :class:`VocabPlan`, whose :meth:`~VocabPlan.views`
are the experts with the base's rows only (so every method merges the rows all models share like
any other parameter), whose :meth:`~VocabPlan.emit` appends the rows only some experts have
(``union``), and whose :meth:`~VocabPlan.write_files` writes the matching tokenizer and ``config.json``.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
import tempfile
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from ..errors import InputError, InputKeyError
from ..layouts import Layout, TensorMeta
from ..utils import atomic_write
from .checkpoints import Checkpoint

__all__ = ["VOCAB_MODES", "VocabPlan", "plan_vocab", "TOKENIZER_FILES"]

log = logging.getLogger("acetools.files.vocab")

#: The values of ``vocab=`` / ``--vocab``.
VOCAB_MODES = ("base", "union")
#: Files of a folder's tokenizer (replaced together by a ``union`` merge's tokenizer).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                   "vocab.json", "merges.txt", "vocab.txt", "tokenizer.model", "spiece.model",
                   "sentencepiece.bpe.model")
# the input embedding whose rows are the vocabulary (Llama/Mistral/Qwen, GPT-2, BERT/RoBERTa, GPT-NeoX, T5/BART)
_EMBEDDING = re.compile(r"(^|\.)(embed_tokens|wte|word_embeddings|tok_embeddings|embed_in|shared)\.weight$")


def _vocab_rows(ck: Checkpoint) -> tuple[str, int] | None:
    """``(key, rows)`` of the input token embedding of ``ck`` (None: none found)."""
    return next(((k, int(m.shape[0])) for k, m in ck.metas().items()
                 if _EMBEDDING.search(k) and len(m.shape) == 2 and m.dtype.is_floating_point), None)


def _vocab_keys(ck: Checkpoint, layout: Layout, rows: int) -> list[str]:
    """The keys of ``ck`` indexed by token on dim 0: embeddings and output heads (weights and biases) with
    ``rows`` rows."""
    return [k for k, m in ck.metas().items() if m.dtype.is_floating_point and len(m.shape) in (1, 2)
            and m.shape[0] == rows and (_EMBEDDING.search(k) or layout.role(k, m) in ("embedding", "head"))]


def _has_tokenizer(folder: Path | None) -> bool:
    return folder is not None and any((folder / name).is_file() for name in TOKENIZER_FILES)


def _tokenizer_bytes(folder: Path) -> tuple:
    return tuple((name, (folder / name).read_bytes()) for name in TOKENIZER_FILES if (folder / name).is_file())


def _load_tokenizer(folder: Path) -> Any:
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(folder))
    except Exception as e:  # transformers raises many types for a folder it cannot read
        raise InputError(f"{folder}: its tokenizer files cannot be loaded with transformers.AutoTokenizer "
                         f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); fix or remove them "
                         "(without a tokenizer rows are matched by index)") from None


class VocabView(Checkpoint):
    """A :class:`~acetools.files.checkpoints.Checkpoint` whose token-indexed keys hold the rows ``rows``
    (the base's tokens, in the base's order); every other key as stored."""

    def __init__(self, inner: Checkpoint, keys: Sequence[str], rows: Tensor):  # noqa: D107 - no super().__init__: nothing is read
        self.inner = inner
        self.rows = rows
        self.path, self.files, self.config, self.folder = inner.path, inner.files, inner.config, inner.folder
        self.vocab_keys = frozenset(keys)
        self._meta = {k: (TensorMeta((len(rows), *m.shape[1:]), m.dtype) if k in self.vocab_keys else m)
                      for k, m in inner.metas().items()}
        n = len(rows)  # the base's rows are the expert's first ones (an expert that added tokens): a slice
        self._prefix = bool(n == 0 or torch.equal(rows, torch.arange(n)))

    def get(self, key: str) -> Tensor:
        t = self.inner.get(key)
        if key not in self.vocab_keys:
            return t
        return t[: len(self.rows)] if self._prefix else t.index_select(0, self.rows)

    def close(self) -> None:
        self.inner.close()

    def __repr__(self) -> str:
        return f"VocabView({self.inner!r}, {len(self.rows)} of its rows)"


@dataclass
class VocabPlan:
    """What a merge does with the token-indexed keys (:func:`plan_vocab`)."""

    mode: str  # "same" (every model has the base's vocabulary), "base" or "union"
    matched: str = ""  # "tokens" (by token string) or "rows" (by row index: a model has no tokenizer)
    base_rows: int = 0
    out_rows: int = 0
    rows: list[Tensor] = field(default_factory=list)  # per expert: its row of each base row
    keys: list[list[str]] = field(default_factory=list)  # per expert: its token-indexed keys
    # per extra output row (union): the token (None: matched by row) and the (expert, row) pairs that have it
    extra: list[tuple[str | None, list[tuple[int, int]]]] = field(default_factory=list)
    dropped: int = 0  # tokens (rows) only experts have that the output leaves out ("base")
    experts: list[Checkpoint] = field(default_factory=list)  # as given (before views)
    tokenizer: Any = None  # union: the tokenizer to write (the base's plus the extra tokens, ids = rows)
    reason: str = ""

    def summary(self) -> str:
        """The dry run's line."""
        if self.mode == "same":
            return "vocab: every model has the base's vocabulary"
        how = "by token string (tokenizers)" if self.matched == "tokens" else \
            "by row index (a model has no tokenizer: the base's rows first)"
        if self.mode == "base":
            return (f"vocab: base ({self.reason}): the base's {self.base_rows} rows, matched {how}; {self.dropped} "
                    "rows only experts have are left out")
        return (f"vocab: union: the base's {self.base_rows} rows matched {how}, merged; {len(self.extra)} rows "
                f"only some experts have appended ({self.out_rows} rows)")

    def as_dict(self) -> dict[str, Any]:
        """For ``acetools_merge.json``."""
        return {"mode": self.mode, "matched": self.matched, "base_rows": self.base_rows, "rows": self.out_rows,
                "added": [tok if tok is not None else f"row {self.base_rows + i}"
                          for i, (tok, _) in enumerate(self.extra)], "dropped": self.dropped}

    def views(self, base: Checkpoint, experts: Sequence[Checkpoint]) -> tuple[Checkpoint, list[Checkpoint]]:
        """Base and experts with the base's rows only, in the base's order (the base as given)."""
        if self.mode == "same":
            return base, list(experts)
        return base, [VocabView(ck, keys, rows) for ck, keys, rows in zip(experts, self.keys, self.rows)]

    def extra_rows(self, key: str, like: Tensor) -> Tensor:
        """The rows ``union`` appends to ``key``: each the mean of the rows of the experts that have its token
        (one expert: its row), in ``like``'s dtype."""
        out = torch.empty((len(self.extra), *like.shape[1:]), dtype=like.dtype, device=like.device)
        cache: dict[int, Tensor] = {}
        for j, (_, have) in enumerate(self.extra):
            acc = None
            for t, r in have:
                if t not in cache:
                    cache[t] = self.experts[t].get(key)
                row = cache[t][r].to(torch.float64 if like.dtype == torch.float64 else torch.float32)
                acc = row if acc is None else acc + row
            assert acc is not None, "an extra row has at least one expert"
            out[j] = (acc / len(have)).to(like.dtype)
        return out

    def emit(self, add: Callable[[str, Tensor], None]) -> Callable[[str, Tensor], None]:
        """``add`` with the extra rows appended to every token-indexed key (``union``)."""
        if self.mode != "union" or not self.extra:
            return add
        keys = set(self.keys[0])

        def emit(key: str, tensor: Tensor) -> None:
            if key in keys:
                tensor = torch.cat([tensor, self.extra_rows(key, tensor)])
            add(key, tensor)

        return emit

    def out_metas(self, metas: Mapping[str, TensorMeta]) -> dict[str, TensorMeta]:
        """The output's shapes (``metas``: the merge's, the base's rows)."""
        keys = set(self.keys[0]) if self.mode == "union" else set()
        return {k: TensorMeta((self.out_rows, *m.shape[1:]), m.dtype) if k in keys else m for k, m in metas.items()}

    def write_files(self, out: Path) -> list[str]:
        """After the base's side files are copied into ``out``: ``union``'s tokenizer (replacing the base's
        tokenizer files) and ``config.json``'s ``vocab_size``; returns the names written."""
        if self.mode == "same":
            return []
        written = []
        if self.tokenizer is not None:
            with tempfile.TemporaryDirectory(prefix=".acetools-tokenizer-", dir=out) as tmp:
                self.tokenizer.save_pretrained(tmp)
                for name in TOKENIZER_FILES:
                    (out / name).unlink(missing_ok=True)
                for f in sorted(Path(tmp).iterdir()):
                    with atomic_write(out / f.name) as fh, open(f, "rb") as src:
                        shutil.copyfileobj(src, fh)
                    written.append(f.name)
        cfg_path = out / "config.json"
        if cfg_path.is_file():
            cfg = json.loads(cfg_path.read_text())
            if "vocab_size" in cfg and cfg["vocab_size"] != self.out_rows:
                cfg["vocab_size"] = self.out_rows
                with atomic_write(cfg_path, "w") as fh:
                    json.dump(cfg, fh, indent=2, sort_keys=True)
                written.append("config.json")
        return written


def _token_rows(base: Checkpoint, experts: Sequence[Checkpoint], sizes: Sequence[int], key: str
                ) -> tuple[list[Tensor], list[tuple[str | None, list[tuple[int, int]]]], list[Any]]:
    """Rows matched by token string: per expert its row of each base row, the tokens only experts have (each
    with the (expert, row) pairs holding it, in order of first appearance), and the tokenizers (the base's
    first)."""
    toks = [_load_tokenizer(ck.folder) for ck in (base, *experts) if ck.folder is not None]
    assert len(toks) == len(experts) + 1, "tokenizers live in folders"
    vocabs = [{t: i for t, i in tok.get_vocab().items() if i < n}  # ids past the rows: padding (mergekit ignores)
              for tok, n in zip(toks, sizes)]
    base_of_row = [None] * sizes[0]  # a base row no token names (padding) is matched by index
    for t, i in vocabs[0].items():
        base_of_row[i] = t
    rows = []
    for e, (ck, voc) in enumerate(zip(experts, vocabs[1:])):
        idx = [r if t is None else voc.get(t, -1) for r, t in enumerate(base_of_row)]
        bad = next((r for r, i in enumerate(idx) if i < 0 or i >= sizes[e + 1]), None)
        if bad is not None:
            what = f"token {base_of_row[bad]!r}" if base_of_row[bad] is not None else "padding row (no token)"
            raise InputError(f"vocabulary: expert {ck.path} lacks the base's {what} (row {bad} of key {key!r}; base "
                             f"{sizes[0]} rows, expert {sizes[e + 1]}); every expert must keep the base's tokens "
                             "(vocab base/union only add or drop the experts' own tokens)")
        rows.append(torch.tensor(idx, dtype=torch.long))
    extra: dict[str, list[tuple[int, int]]] = {}
    for e, voc in enumerate(vocabs[1:]):
        for tok, i in sorted(voc.items(), key=lambda kv: kv[1]):
            if tok not in vocabs[0]:
                extra.setdefault(tok, []).append((e, i))
    return rows, list(extra.items()), toks


def _index_rows(base: Checkpoint, experts: Sequence[Checkpoint], sizes: Sequence[int], key: str
                ) -> tuple[list[Tensor], list[tuple[str | None, list[tuple[int, int]]]]]:
    """Rows matched by index: the base's rows are every expert's first ones; row ``j`` past them is held by the
    experts with more than ``j`` rows."""
    for ck, n in zip(experts, sizes[1:]):
        if n < sizes[0]:
            raise InputError(f"vocabulary: expert {ck.path} has {n} rows at key {key!r}, the base {base.path} "
                             f"{sizes[0]}; without tokenizers rows are matched by index, and the base's last "
                             f"{sizes[0] - n} rows have no match in it (add the tokenizer files to both folders)")
    extra: list[tuple[str | None, list[tuple[int, int]]]] = [
        (None, [(e, j) for e, n in enumerate(sizes[1:]) if n > j]) for j in range(sizes[0], max(sizes))]
    return [torch.arange(sizes[0]) for _ in experts], extra


def plan_vocab(vocab: str | None, base: Checkpoint, experts: Sequence[Checkpoint], layout: Layout) -> VocabPlan:
    """Match the experts' token rows to the base's and resolve ``vocab`` (:data:`VOCAB_MODES`; ``None``:
    ``"base"`` with a warning when an expert has tokens the base lacks; docs/your-models.md §Vocabularies).
    Errors name the expert, the key and the sizes."""
    if vocab is not None and vocab not in VOCAB_MODES:
        raise InputError(f"vocab={vocab!r} must be one of {', '.join(VOCAB_MODES)}")
    found = [_vocab_rows(ck) for ck in (base, *experts)]
    if found[0] is None or any(f is None for f in found):
        return VocabPlan("same")
    key, sizes = found[0][0], [f[1] for f in found if f is not None]
    folders = [ck.folder for ck in (base, *experts)]
    tokenizers = all(_has_tokenizer(f) for f in folders)
    same_files = tokenizers and len({_tokenizer_bytes(f) for f in folders if f is not None}) == 1
    if len(set(sizes)) == 1 and (same_files or not tokenizers):
        return VocabPlan("same")
    keys = [_vocab_keys(ck, layout, n) for ck, n in zip(experts, sizes[1:])]
    toks: list[Any] = []
    if tokenizers:
        rows, extra, toks = _token_rows(base, experts, sizes, key)
        matched = "tokens"
    else:
        rows, extra = _index_rows(base, experts, sizes, key)
        matched = "rows"
        log.info("vocabulary: %s has no tokenizer files; rows matched by index, the base's %d rows first",
                 next(f for f in folders if not _has_tokenizer(f)), sizes[0])
    if not extra and all(torch.equal(r, torch.arange(sizes[0])) for r in rows) and len(set(sizes)) == 1:
        return VocabPlan("same")  # tokenizer files differ in bytes, not in tokens
    # compared among the experts: a bare base's names differ (docs/your-models.md §Bare backbones and task models)
    for ck, ks in zip(experts[1:], keys[1:]):
        if set(ks) != set(keys[0]):
            odd = sorted(set(ks) ^ set(keys[0]))[0]
            one, other = (experts[0].path, ck.path) if odd in keys[0] else (ck.path, experts[0].path)
            raise InputKeyError(f"vocabulary: key {odd!r} has one row per token in expert {one} but not in expert "
                                f"{other}; the experts must store the same embedding and output keys")
    mode, reason = vocab or "base", "asked" if vocab else "the default"
    if vocab is None and extra:
        warnings.warn(f"vocabulary: experts have {len(extra)} rows the base lacks (e.g. "
                      f"{extra[0][0] if extra[0][0] is not None else f'row {sizes[0]}'!r} in expert "
                      f"{experts[extra[0][1][0][0]].path}); they are left out (vocab='base', the default); pass "
                      "vocab='union' (--vocab union) to keep them", UserWarning, stacklevel=4)
    tokenizer = None
    if mode == "union" and extra and toks:
        tokenizer = _union_tokenizer(toks, extra, sizes[0])
    out_rows = sizes[0] + (len(extra) if mode == "union" else 0)
    return VocabPlan(mode, matched, sizes[0], out_rows, rows, keys, extra if mode == "union" else [],
                     len(extra) if mode == "base" else 0, list(experts), tokenizer, reason)


def _union_tokenizer(toks: Sequence[Any], extra: Sequence[tuple[str | None, Any]], base_rows: int) -> Any:
    """The base's tokenizer (``toks[0]``) plus every extra token (with its settings in the first expert that
    has it as an added token), each at id ``base_rows + j``."""
    from transformers import AddedToken

    tok0 = toks[0]
    if len(tok0) != base_rows:
        raise InputError(f"vocab='union': the base's tokenizer has {len(tok0)} tokens for {base_rows} embedding rows; "
                         "tokens cannot be appended after the rows (use vocab='base')")
    with tempfile.TemporaryDirectory(prefix="acetools-tokenizer-") as tmp:  # a copy: the base's stays as loaded
        tok0.save_pretrained(tmp)
        out = _load_tokenizer(Path(tmp))
    settings: dict[str, Any] = {}
    for tok in toks[1:]:
        for info in tok.added_tokens_decoder.values():
            settings.setdefault(info.content, info)
    for j, (tok, _) in enumerate(extra):
        assert tok is not None, "tokens are matched by string here"
        info = settings.get(tok)
        new = AddedToken(tok, single_word=info.single_word, lstrip=info.lstrip, rstrip=info.rstrip,
                         normalized=info.normalized, special=info.special) if info is not None else AddedToken(tok)
        out.add_tokens([new], special_tokens=bool(info is not None and info.special))
        got = out.convert_tokens_to_ids(tok)
        if got != base_rows + j:
            raise InputError(f"vocab='union': the merged tokenizer gives token {tok!r} id {got}, expected row "
                             f"{base_rows + j}; use vocab='base'")
    return out
