"""The weekly report as one self-contained HTML page. It needs nothing from the network and runs no script
(its Content Security Policy forbids both): the CSS is inline, the charts are data: URIs, and every string
from data is escaped, so the page is safe to open wherever it is sent. Its only links (the run's trace, a
pod's logs, when their templates are set) open when clicked."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from html import escape

from foxhunt_obs.lib.report.model import Bullets, Heading, Image, Link, Para, Span, Stats, Table, data_uri

CSS = """
:root { color-scheme: light; }
* { box-sizing: border-box; }
body { margin: 0; background: #f4f5f7; color: #1d2330;
  font: 15px/1.5 -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, "Liberation Sans", sans-serif; }
main { max-width: 1100px; margin: 0 auto; padding: 24px 32px 48px; background: #fff; }
h1 { font-size: 26px; margin: 0 0 4px; }
h2 { font-size: 19px; margin: 32px 0 8px; padding-bottom: 4px; border-bottom: 1px solid #dde1e7; }
p { margin: 8px 0; overflow-wrap: anywhere; }
p.note { color: #5b6473; font-size: 14px; }
ul { padding-left: 22px; }
li { margin: 4px 0; overflow-wrap: anywhere; }
.figures { display: grid; grid-template-columns: repeat(auto-fit, minmax(220px, 1fr)); gap: 12px; margin: 12px 0; }
.figure { border: 1px solid #dde1e7; border-radius: 6px; padding: 10px 14px; min-width: 0; }
.figure .label { font-size: 13px; color: #5b6473; }
.figure .value { font-size: 22px; font-weight: 600; font-variant-numeric: tabular-nums; }
.figure .note { font-size: 13px; color: #5b6473; overflow-wrap: anywhere; }
.table-wrap { max-width: 100%; overflow-x: auto; margin: 8px 0 16px; }
table { width: 100%; border-collapse: collapse; font-size: 13px; }
th, td { padding: 5px 8px; border-bottom: 1px solid #e6e9ee; vertical-align: top; text-align: left;
  overflow-wrap: anywhere; }
th { background: #f0f2f5; font-weight: 600; overflow-wrap: normal; }
th:first-child, td:first-child { min-width: 10em; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; overflow-wrap: normal; }
td.num { white-space: nowrap; }
tfoot td { font-weight: 600; border-top: 2px solid #c9ced6; border-bottom: none; }
figure.chart { margin: 12px 0 20px; }
figure.chart img { display: block; max-width: 100%; height: auto; }
figure.chart figcaption { font-size: 13px; color: #5b6473; }
@media print {
  body { background: #fff; font-size: 11pt; }
  main { max-width: none; padding: 0; }
  h2 { break-after: avoid; }
  table, figure.chart, .figure { break-inside: avoid; }
  .table-wrap { overflow: visible; }
  td.num { white-space: normal; }
}
"""

# No network, no script, no plugins: the page is data. Images come only from data: URIs.
CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'; base-uri 'none'; form-action 'none'"


def _h(text: str) -> str:
    return escape(str(text), quote=True)


def _a(text: str, href: str) -> str:
    return f'<a href="{_h(href)}">{_h(text)}</a>' if href else _h(text)


def _html_spans(spans: Iterable[Span]) -> str:
    return "".join(
        f"<strong>{_a(s.text, s.href)}</strong>" if s.strong else _a(s.text, s.href) for s in spans
    )


def _cell(c: str | Link) -> str:
    return _a(c.text, c.href) if isinstance(c, Link) else _h(c)


def _html_table(t: Table) -> str:
    def cells(row: Sequence[str], tag: str) -> str:
        return "".join(
            f'<{tag} class="num">{_cell(c)}</{tag}>' if num else f"<{tag}>{_cell(c)}</{tag}>"
            for c, num in zip(row, t.numeric)
        )

    head = f"<thead><tr>{cells(t.columns, 'th')}</tr></thead>"
    body = "".join(f"<tr>{cells(row, 'td')}</tr>" for row in t.rows)
    foot = f"<tfoot><tr>{cells(t.total, 'td')}</tr></tfoot>" if t.total is not None else ""
    return f'<div class="table-wrap"><table>{head}<tbody>{body}</tbody>{foot}</table></div>'


def to_html(title: str, blocks: Sequence, charts: dict[str, bytes]) -> str:
    """The blocks as a whole page titled `title`; an Image's PNG comes from charts by name."""
    parts: list[str] = []
    for b in blocks:
        if isinstance(b, Heading):
            parts.append(f"<h{b.level}>{_h(b.text)}</h{b.level}>")
        elif isinstance(b, Para):
            cls = ' class="note"' if b.note else ""
            parts.append(f"<p{cls}>{_html_spans(b.spans)}</p>")
        elif isinstance(b, Bullets):
            parts.append("<ul>" + "".join(f"<li>{_html_spans(i)}</li>" for i in b.items) + "</ul>")
        elif isinstance(b, Stats):
            parts.append(
                '<div class="figures">'
                + "".join(
                    f'<div class="figure"><div class="label">{_h(f.label)}</div>'
                    f'<div class="value">{_h(f.value)}</div><div class="note">{_h(f.note)}</div></div>'
                    for f in b.items
                )
                + "</div>"
            )
        elif isinstance(b, Table):
            parts.append(_html_table(b))
        elif isinstance(b, Image):
            parts.append(
                f'<figure class="chart"><img src="{data_uri(charts[b.name])}" alt="{_h(b.alt)}" '
                f'width="900" height="400"><figcaption>{_h(b.alt)}</figcaption></figure>'
            )
    body = "\n".join(parts)
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"<title>{_h(title)}</title>\n<style>{CSS}</style>\n</head>\n"
        f"<body>\n<main>\n{body}\n</main>\n</body>\n</html>\n"
    )
