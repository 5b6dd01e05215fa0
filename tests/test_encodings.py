"""posenc.encodings: the plug-in base class keeps its frequency tables in the dtype they were built in."""

import torch

import posenc
from posenc.alibi import ALiBi
from posenc.group_encodings import GroupEncoding
from posenc.nd_rope import NDRoPE


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
