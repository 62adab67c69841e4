"""`ember demo` on the CPU at its tiny size: the table, the check against eager, and the exit code."""
import pytest
import torch

import ember
from ember import demo
from ember.cli import main


def _rows(text: str) -> dict:
    """backend name -> its table row (the lines between the table's head and its tolerance note)"""
    lines = text.splitlines()
    head = next(i for i, ln in enumerate(lines) if ln.startswith("backend "))
    end = next(i for i, ln in enumerate(lines) if ln.startswith("(tolerance"))
    return {ln.split()[0]: ln for ln in lines[head + 1:end]}


def test_demo_compares_three_backends(capsys):
    # the on-disk caches keep inductor's per-machine vector-ISA probe between runs of the suite; a backend
    # that cannot run gets a "failed: <reason>" row, and the demo goes on
    code = demo.run(device="cpu", size="tiny", steps=1, use_caches=True,
                    backends=("eager", "inductor", "no_such_backend", "ember"))
    out = capsys.readouterr().out
    rows = _rows(out)
    assert code == 0, out
    assert set(rows) == {"eager", "inductor", "no_such_backend", "ember"}, out
    assert rows["ember"].split()[-1] == "PASS", out
    assert rows["eager"].split()[-1] == "reference", out
    assert "failed:" in rows["no_such_backend"], out
    assert "ember:" in out.splitlines()[-1] and "x eager" in out.splitlines()[-1], out


def test_demo_fails_when_ember_is_wrong(monkeypatch, capsys):
    real = ember.backend

    def off_by_one(gm, example_inputs):
        compiled = real(gm, example_inputs)

        def run(*args):
            return [o + 1 if isinstance(o, torch.Tensor) and o.is_floating_point() else o for o in compiled(*args)]
        return run
    monkeypatch.setattr(ember, "backend", off_by_one)
    code = main(["demo", "--device", "cpu", "--size", "tiny", "--steps", "1", "--backends", "eager,ember",
                 "--use-caches"])
    out = capsys.readouterr().out
    assert code == 1, out
    assert _rows(out)["ember"].split()[-1] == "FAIL", out
    assert "WRONG" in out.splitlines()[-1], out


@pytest.mark.skipif(demo.interpreted("cpu"),
                    reason="a training step takes seconds in the Triton interpreter; the demo's training code "
                           "is the same for every kernel backend")
def test_demo_training_step(capsys):
    code = demo.run(device="cpu", size="tiny", steps=1, train=True, use_caches=True, backends=("eager", "ember"))
    out = capsys.readouterr().out
    assert code == 0, out
    assert _rows(out)["ember"].split()[-1] == "PASS", out
    assert "training step" in out, out
