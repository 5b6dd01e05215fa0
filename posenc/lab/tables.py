"""Tables of results, as Markdown (for terminals and Markdown cells) or HTML (for notebook outputs)."""

from __future__ import annotations

from html import escape


def format_table(header: list, rows: list, html: bool = False) -> str:
    """A table as Markdown (pipes, for terminals and Markdown cells) or as HTML (for notebook outputs, which the
    book renders as CommonMark, without pipe tables). Cells are converted with ``str``; numbers align right."""
    if not html:
        rule = "|" + "".join("---:|" if _numeric(cell) else "---|" for cell in (rows[0] if rows else header))
        return "\n".join(
            ["| " + " | ".join(map(str, header)) + " |", rule]
            + ["| " + " | ".join(map(str, row)) + " |" for row in rows]
        )

    def cell(tag, value):
        align = ' style="text-align:right"' if tag == "td" and _numeric(value) else ""
        return f"<{tag}{align}>{escape(str(value))}</{tag}>"

    head = "<tr>" + "".join(cell("th", value) for value in header) + "</tr>"
    body = "".join("<tr>" + "".join(cell("td", value) for value in row) + "</tr>" for row in rows)
    return f"<table><thead>{head}</thead><tbody>{body}</tbody></table>"


def _numeric(value) -> bool:
    return str(value).strip()[:1].isdigit()


__all__ = ["format_table"]
