"""posenc.lab.experiments: the package re-exports every name of its rooms, those the chapters and tools read as
``ex.NAME`` among them."""

import json
import pathlib
import re

from posenc.lab import experiments as ex
from posenc.lab.experiments import config, model, registry, training

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_every_public_function_and_class_of_the_rooms_is_exported():
    for module in (config, registry, model, training):
        defined = [
            name
            for name, value in vars(module).items()
            if not name.startswith("_") and getattr(value, "__module__", None) == module.__name__
        ]
        assert defined and set(defined) <= set(ex.__all__), module.__name__
    assert len(ex.__all__) == len(set(ex.__all__)) and all(hasattr(ex, name) for name in ex.__all__)


def test_the_names_the_chapters_and_the_lab_read_are_there():
    """Every ``ex.NAME`` in the notebooks, posenc/lab and book/tools resolves (the chapters need no edit)."""
    used = set()
    for path in [*ROOT.glob("notebooks/*.ipynb"), *ROOT.glob("posenc/lab/*.py"), *ROOT.glob("book/tools/*.py")]:
        text = path.read_text()
        if path.suffix == ".ipynb":
            text = "\n".join(
                "".join(cell["source"]) for cell in json.loads(text)["cells"] if cell["cell_type"] == "code"
            )
        if re.search(r"import experiments as ex\b", text):
            used |= set(re.findall(r"\bex\.([A-Za-z_][A-Za-z0-9_]*)", text))
    assert {"ENCODINGS", "BEYOND_ENCODINGS", "Ensemble", "run_plan", "threads", "with_rope"} <= used
    assert not [name for name in sorted(used) if not hasattr(ex, name)]
