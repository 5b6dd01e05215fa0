"""Real pretrained embeddings: the packaged MiniLM, offline, from safetensors."""

import pytest
import torch

import posenc
from posenc.lab.embeddings import load_embeddings, packaged_minilm_path


def test_packaged_minilm_loads_offline_from_safetensors(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    folder = packaged_minilm_path()
    assert (folder / "model.safetensors").exists()
    assert not list(folder.glob("*.bin"))  # nothing but safetensors could be loaded
    model = load_embeddings()
    assert model.token_embeddings.shape == (30522, 384)
    assert model.position_embeddings.shape == (512, 384)
    assert model.tokenize("The dog chased another dog") == ["the", "dog", "chased", "another", "dog"]


def test_embeddings_are_the_models_own_weights():
    from safetensors.torch import load_file

    weights = load_file(packaged_minilm_path() / "model.safetensors")
    token_key = next(k for k in weights if k.endswith("word_embeddings.weight"))
    position_key = next(k for k in weights if k.endswith("position_embeddings.weight"))
    model = load_embeddings()
    # exact by construction: no arithmetic, the tables are copies of the stored numbers
    assert torch.equal(model.token_embeddings, weights[token_key])
    assert torch.equal(model.position_embeddings, weights[position_key])
    ids = model.encode("dog")
    assert torch.equal(model.embed("dog"), weights[token_key][ids])


def test_bad_input():
    with pytest.raises(TypeError, match="text"):
        load_embeddings().embed(42)
    with pytest.raises(TypeError, match="name_or_path"):
        posenc.lab.embeddings.load_embeddings(3)
