"""posenc as a library in someone else's model (issue 24): dtypes, shapes, compile and export, packaging."""
from __future__ import annotations

import pytest
import torch

import posenc
from posenc.alibi import ALiBi
from posenc.group_encodings import GroupEncoding
from posenc.nd_rope import NDRoPE


# ------------------------------------------------------------------------------------------ float32 tables
@pytest.mark.parametrize("cast", ["to_bf16", "half", "bfloat16", "double"])
@pytest.mark.parametrize("rope_type", ["default", "linear", "yarn"])
def test_cast_module_keeps_float32_frequencies(cast, rope_type):
    params = None if rope_type == "default" else {"rope_type": rope_type, "factor": 4.0}
    reference = posenc.RotaryEmbedding(64, params)
    module = posenc.RotaryEmbedding(64, params)
    module = {"to_bf16": lambda m: m.to(torch.bfloat16), "half": lambda m: m.half(),
              "bfloat16": lambda m: m.bfloat16(), "double": lambda m: m.double()}[cast](module)
    assert module.inv_freq.dtype == torch.float32
    assert torch.equal(module.inv_freq, reference.inv_freq)
    positions = torch.tensor([0, 1, 7, 8_000, 65_535, 100_000])
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        q = torch.randn(2, 3, len(positions), 64, generator=torch.Generator().manual_seed(0)).to(dtype)
        out, _ = module(q, q, positions)
        expected, _ = reference(q, q, positions)
        assert out.dtype == dtype
        # same float32 tables, same arithmetic: equal bit for bit, at every position up to 100,000
        assert torch.equal(out, expected)


def test_cast_bf16_frequencies_would_be_wrong():
    """The control: a bf16-rounded inv_freq moves the rotated queries at position 8,000 by more than 1."""
    module = posenc.RotaryEmbedding(64)
    q = torch.randn(1, 1, 1, 64, generator=torch.Generator().manual_seed(0))
    positions = torch.tensor([8_000])
    good = posenc.apply_rope(q, *posenc.rope_cos_sin(positions, module.inv_freq))
    bad = posenc.apply_rope(q, *posenc.rope_cos_sin(positions, module.inv_freq.bfloat16().float()))
    assert (good - bad).abs().max() > 1


def test_cast_other_encodings_keep_their_tables():
    alibi, nd = ALiBi(8), NDRoPE(16, variant="axial")
    group = GroupEncoding(posenc.generators.rope_generator(8))
    before = [alibi.slopes.clone(), nd.weights.clone(), group.generator.clone()]
    for module in (alibi, nd, group):
        module.to(torch.bfloat16)
    after = [alibi.slopes, nd.weights, group.generator]
    for b, a in zip(before, after):
        assert a.dtype == b.dtype and torch.equal(a, b)
    learnable = NDRoPE(16, variant="mixed")  # a Parameter follows the model's dtype, as any weight does
    assert learnable.half().weights.dtype == torch.float16


def test_cast_module_moves_device_and_loads_state():
    module = posenc.RotaryEmbedding(32).to("meta", torch.bfloat16)
    assert module.inv_freq.device.type == "meta" and module.inv_freq.dtype == torch.float32
