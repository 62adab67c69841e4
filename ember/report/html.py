"""The pieces of a self-contained HTML page: its style sheet, tables, a stacked bar chart in inline SVG, a
percentage bar, and number formats. No scripts, fonts or images from elsewhere."""
from __future__ import annotations

import html
from typing import Optional

CSS = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: #1d2330; margin: 0;
       background: #f6f7f9; }
main { max-width: 1680px; margin: 0 auto; padding: 20px 28px 60px; }
h1 { font-size: 24px; margin: 8px 0 2px; }
h2 { font-size: 18px; margin: 30px 0 8px; border-bottom: 2px solid #dde1e8; padding-bottom: 4px; }
h3 { font-size: 15px; margin: 16px 0 6px; }
p.note, .note { color: #5a6376; font-size: 12.5px; }
.cards { display: flex; flex-wrap: wrap; gap: 12px; margin: 14px 0; }
.card { background: #fff; border: 1px solid #dde1e8; border-radius: 8px; padding: 10px 14px; min-width: 150px; }
.card .v { font-size: 20px; font-weight: 600; }
.card .k { color: #5a6376; font-size: 12px; }
table { border-collapse: collapse; background: #fff; border: 1px solid #dde1e8; font-size: 12.5px; width: 100%; }
th, td { padding: 4px 8px; border-bottom: 1px solid #eceef2; text-align: left; vertical-align: top; }
th { background: #eef1f6; position: sticky; top: 0; font-weight: 600; }
td div.note { font-size: 11.5px; }
td.n, th.n { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
tr:hover td { background: #f9fafc; }
code, .mono { font-family: ui-monospace, "SFMono-Regular", Menlo, Consolas, monospace; font-size: 12px; }
.src { color: #3b4a6b; min-width: 200px; max-width: 340px; overflow-wrap: anywhere; }
.nodes { min-width: 120px; max-width: 200px; overflow-wrap: anywhere; }
.why { min-width: 110px; max-width: 200px; }
.scroll { overflow-x: auto; }
.bar { position: relative; width: 64px; height: 14px; background: #eceef2; border-radius: 3px; display: inline-block;
       vertical-align: middle; }
.bar > span { position: absolute; left: 0; top: 0; bottom: 0; border-radius: 3px; }
.pct { display: inline-block; width: 40px; text-align: right; margin-left: 4px; }
details { background: #fff; border: 1px solid #dde1e8; border-radius: 6px; margin: 8px 0; padding: 4px 10px; }
summary { cursor: pointer; font-weight: 600; padding: 4px 0; }
.legend { display: flex; flex-wrap: wrap; gap: 6px 18px; margin: 6px 0; font-size: 12.5px; }
.swatch { display: inline-block; width: 12px; height: 12px; border-radius: 2px; margin-right: 5px;
          vertical-align: -1px; }
"""

# one color per kind of step time (collect.CATEGORIES order)
COLORS = ("#3e6fd8", "#8e5bd6", "#2aa876", "#e0a030", "#98a2b3", "#e06a5a")


def esc(text) -> str:
    return html.escape(str(text), quote=True)


def page(title: str, body: str) -> str:
    return (f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{esc(title)}</title>"
            f"<style>{CSS}</style></head>\n<body><main>\n{body}\n</main></body></html>\n")


def table(headers: list, rows: list, table_id: Optional[str] = None, numeric: frozenset = frozenset()) -> str:
    """`rows` of already-escaped cell HTML; columns whose index is in `numeric` align right."""
    attr = f' id="{table_id}"' if table_id else ""
    head = "".join(f'<th class="n">{esc(h)}</th>' if i in numeric else f"<th>{esc(h)}</th>"
                   for i, h in enumerate(headers))
    body = "\n".join("<tr>" + "".join(f'<td class="n">{c}</td>' if i in numeric else f"<td>{c}</td>"
                                      for i, c in enumerate(r)) + "</tr>" for r in rows)
    return f'<div class="scroll"><table{attr}><thead><tr>{head}</tr></thead><tbody>\n{body}\n</tbody></table></div>'


def percent_bar(fraction: Optional[float], color: str = "#3e6fd8") -> str:
    if fraction is None:
        return "-"
    width = max(0.0, min(fraction, 1.0)) * 100
    return (f'<span class="bar"><span style="width:{width:.1f}%;background:{color}"></span></span>'
            f'<span class="pct">{fraction * 100:.0f}%</span>')


def stacked_bar(parts: list, width: int = 1000, height: int = 34) -> str:
    """An SVG bar split into `parts` [(label, seconds, color)] in proportion, with a legend below it."""
    total = sum(s for _, s, _ in parts) or 1.0
    x, rects = 0.0, []
    for label, seconds, color in parts:
        w = width * seconds / total
        if w <= 0:
            continue
        rects.append(f'<rect x="{x:.2f}" y="0" width="{w:.2f}" height="{height}" fill="{color}">'
                     f"<title>{esc(label)}: {seconds_text(seconds)}</title></rect>")
        if w > 60:
            rects.append(f'<text x="{x + w / 2:.2f}" y="{height / 2 + 4:.1f}" text-anchor="middle" '
                         f'font-size="12" fill="#fff">{seconds / total * 100:.0f}%</text>')
        x += w
    svg = (f'<svg xmlns="http://www.w3.org/2000/svg" role="img" width="100%" viewBox="0 0 {width} {height}" '
           f'preserveAspectRatio="none" style="max-width:{width}px;height:{height}px;display:block">'
           + "".join(rects) + "</svg>")
    legend = "".join(f'<span><span class="swatch" style="background:{c}"></span>{esc(l)}: {seconds_text(s)} '
                     f"({s / total * 100:.1f}%)</span>" for l, s, c in parts)
    return svg + f'<div class="legend">{legend}</div>'


def seconds_text(s: Optional[float]) -> str:
    if s is None:
        return "-"
    if s >= 1:
        return f"{s:.2f} s"
    if s >= 1e-3:
        return f"{s * 1e3:.2f} ms"
    return f"{s * 1e6:.1f} us"


def count_text(n: Optional[float], unit: str = "") -> str:
    """1.23 G, 456 M ... (decimal prefixes)."""
    if n is None:
        return "-"
    for factor, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(n) >= factor:
            return f"{n / factor:.2f} {prefix}{unit}"
    return f"{n:.0f} {unit}".rstrip()


def bytes_text(n: Optional[int]) -> str:
    if n is None:
        return "-"
    for factor, prefix in ((1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
        if n >= factor:
            return f"{n / factor:.2f} {prefix}"
    return f"{n} B"


def rate_text(value: Optional[float], unit: str) -> str:
    if value is None:
        return "-"
    return f"{value:.3g} {unit}" if value < 100 else f"{value:.0f} {unit}"
