"""`ember report`: the page of a small training script (its kernel table, graphs and graph breaks, rendered in
headless Chromium), and the numbers behind it (bytes, FLOPs, profiled steps) on graphs small enough to count
by hand."""
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import zlib
from html.parser import HTMLParser

import pytest
import torch

import ember
from ember.report import recorder as report_recorder
from ember.report.recorder import ReportRecorder, brief_reason

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SCRIPT = """
import sys
import torch, ember

class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(32, 48)
        self.norm = torch.nn.LayerNorm(48)

    def forward(self, x):
        h = torch.relu(self.lin(x)) * 2
        print("between the graphs")             # a graph break: two graphs per step
        return self.norm(h).softmax(-1)

device = sys.argv[2]
torch.manual_seed(0)
net = Net().to(device)
compiled = torch.compile(net, backend="ember")
for step in range(6):
    x = torch.randn(16, 32, device=device)
    out = compiled(x)
    out.pow(2).sum().backward()
    grads = [p.grad.clone() for p in net.parameters()]
    net.zero_grad()
    eager = net(x)
    eager.pow(2).sum().backward()
    torch.testing.assert_close(out, eager)
    for g, p in zip(grads, net.parameters()):
        torch.testing.assert_close(g, p.grad)
    net.zero_grad()
open(sys.argv[1], "w").write("ran")
"""


class _Tables(HTMLParser):
    """Each table's rows (lists of cell texts) by the table's id."""

    def __init__(self):
        super().__init__()
        self.tables, self.current, self.row, self.cell = {}, None, None, None

    def handle_starttag(self, tag, attrs):
        if tag == "table":
            self.current = self.tables.setdefault(dict(attrs).get("id"), [])
        elif tag == "tr" and self.current is not None:
            self.row = []
        elif tag in ("td", "th") and self.row is not None:
            self.cell = []

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self.cell is not None:
            self.row.append(" ".join("".join(self.cell).split()))
            self.cell = None
        elif tag == "tr" and self.row is not None:
            self.current.append(self.row)
            self.row = None
        elif tag == "table":
            self.current = None

    def handle_data(self, data):
        if self.cell is not None:
            self.cell.append(data + " ")


@pytest.fixture(scope="module")
def report_page(tmp_path_factory):
    device = os.environ.get("EMBER_TEST_DEVICE", "cpu")
    folder = tmp_path_factory.mktemp("report")
    script, page, marker = folder / "train.py", folder / "out" / "report.html", folder / "ran.txt"
    script.write_text(SCRIPT)
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    run = subprocess.run([sys.executable, "-m", "ember.cli", "report", "-o", str(page), "--steps", "2",
                          "--warmup", "1", str(script), str(marker), device],
                         env=env, capture_output=True, text=True, timeout=600, cwd=str(folder))
    assert run.returncode == 0, run.stdout + run.stderr
    assert marker.read_text() == "ran"           # the script ran with its own arguments
    return page


def _seconds(text: str) -> float:
    value, unit = text.split()
    return float(value) * {"s": 1, "ms": 1e-3, "us": 1e-6}[unit]


def test_report_page_lists_kernels_with_measurements(report_page):
    text = report_page.read_text()
    assert "2 steps profiled" in text
    assert "<script" not in text and "http://" not in text.replace('xmlns="http://www.w3.org/2000/svg"', "")
    parser = _Tables()
    parser.feed(text)
    head, *rows = parser.tables["kernels"]
    col = {name: i for i, name in enumerate(head)}
    labels = [r[col["kernel / op"]] for r in rows]
    # a kernel is named by its place and the ops it computes (kernel0_relu)
    assert any(re.match(r"kernel0(_\w+)? g0 forward", l) for l in labels), labels
    # the Linear, an extern (a GPU's backend adds the bias in the next kernel: mm)
    assert any(l.startswith(("addmm.default g0 forward", "mm.default g0 forward")) for l in labels), labels
    assert any("backward" in l for l in labels), labels
    for r in rows:
        for name in ("time / step", "calls / step", "bytes / call", "GB/s"):
            cell = r[col[name]]
            assert cell != "-" and not cell.startswith("-") and re.match(r"^[0-9.e+]+", cell), (name, r)
        assert _seconds(r[col["time / step"]]) >= 0
        assert r[col["your source"]].startswith("train.py:"), r
    # the profiler attributed time to the calls (on a GPU: the kernels launched inside each call's range)
    assert sum(_seconds(r[col["time / step"]]) for r in rows) > 0
    graphs = parser.tables["graphs"][1:]
    assert sorted(g[1] for g in graphs) == ["backward", "backward", "forward", "forward"], graphs
    breaks = parser.tables["graph-breaks"][1:]
    assert len(breaks) == 1 and breaks[0][0].startswith("train.py:13"), breaks
    assert "print" in breaks[0][1], breaks


def _chromium():
    return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


def _chromium_run(binary, *args):
    return subprocess.run([binary, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", *args],
                          capture_output=True, text=True, timeout=120)


def _png_luminance(path) -> list:
    """Gray values (0-255) of an 8-bit RGB or RGBA PNG, decoded with zlib."""
    data = open(path, "rb").read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, width = 8, b"", None
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        chunk = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            width, height, depth, color = struct.unpack(">IIBB", chunk[:10])
            assert depth == 8 and color in (2, 6), (depth, color)
            bpp = 3 if color == 2 else 4
        elif kind == b"IDAT":
            idat += chunk
        pos += 12 + length
    raw, stride, prev, gray = zlib.decompress(idat), width * bpp, bytearray(width * bpp), []
    for y in range(height):
        kind, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b, c = prev[i], (prev[i - bpp] if i >= bpp else 0)
            if kind == 1:
                line[i] = (line[i] + a) & 255
            elif kind == 2:
                line[i] = (line[i] + b) & 255
            elif kind == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif kind == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        gray += [(line[i] + line[i + 1] + line[i + 2]) // 3 for i in range(0, stride, bpp)]
        prev = line
    return gray


def test_report_page_renders_in_chromium(report_page, tmp_path):
    binary = _chromium()
    if binary is None:
        pytest.skip("no chromium binary found (Debian: apt-get install chromium; .ci/run installs it)")
    shot = tmp_path / "page.png"
    run = _chromium_run(binary, "--window-size=800,600", f"--screenshot={shot}", report_page.as_uri())
    assert shot.exists(), run.stderr
    gray = _png_luminance(shot)
    mean = sum(gray) / len(gray)
    variance = sum((g - mean) ** 2 for g in gray) / len(gray)
    dark = sum(1 for g in gray if g < 128) / len(gray)
    assert variance > 100 and dark > 0.01, (variance, dark)      # text, cards and the chart, not a blank page
    dom = _chromium_run(binary, "--dump-dom", report_page.as_uri()).stdout
    assert 'id="kernels"' in dom and dom.count("<tr>") > 10, dom[:2000]


# -- the numbers, in process ---------------------------------------------------------------------------------

def test_a_multi_output_extern_is_reported(tmp_path):
    """The CPU's fused SDPA kernel returns several tensors (an extern whose parent buffer has no layout); 80
    queries per head stay with it (fewer would run as ember's kernels under the Triton backend)."""
    device = "cpu"
    q, k, v = (torch.randn(2, 4, 80, 8, device=device) for _ in range(3))
    fn = lambda q, k, v: torch.nn.functional.scaled_dot_product_attention(q, k, v).relu()  # noqa: E731
    with ember.config.patch(report=str(tmp_path / "report.html"), report_steps=2, report_warmup=1):
        f = torch.compile(fn, backend="ember")
        for _ in range(5):
            torch.testing.assert_close(f(q, k, v), fn(q, k, v), rtol=1e-4, atol=1e-5)
        report = report_recorder()
        report.finish()
    (graph,) = report.graphs
    attention = [c for c in graph.calls if "attention" in c.label]
    assert attention and all(c.device.startswith(torch.device(device).type) for c in graph.calls)
    assert (tmp_path / "report.html").exists()


def test_bytes_flops_and_profiled_steps(tmp_path, device):
    w = torch.randn(32, 16, device=device)
    with ember.config.patch(report=str(tmp_path / "report.html"), report_steps=2, report_warmup=1):
        f = torch.compile(lambda x, y, w: (torch.relu(x + y), x @ w), backend="ember")
        for _ in range(5):
            x, y = torch.randn(64, 32, device=device), torch.randn(64, 32, device=device)
            out = f(x, y, w)
            torch.testing.assert_close(out[0], torch.relu(x + y))
            torch.testing.assert_close(out[1], x @ w)
        report = report_recorder()
        report.finish()
    assert (tmp_path / "report.html").exists()
    (graph,) = report.graphs
    # the kernel table as data beside the page: both calls, with their bytes and a time per step
    table = json.loads((tmp_path / "report.json").read_text())
    by_kind = {k["kind"]: k for k in table["kernels"]}
    assert by_kind["kernel"]["bytes_per_call"] == 3 * 64 * 32 * 4 and by_kind["kernel"]["fx_nodes"] == ["add", "relu"]
    assert by_kind["extern"]["flops_per_call"] == 2 * 64 * 32 * 16
    assert all(k["seconds_per_step"] > 0 and k["calls_per_step"] == 1 for k in table["kernels"])
    assert table["rooflines"] and 0 < by_kind["kernel"]["memory_roofline_fraction"]
    calls = {c.kind: c for c in graph.calls}
    kernel, mm = calls["kernel"], calls["extern"]
    assert (kernel.bytes_read, kernel.bytes_written) == (2 * 64 * 32 * 4, 64 * 32 * 4)
    assert kernel.flops == 2 * 64 * 32                  # an add and a relu per element
    assert kernel.fx_nodes == ["add", "relu"]
    assert (mm.bytes_read, mm.bytes_written) == ((64 * 32 + 32 * 16) * 4, 64 * 16 * 4)
    assert mm.flops == 2 * 64 * 32 * 16 and mm.label == "mm.default"
    window = report.window
    assert window.steps == 2 and graph.times_called == 5
    for c in graph.calls:
        assert window.ranges[c.range].count == 2 and window.ranges[c.range].cpu_us > 0
        if device != "cpu":      # the GPU time of the kernels launched inside the call's range
            assert window.ranges[c.range].device_us > 0, c


def test_steps_restart_when_a_graph_compiles_among_them(tmp_path):
    s = ReportRecorder(str(tmp_path / "r.html"), steps=2, warmup=1)
    try:
        first = s.begin_graph("forward")
        run_first = s.observe(first, lambda args: args)
        run_first([])                     # warm-up
        run_first([])                     # profiling starts
        s.observe(s.begin_graph("forward"), lambda args: args)    # compiled now: the steps so far are dropped
        assert s.profiler is None and s.restarts == 1
        for _ in range(3):                # starts again, then two steps
            run_first([])
        assert s.window is not None and s.window.steps == 2
        assert s.window.ranges[first.range].count == 2
    finally:
        s.graph_breaks.uninstall()
        s.finished = True


def test_brief_graph_break_reason():
    text = ("Encountered graph break when attempting to trace CALL: a function call:\n\n"
            "Failed to trace builtin operator\n  Explanation: Dynamo does not know how to trace `print`\n"
            "  Hint: Avoid calling builtin `print`.\n")
    assert brief_reason(text) == "Failed to trace builtin operator: Dynamo does not know how to trace `print`"


def test_wrappers_open_no_ranges_without_a_report():
    f = torch.compile(lambda x: x.exp() + 1, backend="ember")
    x = torch.randn(8)
    from torch.profiler import profile
    with profile() as prof:
        torch.testing.assert_close(f(x), x.exp() + 1)
    assert not [e.name for e in prof.events() if e.name.startswith("ember g")]
