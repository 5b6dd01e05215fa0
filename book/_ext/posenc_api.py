"""The API reference's short names (registered as a local extension in _config.yml).

Every name of ``posenc.__all__`` is documented once, in the module that defines it (``posenc.rope.rotate``). Once
every page has been read, this extension registers ``posenc.<name>`` as an alias of that entry, so that
``{py:func}`posenc.rotate``` resolves in the chapters and docstrings and ``objects.inv`` carries the name a user
writes. A name of ``__all__`` that no page documents is a build warning (an error under ``-W``).

Docstrings name a sibling by its short name (``:func:`rope_generator``` in ``posenc.group_encodings`` for
``posenc.generators.rope_generator``): a Python reference that Sphinx cannot resolve is looked up among the documented
``posenc`` objects by its last components, and linked when exactly one matches; otherwise it stays a warning.
"""

from __future__ import annotations

from sphinx.domains.python import ObjectEntry
from sphinx.util import logging

logger = logging.getLogger(__name__)


def register_short_names(app, env) -> None:
    import posenc

    domain = env.get_domain("py")
    for name in posenc.__all__:
        homes = [
            key
            for key, entry in domain.objects.items()
            if key.startswith("posenc.") and key.count(".") == 2 and key.endswith(f".{name}") and not entry.aliased
        ]
        value = getattr(posenc, name)
        homes = [
            key for key in homes if getattr(__import__(key.rsplit(".", 1)[0], fromlist=["_"]), name, None) is value
        ]
        if len(homes) != 1:
            logger.warning(
                f"posenc.{name} (in posenc.__all__) is documented {len(homes)} times in the API reference: {homes}",
                type="posenc",
                subtype="api",
            )
            continue
        entry = domain.objects[homes[0]]
        domain.objects[f"posenc.{name}"] = ObjectEntry(entry.docname, entry.node_id, entry.objtype, aliased=True)


def resolve_unique_suffix(app, env, node, contnode):
    if node.get("refdomain") != "py":
        return None
    target = node["reftarget"].lstrip(".~")
    domain = env.get_domain("py")
    matches = sorted(
        {
            key
            for key, entry in domain.objects.items()
            if key.startswith("posenc.") and key.endswith(f".{target}") and not entry.aliased
        }
    )
    if len(matches) != 1:
        return None
    return domain.resolve_xref(env, node["refdoc"], app.builder, node["reftype"], matches[0], node, contnode)


def setup(app):
    app.connect("env-updated", register_short_names)
    app.connect("missing-reference", resolve_unique_suffix)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
