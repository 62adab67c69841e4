"""The report page: a summary, the step's time by kind, the kernel table against the rooflines, the
compiled graphs, Dynamo's graph breaks and each graph's fusion groups, written as one HTML file."""
from __future__ import annotations

import json
import linecache
import os
import re
import sys
import time

import torch

from . import html as h
from .collect import CATEGORIES, GEMM, MEMORY, OTHER_EXTERN
from .profile import kernel_rows, step_breakdown
from .roofline import Roofline, measure

MAX_LISTED = 6          # FX nodes and source lines shown per row before "+N more"


def write_page(recorder) -> None:
    graphs, window = recorder.graphs, recorder.window
    rows = kernel_rows(graphs, window)
    rooflines = _rooflines(rows) if window is not None else {}
    sections = [_header(recorder), _cards(recorder, rows), _chart(recorder), _kernel_table(rows, rooflines, window),
                _graph_table(recorder), _graph_breaks(recorder), _fusion_groups(recorder), _notes(rooflines)]
    text = h.page(f"ember report: {_program()}", "\n".join(sections))
    folder = os.path.dirname(os.path.abspath(recorder.path))
    os.makedirs(folder, exist_ok=True)
    with open(recorder.path, "w") as f:
        f.write(text)
    with open(os.path.splitext(recorder.path)[0] + ".json", "w") as f:
        json.dump(_table_data(rows, rooflines, window), f, indent=1)


def _table_data(rows: list, rooflines: dict, window) -> dict:
    """The kernel table as data (the page's `.json` beside it), for scripts that compare runs."""
    out = {"step_seconds": window.wall_s / window.steps if window is not None and window.steps else None,
           "rooflines": {d: {"copy_gbps": r.copy_gbps, "gemm_tflops": {str(k): v for k, v in r.gemm_tflops.items()},
                             "vector_tflops": r.vector_tflops} for d, r in rooflines.items()},
           "kernels": []}
    for r in rows:
        roof = rooflines.get(r.device)
        gbps, tflops = r.gbps(), r.tflops()
        out["kernels"].append({
            "graph": r.graph, "graph_kind": r.graph_kind, "label": r.label, "kind": r.kind, "category": r.category,
            "device": r.device, "calls_per_step": r.calls_per_step, "seconds_per_step": r.seconds_per_step,
            "bytes_per_call": r.bytes_moved, "flops_per_call": r.flops, "gbps": gbps, "tflops": tflops,
            "memory_roofline_fraction": gbps / roof.copy_gbps if gbps is not None and roof is not None else None,
            "fx_nodes": list(r.fx_nodes)})
    return out


def _program() -> str:
    return " ".join([os.path.basename(sys.argv[0] or "python")] + sys.argv[1:])


def _rooflines(rows) -> dict:
    """device -> Roofline, measured for each device a profiled call ran on."""
    out = {}
    for device in sorted({r.device for r in rows if r.seconds_per_step is not None}):
        dtypes = [r.dtype for r in rows if r.device == device and r.dtype is not None and r.dtype.is_floating_point]
        out[device] = measure(torch.device(device), dtypes)
    return out


def _header(recorder) -> str:
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(recorder.started))
    versions = f"torch {torch.__version__}"
    try:
        import triton
        versions += f", Triton {triton.__version__}"
    except ImportError:
        pass
    return (f"<h1>ember report</h1><p class=\"note\"><code>{h.esc(_program())}</code> · {when} · {h.esc(versions)}"
            f"</p><p>{h.esc(recorder.status())}.</p>")


def _card(value: str, key: str) -> str:
    return f'<div class="card"><div class="v">{value}</div><div class="k">{h.esc(key)}</div></div>'


def _cards(recorder, rows) -> str:
    graphs, window = recorder.graphs, recorder.window
    step = window.wall_s / window.steps if window is not None and window.steps else None
    cards = [_card(h.seconds_text(step), "time per step"),
             _card(str(len(graphs)), "graphs compiled by ember"),
             _card(str(sum(g.kernel_count for g in graphs)), "kernel calls in the compiled graphs"),
             _card(str(sum(g.extern_count for g in graphs)), "extern calls in the compiled graphs"),
             _card(h.seconds_text(sum(g.compile_seconds for g in graphs)), "compile time in ember"),
             _card(str(sum(n for _, _, n in recorder.graph_breaks.entries())), "Dynamo graph breaks")]
    if window is not None and window.peak_memory is not None:
        peak = max(recorder.peak_memory_before, window.peak_memory)
        cards.append(_card(h.bytes_text(window.peak_memory), "GPU memory peak in the profiled steps"))
        cards.append(_card(h.bytes_text(peak), "GPU memory peak of the run"))
    else:
        try:
            import resource
            rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024     # KiB on Linux
            cards.append(_card(h.bytes_text(rss), "peak resident memory of the process"))
        except (ImportError, OSError):
            pass
    return f'<div class="cards">{"".join(cards)}</div>'


def _chart(recorder) -> str:
    window = recorder.window
    if window is None:
        return ""
    parts = step_breakdown(recorder.graphs, window)
    gpu = window.peak_memory is not None
    what = ("GPU time of each kind; outside compiled graphs: GPU work the program launched itself; host gaps: the GPU "
            "idle, waiting for the host" if gpu else
            "time of each kind; host gaps: the compiled graphs' time outside their calls (the wrapper's Python); "
            "outside compiled graphs: the rest of the step (eager code, Python, Dynamo's guards)")
    return (f"<h2>Where a step's time goes</h2>{h.stacked_bar([(c, parts[c], h.COLORS[i]) for i, c in enumerate(CATEGORIES)])}"
            f"<p class=\"note\">{h.esc(what)}.</p>")


def short_source(line: str) -> str:
    """'File "/a/b/model.py", line 12, in forward :: y = x.exp()' -> 'model.py:12 forward: y = x.exp()'"""
    m = re.match(r'File "(.*)", line (\d+), in (\S+)(?: :: (.*))?', line)
    if m is None:
        return line
    path, lineno, fn, code = m.groups()
    return f"{os.path.basename(path)}:{lineno} {fn}" + (f": {code}" if code else "")


def _listed(items, fmt=lambda s: s, sep: str = ", ") -> str:
    shown = [h.esc(fmt(s)) for s in items[:MAX_LISTED]]
    more = f" (+{len(items) - MAX_LISTED} more)" if len(items) > MAX_LISTED else ""
    return sep.join(shown) + more


def _kernel_table(rows: list, rooflines: dict, window) -> str:
    step = window.wall_s / window.steps if window is not None and window.steps else None
    headers = ["kernel / op", "kind", "calls / step", "time / step", "% of step", "bytes / call", "FLOPs / call",
               "GB/s", "% of memory roofline", "TFLOP/s", "% of peak FLOP/s", "FX nodes", "your source"]
    short = {MEMORY: "memory-bound", OTHER_EXTERN: "other extern"}
    body = []
    for r in rows:
        roof: Roofline = rooflines.get(r.device)
        gbps, tflops = r.gbps(), r.tflops()
        mem = gbps / roof.copy_gbps if gbps is not None and roof is not None else None
        flop = tflops / roof.peak_tflops(r.dtype) if tflops is not None and roof is not None else None
        share = r.seconds_per_step / step if r.seconds_per_step is not None and step else None
        note = r.reason
        if r.kind == "kernel" and len(r.groups) > 1:
            note = f"one kernel for {len(r.groups)} fusion groups of the same structure"
        body.append([f'<code>{h.esc(r.label)}</code><div class="note">g{r.graph} {h.esc(r.graph_kind)}</div>',
                     f'<div class="why">{h.esc(short.get(r.category, r.category))}<div class="note">{h.esc(r.backend)}'
                     + (f": {h.esc(note)}" if note else "") + "</div></div>",
                     f"{r.calls_per_step:.3g}", h.seconds_text(r.seconds_per_step),
                     f"{share * 100:.1f}%" if share is not None else "-", h.bytes_text(r.bytes_moved),
                     h.count_text(r.flops) if r.flops else "-", h.rate_text(gbps, "GB/s"),
                     h.percent_bar(mem, "#2aa876"), h.rate_text(tflops, "TF/s"),
                     h.percent_bar(flop, "#3e6fd8" if r.category == GEMM else "#8e5bd6"),
                     f'<div class="mono nodes">{_listed(r.fx_nodes)}</div>',
                     f'<div class="src">{_listed(r.source_lines, short_source, "<br>")}</div>'])
    numeric = frozenset({2, 3, 4, 5, 6, 7, 9})
    return ("<h2>Kernels and extern calls, slowest first</h2>"
            + h.table(headers, body, "kernels", numeric)
            + "<p class=\"note\">bytes: the fewest bytes a call must move (each buffer it reads and writes, once); "
              "the memory roofline is the measured copy bandwidth of the device's memory (a call whose data stays in "
              "cache can pass it). FLOPs: matrix products, convolutions and attention by torch.utils.flop_counter's "
              "formulas, compared with a measured GEMM in their dtype; ember's kernels by their arithmetic ops times "
              "the elements they run over, compared with the float32 vector peak.</p>")


def _graph_time(g, window):
    r = window.ranges.get(g.range) if window is not None else None
    if r is None or not window.steps:
        return None
    gpu = "cuda" in g.device
    us = sum(window.ranges[c.range].device_us for c in g.calls if c.range in window.ranges) if gpu else r.cpu_us
    return us / 1e6 / window.steps


def _graph_table(recorder) -> str:
    graphs, window = recorder.graphs, recorder.window
    stages = list(dict.fromkeys(s for g in graphs for s in g.stage_seconds))
    headers = (["graph", "kind", "Dynamo compile id", "device", "FX nodes", "fusion groups", "kernels", "externs",
                "compile time"] + [f"{s} (compile)" for s in stages] + ["calls", "time / step"])
    body = []
    for g in graphs:
        body.append([f"g{g.id}", h.esc(g.kind), h.esc(g.compile_id or "-"), h.esc(g.device or "-"),
                     str(g.fx_node_count), str(len(g.groups)), str(g.kernel_count), str(g.extern_count),
                     h.seconds_text(g.compile_seconds)]
                    + [h.seconds_text(g.stage_seconds.get(s)) for s in stages]
                    + [str(g.times_called), h.seconds_text(_graph_time(g, window))])
    numeric = frozenset(range(4, len(headers)))
    return "<h2>Compiled graphs</h2>" + h.table(headers, body, "graphs", numeric)


def _graph_breaks(recorder) -> str:
    entries = recorder.graph_breaks.entries()
    if not entries:
        return "<h2>Dynamo graph breaks</h2><p>None: each compiled function is one graph.</p>"
    body = [[_break_location(w), h.esc(r), str(n)] for w, r, n in entries]
    return ("<h2>Dynamo graph breaks</h2>" + h.table(["where", "reason", "count"], body, "graph-breaks", frozenset({2}))
            + "<p class=\"note\">Each break splits a function into graphs compiled apart; the code between them "
              "runs eagerly (see the compiled graphs' Dynamo compile ids: frame/recompile).</p>")


def _break_location(where: str) -> str:
    """'model.py:12' and the line of code there."""
    if not where:
        return "-"
    path, _, line = where.rpartition(":")
    code = linecache.getline(path, int(line)).strip() if line.isdigit() else ""
    return (f"<code>{h.esc(os.path.basename(path))}:{h.esc(line)}</code>"
            + (f'<div class="src mono">{h.esc(code)}</div>' if code else ""))


def _fusion_groups(recorder) -> str:
    out = ["<h2>Fusion groups</h2><p class=\"note\">Each group is one kernel (or one extern call): the buffers it "
           "writes, the FX nodes it computes (those stored and those inlined into it) and the lines of your code "
           "they come from.</p>"]
    for g in recorder.graphs:
        body = [[str(gr.index), f"<code>{h.esc(gr.call)}</code>", f'<div class="mono nodes">{_listed(gr.buffers)}</div>',
                 f'<div class="mono nodes">{_listed(gr.fx_nodes)}</div>',
                 f'<div class="src">{_listed(gr.source_lines, short_source, "<br>")}</div>'] for gr in g.groups]
        out.append(f"<details><summary>g{g.id} {h.esc(g.kind)}: {len(g.groups)} groups</summary>"
                   + h.table(["group", "call", "buffers", "FX nodes", "your source"], body, f"groups-g{g.id}",
                             frozenset({0})) + "</details>")
    return "\n".join(out)


def _notes(rooflines: dict) -> str:
    if not rooflines:
        return ""
    items = []
    for device, r in rooflines.items():
        peaks = ", ".join(f"{str(d).replace('torch.', '')} {v:.3g} TFLOP/s" for d, v in r.gemm_tflops.items())
        items.append(f"<li><b>{h.esc(r.device)}</b>: memory {r.copy_gbps:.0f} GB/s; GEMM {h.esc(peaks)}; vector "
                     f"{r.vector_tflops:.3g} TFLOP/s <span class=\"note\">({h.esc(r.how)})</span></li>")
    return "<h2>Rooflines, measured on this machine</h2><ul>" + "".join(items) + "</ul>"

