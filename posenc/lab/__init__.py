"""The book's lab: what the chapters use around the library, not what a model needs.

* :mod:`posenc.lab.interactive`: live and static sliders from one drawing function;
* :mod:`posenc.lab.tasks` and :mod:`posenc.lab.experiments`: synthetic order tasks and small transformers to train
  (the encodings by name, the model, the training: ``experiments.registry``, ``.model``, ``.training``);
  :mod:`posenc.lab.tables` formats their results;
* :mod:`posenc.lab.embeddings`: real pretrained token and position embeddings (MiniLM offline), and chapter 9's
  windows of text;
* :mod:`posenc.lab.tiny_models`: tiny random ``transformers`` models, the reference computations of chapter 13 and
  the tests (not imported here);
* :mod:`posenc.lab.language_model`: a real Llama-architecture model (SmolLM2-135M) loaded offline and run with
  posenc's RoPE; :mod:`posenc.lab.long_context`: chapter 12's study of it beyond its trained context (not imported
  here);
* :mod:`posenc.lab.geometry`: positional distributions, Hellinger distances, classical MDS, stress;
* :mod:`posenc.lab.experiments_study`: chapter 11's trained study (ALiBi's slope family, the budget check on fetch)
  and its attention probes (not imported here);
* :mod:`posenc.lab.hybrid_study`: chapter 13's trained comparison of layer patterns (not imported here);
* :mod:`posenc.lab.beyond_axioms`: chapter 14's trained comparison on the counting task (not imported here);
* :mod:`posenc.lab.results`: the committed results of the make targets (``posenc/lab/data/``) and how they are read.

``import posenc`` does not import it; ``posenc.lab`` (or ``from posenc.lab import <module>``) does.
"""

from . import embeddings, experiments, geometry, interactive, language_model, results, tables, tasks  # noqa: F401
