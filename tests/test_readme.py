"""Every Python example of the README's "Use posenc in your model" section runs as written."""
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
    exec(compile(_blocks()[index], f"README.md, example {index + 1}", "exec"), {"__name__": "readme_example"})
