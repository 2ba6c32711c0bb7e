"""The mini-world's model sizes as open_clip model configs (``sizes.json``, the schema of open_clip's
``model_configs/*.json``; ``head_width`` sets the number of attention heads), in a module without torch
(the command line checks ``--size`` against it before anything heavy loads)."""

from __future__ import annotations

import json
from pathlib import Path

__all__ = ["SIZES"]

SIZES: dict[str, dict] = json.loads(Path(__file__).with_name("sizes.json").read_text(encoding="utf-8"))["sizes"]
