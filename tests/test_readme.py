"""The README and the book pages it sends readers to: every Python example runs as written, and every command names
something that exists (a Makefile target, a module run with ``python -m``, a file).

The README's transformers example is run by tests/test_transformers_rope.py (it needs transformers' tiny model
factory); the README's examples are also type-checked by tests/test_typing.py. Building the book or running the whole
test suite from a test is not possible (``make test`` is what runs this file), so ``make book``/``make test`` are
checked as targets of the Makefile, and their own output is tested where it is made (tests/book).

Under ``ATEN_CPU_CAPABILITY=default`` (``make unit-portable``: torch's non-vectorised kernels) torch itself cannot run
two things the examples use: a bfloat16 matmul (its packing routine requires AVX-512 there: "pack_vnni2 is only
supported when avx512 is supported") and inductor's C++ kernels (they reference ``at::vec``, which that build leaves
out). Those examples are skipped there and run in ``make test``; the portable run is for numerics, which they do not
test.
"""

import importlib.util
import os
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = [README] + [ROOT / "book" / f"{name}.md" for name in ("library", "contributing", "performance")]
TRANSFORMERS_SECTION = "### A transformers model with posenc's RoPE"


def python_blocks(path: Path) -> list[str]:
    text = path.read_text()
    if path == README:  # its transformers example runs in tests/test_transformers_rope.py
        start = text.index(TRANSFORMERS_SECTION)
        end = text.find("\n## ", start)
        text = text[:start] + text[end:]
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


EXAMPLES = [(path, index) for path in PAGES for index in range(len(python_blocks(path)))]


def test_the_readme_is_a_short_front_door():
    text = README.read_text()
    assert len(text.splitlines()) <= 120
    for command in ("make book", "make test"):
        assert "```bash\n" in text and command in text.split("```bash\n", 1)[1].split("```", 1)[0]
    screenshot = re.search(r"!\[[^\]]+\]\(([^)]+\.png)\)", text)
    assert screenshot, "the README shows a screenshot of a chapter"
    image = ROOT / screenshot.group(1)
    assert image.exists() and image.stat().st_size < 200_000, f"{image}: missing or over 200 kB"
    assert image.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_pages_the_readme_links_exist_and_are_in_the_book():
    links = re.findall(r"\]\(((?:book|docs)/[^)#]+)\)", README.read_text())
    assert {"book/contributing.md", "book/performance.md", "book/library.md", "book/api/index.md"} <= set(links)
    toc = (ROOT / "_toc.yml").read_text()
    for link in links:
        assert (ROOT / link).exists(), link
        if link.endswith(".md"):
            assert f"- file: {link[:-3]}\n" in toc, f"{link} is not a page of the book (_toc.yml)"


def test_every_page_has_examples():
    assert len(python_blocks(README)) >= 1 and len(python_blocks(ROOT / "book" / "library.md")) >= 4


@pytest.mark.parametrize("path,index", EXAMPLES, ids=[f"{p.stem}-{i + 1}" for p, i in EXAMPLES])
def test_example_runs(path, index):
    block = python_blocks(path)[index]
    if os.environ.get("ATEN_CPU_CAPABILITY") == "default" and ("bfloat16" in block or "torch.compile" in block):
        pytest.skip("torch cannot run bfloat16 matmuls or inductor kernels under ATEN_CPU_CAPABILITY=default")
    exec(compile(block, f"{path.relative_to(ROOT)}, example {index + 1}", "exec"), {"__name__": "readme_example"})


def makefile_targets() -> set[str]:
    return set(re.findall(r"^([a-z][a-z0-9-]*):", (ROOT / "Makefile").read_text(), flags=re.M))


@pytest.mark.parametrize("path", PAGES, ids=lambda p: p.stem)
def test_every_command_names_what_exists(path):
    text = path.read_text()
    targets = re.findall(r"`make ([a-z][a-z0-9-]*)", text) + re.findall(r"^make ([a-z][a-z0-9-]*)", text, flags=re.M)
    modules = re.findall(r"python -m ([A-Za-z_][\w.]*)", text)
    assert targets or path.name in ("library.md",), f"{path.name} names no make target"
    missing = sorted(set(targets) - makefile_targets())
    assert not missing, f"{path.name} names make targets the Makefile lacks: {missing}"
    for module in set(modules):
        assert importlib.util.find_spec(module) is not None, f"{path.name}: python -m {module}: no such module"
    for name in re.findall(r"`((?:book|tests|posenc|benchmarks)/[\w./-]+\.(?:py|md|yml|json))`", text):
        assert (ROOT / name).exists() or "<" in name, f"{path.name} names {name}, which does not exist"
