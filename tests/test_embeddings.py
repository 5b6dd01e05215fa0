"""Real pretrained embeddings: the packaged MiniLM, offline, from safetensors."""

import pytest
import torch

import posenc
from posenc.lab.embeddings import load_embeddings, packaged_minilm_path, sentence_windows


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


def test_sentence_windows_run_across_sentences_and_stop_at_the_document_end():
    ids = torch.arange(1, 11)  # a document of 10 tokens
    windows, lengths, sentence_lengths, size = sentence_windows(ids, torch.tensor([0, 3, 8]), width=4)
    assert windows.tolist() == [[1, 2, 3, 4], [4, 5, 6, 7], [9, 10, 0, 0]]  # the last padded with 0
    assert lengths.tolist() == [4, 4, 2] and sentence_lengths.tolist() == [3, 4, 2] and size.tolist() == [10] * 3
    # every window's tokens are the document's, from its sentence start on
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(1, 50, (300,), generator=generator)
    starts = torch.randperm(300, generator=generator)[:40].sort().values
    windows, lengths, sentence_lengths, _ = sentence_windows(ids, starts)
    assert windows.shape == (40, 128)
    for start, window, length in zip(starts.tolist(), windows, lengths.tolist()):
        assert length == min(128, 300 - start) and torch.equal(window[:length], ids[start : start + length])
        assert (window[length:] == 0).all()
    gaps = torch.cat([starts[1:], torch.tensor([300])]) - starts
    assert torch.equal(sentence_lengths, gaps.clamp(max=128)) and (sentence_lengths <= lengths).all()


def test_sentence_windows_bad_input():
    ids = torch.arange(10)
    with pytest.raises(TypeError, match="ids"):
        sentence_windows(ids.float(), torch.tensor([0]))
    with pytest.raises(TypeError, match="first_token"):
        sentence_windows(ids, [0, 3])
    with pytest.raises(ValueError, match="width"):
        sentence_windows(ids, torch.tensor([0]), width=0)
    for starts in ([3, 3], [5, 2], [-1], [10]):
        with pytest.raises(ValueError, match="first_token"):
            sentence_windows(ids, torch.tensor(starts))
