"""TORCH_TRACE + tlparse: ember's stages appear as artifacts of the compile that made them, next to Dynamo's
and AOTAutograd's; and nothing is built for a stage that no one reads."""
import glob
import os
import shutil
import subprocess
import sys
import sysconfig

import pytest
import torch

import ember
from ember.debug.dump import DebugDump

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

PROGRAM = """
import torch, ember
torch.manual_seed(0)
lin = torch.nn.Linear(16, 8)
f = torch.compile(lambda x: (torch.relu(lin(x)) * 2).sum(-1).exp(), backend="ember")
x = torch.randn(4, 16)
f(x).sum().backward()
eager = (torch.relu(lin(x)) * 2).sum(-1).exp()
torch.testing.assert_close(f(x), eager)
"""


def _tlparse():
    found = shutil.which("tlparse") or os.path.join(sysconfig.get_path("scripts"), "tlparse")
    return found if os.path.exists(found) else None


def test_tlparse_shows_ember_artifacts(tmp_path):
    tlparse = _tlparse()
    if tlparse is None:
        pytest.skip("the tlparse command is not installed (pip install tlparse; it is in the test extra)")
    trace = tmp_path / "trace"
    env = dict(os.environ, TORCH_TRACE=str(trace), PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    run = subprocess.run([sys.executable, "-c", PROGRAM], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    logs = glob.glob(str(trace / "*.log"))
    assert len(logs) == 1, logs
    out = tmp_path / "out"
    parsed = subprocess.run([tlparse, logs[0], "-o", str(out), "--overwrite", "--no-browser"],
                            capture_output=True, text=True, timeout=120)
    assert parsed.returncode == 0, parsed.stderr
    files = {os.path.relpath(p, out) for p in glob.glob(str(out / "*" / "*"))}
    # the forward and backward graphs of the one compiled frame, in its folder with AOTAutograd's graphs
    folder = next(os.path.dirname(f) for f in files if os.path.basename(f).startswith("aot_forward_graph"))
    mine = {os.path.basename(f).rsplit("_", 1)[0] for f in files if os.path.dirname(f) == folder}
    extension = ember.device.backend_for(torch.device("cpu")).file_extension
    for kind in ("forward", "backward"):
        for stage in ("fx_graph", "post_grad_graph", "ir_pre_fusion", "ir_post_fusion", "wrapper_py",
                      f"kernels_{extension}", "summary"):
            assert f"ember_{kind}_{stage}" in mine, sorted(mine)
    index = (out / "index.html").read_text()
    assert "ember_forward_ir_post_fusion" in index and "aot_forward_graph" in index
    kernels = glob.glob(str(out / folder / f"ember_forward_kernels_{extension}_*.txt"))
    assert "kernel0" in open(kernels[0]).read()
    post_fusion = glob.glob(str(out / folder / "ember_forward_ir_post_fusion_*.txt"))
    assert open(post_fusion[0]).read().startswith("group 0")


def _unread():
    raise AssertionError("a stage's text was built with nothing reading it")


@pytest.mark.skipif(bool(os.environ.get("TORCH_TRACE")), reason="a structured trace is being written")
def test_stages_cost_nothing_unread(monkeypatch):
    # no handler on torch's trace log: no trace is written (which handlers an earlier test in this process
    # left there, pytest's log capture among them, is not this test's business)
    monkeypatch.setattr(torch._logging._internal.trace_log, "handlers", [])
    with ember.config.patch(debug=False):
        DebugDump("forward").write("post_grad_graph.txt", _unread)     # no debug folder, no trace


def test_debug_folder_gets_each_stage_once(tmp_path):
    built = []

    def text():
        built.append(1)
        return "graph()\n"
    with ember.config.patch(debug=True, debug_dir=str(tmp_path)):
        dump = DebugDump("inference")
        dump.write("post_grad_graph.txt", text)
    assert open(os.path.join(dump.dir, "post_grad_graph.txt")).read() == "graph()\n"
    assert built == [1]
