"""`ember demo` on the CPU at its tiny size: the table, the check against eager, and the exit code."""
import torch

import ember
from ember import demo
from ember.cli import main


def _rows(text: str) -> dict:
    """backend name -> the rest of its table row"""
    names = ("eager", "inductor", "ember", "no_such_backend")
    return {ln.split()[0]: ln for ln in text.splitlines() if ln.split() and ln.split()[0] in names and "  " in ln}


def test_demo_compares_three_backends(capsys):
    # the on-disk caches keep inductor's per-machine vector-ISA probe between runs of the suite
    code = demo.run(device="cpu", size="tiny", steps=1, use_caches=True)
    out = capsys.readouterr().out
    rows = _rows(out)
    assert code == 0, out
    assert set(rows) == {"eager", "inductor", "ember"}, out
    assert rows["ember"].split()[-1] == "PASS", out
    assert rows["eager"].split()[-1] == "reference", out
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


def test_demo_training_step_and_a_failing_backend(capsys):
    # a backend that cannot run gets a "failed: <reason>" row; the demo goes on and ember's check decides
    code = demo.run(device="cpu", size="tiny", steps=1, train=True, use_caches=True,
                    backends=("eager", "no_such_backend", "ember"))
    out = capsys.readouterr().out
    rows = _rows(out)
    assert code == 0, out
    assert "failed:" in rows["no_such_backend"], out
    assert rows["ember"].split()[-1] == "PASS", out
    assert "training step" in out, out
