"""The progress line of a long compile (runtime/progress.py): on a terminal only, never with quiet, cleared
when the compile ends; and the per-stage profile it reads its stage from."""
import io
import time

import torch
from torch.fx.experimental.proxy_tensor import make_fx

import ember
from ember.compile_graph import compile_graph
from ember.runtime import progress
from ember.runtime.progress import ProgressLine


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_shown_only_on_a_terminal_and_not_when_quiet():
    assert ProgressLine.wanted(Terminal())
    assert not ProgressLine.wanted(io.StringIO())
    with ember.config.patch(quiet=True):
        assert not ProgressLine.wanted(Terminal())


def test_the_line_names_graph_stage_and_kernels_and_is_cleared(monkeypatch):
    monkeypatch.setattr(progress, "SHOW_AFTER_S", 0.0)
    monkeypatch.setattr(progress, "REDRAW_S", 0.01)
    out = Terminal()
    stage = ["lowering"]
    line = ProgressLine("graph 7 (backward)", lambda: stage[0], out).start()
    line.kernels = (3, 12)
    time.sleep(0.1)
    stage[0] = "kernel compile/load"
    time.sleep(0.1)
    line.stop()
    text = out.getvalue()
    assert "ember: compiling graph 7 (backward), lowering" in text
    assert "kernel compile/load, kernels 3/12" in text
    assert text.endswith("\r\033[K")            # the line is gone once the compile ends


def test_a_short_compile_shows_nothing(monkeypatch):
    out = Terminal()
    monkeypatch.setattr("sys.stderr", out)
    x = torch.randn(8, 8)
    compiled = compile_graph(make_fx(lambda a: a.exp() + 1)(x), [x])
    torch.testing.assert_close(compiled([x]), (x.exp() + 1,))
    assert out.getvalue() == ""


def test_a_compile_on_a_terminal_shows_its_stages(monkeypatch):
    from ember.graph.passes import post_grad
    monkeypatch.setattr(progress, "SHOW_AFTER_S", 0.0)
    monkeypatch.setattr(progress, "REDRAW_S", 0.001)
    run = post_grad.run

    def slow_run(gm):          # a stage long enough for the line to be drawn while it runs
        time.sleep(0.3)
        return run(gm)

    monkeypatch.setattr(post_grad, "run", slow_run)
    out = Terminal()
    monkeypatch.setattr("sys.stderr", out)
    x = torch.randn(8, 8)
    compiled = compile_graph(make_fx(lambda a: a.exp().sum(0) + 1)(x), [x])
    torch.testing.assert_close(compiled([x]), (x.exp().sum(0) + 1,))
    text = out.getvalue()
    assert "ember: compiling graph" in text and "(forward), post-grad passes" in text and text.endswith("\r\033[K")
