"""The weekly report as Markdown, for the Dagster UI (dg.MetadataValue.md): pipe tables, bold figures, the
charts as data: URIs. Strings from data get HTML entities and backslashes before Markdown punctuation, so
a name can neither break a table nor inject a link, an image or HTML."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from html import escape
from urllib.parse import quote

import pandas as pd

from foxhunt_obs.lib.report.model import Bullets, Heading, Image, Link, Para, Span, Stats, Table, data_uri

_MD_SPECIAL = re.compile(r"([\\`*_\[\]|#~!])")


def md_escape(text: str) -> str:
    """User text inside Markdown: one line, HTML entities for <>&, backslashes before Markdown punctuation
    (so a name can neither break a table with "|" nor inject a link, image or HTML)."""
    text = re.sub(r"\s+", " ", str(text))
    return escape(_MD_SPECIAL.sub(r"\\\1", text), quote=False)


_URL_UNSAFE = re.compile(r"[\s<>()\[\]`|\\\"]")


def md_link(text: str, url: str) -> str:
    """[text](url): the text escaped like any other, and every character that could end the URL early, or a
    table cell, percent-encoded (the configured templates are URLs; a value filled in is encoded already)."""
    return f"[{md_escape(text)}]({_URL_UNSAFE.sub(lambda m: quote(m.group(), safe=''), url)})"


def _md_span(s: Span) -> str:
    text = md_link(s.text, s.href) if s.href else md_escape(s.text)
    return f"**{text}**" if s.strong else text


def _md_spans(spans: Iterable[Span]) -> str:
    return "".join(_md_span(s) for s in spans)


def _md_cell(c: str | Link) -> str:
    return md_link(c.text, c.href) if isinstance(c, Link) else md_escape(c)


def _md_table(t: Table) -> str:
    rows = [tuple(_md_cell(c) for c in row) for row in t.rows]
    if t.total is not None:
        rows.append(tuple(f"**{md_escape(c)}**" if c else "" for c in t.total))
    frame = pd.DataFrame(rows, columns=[md_escape(c) for c in t.columns])
    align = ["right" if n else "left" for n in t.numeric]
    return frame.to_markdown(index=False, disable_numparse=True, colalign=align)


def to_markdown(blocks: Sequence, charts: dict[str, bytes]) -> str:
    """The blocks as one Markdown text; an Image's PNG comes from charts by name."""
    out: list[str] = []
    for b in blocks:
        if isinstance(b, Heading):
            out.append("#" * b.level + " " + md_escape(b.text))
        elif isinstance(b, Para):
            text = _md_spans(b.spans)
            out.append(f"_{text}_" if b.note else text)
        elif isinstance(b, Bullets):
            out.append("\n".join("- " + _md_spans(item) for item in b.items))
        elif isinstance(b, Stats):
            out.append(
                "\n".join(
                    f"- **{md_escape(f.label)}: {md_escape(f.value)}** ({md_escape(f.note)})" for f in b.items
                )
            )
        elif isinstance(b, Table):
            out.append(_md_table(b))
        elif isinstance(b, Image):
            out.append(f"![{md_escape(b.alt)}]({data_uri(charts[b.name])})")
    return "\n\n".join(out) + "\n"
