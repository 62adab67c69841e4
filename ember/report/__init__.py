"""`ember report script.py` (or EMBER_REPORT=out.html): where a program's compiled steps spend their time,
kernel by kernel, against the machine's rooflines, on one self-contained HTML page.

    recorder.py   the report of this process: graphs, the profiled steps, graph breaks, writing at exit
    collect.py   what each compiled graph holds: fusion groups, FX nodes and source lines, calls, bytes, FLOPs
    profile.py   profiler events -> each call's time per step, the step's time by kind, the kernel table
    roofline.py  memory bandwidth and FLOP/s measured on the machine
    page.py      the page's sections;  html.py: tables, bars and the SVG chart
"""
from .collect import GraphRecord, collect_graph
from .recorder import recorder

__all__ = ["GraphRecord", "collect_graph", "recorder"]
