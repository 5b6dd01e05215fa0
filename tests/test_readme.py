"""Every Python example of the README's "Use posenc in your model" section runs as written.

Under ``ATEN_CPU_CAPABILITY=default`` (``make unit-portable``: torch's non-vectorised kernels) torch itself cannot run
two things the examples use: a bfloat16 matmul (its packing routine requires AVX-512 there: "pack_vnni2 is only
supported when avx512 is supported") and inductor's C++ kernels (they reference ``at::vec``, which that build leaves
out). Those examples are skipped there and run in ``make test``; the portable run is for numerics, which they do not
test.
"""
import os
import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
SECTION = "## Use posenc in your model"


def _blocks():
    text = README.read_text()
    start = text.index(SECTION)
    end = text.find("\n## ", start + len(SECTION))
    return re.findall(r"```python\n(.*?)```", text[start:end if end > 0 else None], flags=re.S)


def test_the_section_has_examples():
    assert len(_blocks()) >= 2


@pytest.mark.parametrize("index", range(len(_blocks())))
def test_readme_example_runs(index):
    block = _blocks()[index]
    if os.environ.get("ATEN_CPU_CAPABILITY") == "default" and ("bfloat16" in block or "torch.compile" in block):
        pytest.skip("torch cannot run bfloat16 matmuls or inductor kernels under ATEN_CPU_CAPABILITY=default")
    exec(compile(_blocks()[index], f"README.md, example {index + 1}", "exec"), {"__name__": "readme_example"})
