"""Run by every kernel of a static (book) build before its first cell (``--IPKernelApp.exec_files``).

In a Jupyter kernel ``tqdm.auto`` and ``tqdm.autonotebook`` draw their progress bar as an ipywidgets view, which a
static page keeps as a dead widget (transformers' bar while it dequantises chapter 12's GGUF file, when the model
cache is missing). Here both name tqdm's text bar instead, which ``TQDM_DISABLE=1`` (run_notebooks.KERNEL_ENV) turns
off. Nothing is left in the notebook's namespace.
"""

import sys as _sys

try:
    import tqdm.std as _tqdm_std
except ImportError:
    pass
else:
    _sys.modules.setdefault("tqdm.autonotebook", _tqdm_std)
    del _tqdm_std
del _sys
