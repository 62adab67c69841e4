"""The tools in scripts/ run: each on a small case (the `mlp` benchmark model needs no model package), and
every file in scripts/ has a test here. Also: the README's results table and docs/results.svg match
benchmarks/results.json, experiments/README.md lists every probe, and no file edits the import path."""
import importlib
import json
import logging
import os
import subprocess
import sys

import pytest

from benchmarks import results_chart

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOOLS = {"compile_time.py", "count_compiles.py", "debug_model_step.py", "gen_pipeline_doc.py", "gpu_check.sh",
         "opinfo_sweep.py", "profile_model.py"}
PYTHON_TOOLS = sorted(name[:-3] for name in TOOLS if name.endswith(".py"))


def test_every_tool_in_scripts_is_tested_here():
    files = {f for f in os.listdir(os.path.join(ROOT, "scripts")) if f not in ("__init__.py", "__pycache__")}
    assert files == TOOLS, f"scripts/ holds {sorted(files - TOOLS)} without a test, or lost {sorted(TOOLS - files)}"


@pytest.mark.parametrize("name", PYTHON_TOOLS)
def test_help(name, capsys):
    if name == "opinfo_sweep":
        pytest.importorskip("expecttest", reason="PyTorch's OpInfo database needs the expecttest package")
    tool = importlib.import_module(f"scripts.{name}")
    with pytest.raises(SystemExit) as e:
        tool.main(["--help"])
    assert e.value.code == 0
    assert "usage:" in capsys.readouterr().out


@pytest.mark.parametrize("view", ["kernels", "host", "gaps"])
def test_profile_model(view, device, capsys):
    from scripts import profile_model
    assert profile_model.main(["mlp", "train", "ember", "--small", "--device", device, "--view", view,
                               "--steps", "1", "--top", "3"]) == 0
    out = capsys.readouterr().out
    assert f"=== mlp train ember, {view}, 1 steps" in out
    want = {"kernels": "ms per step", "host": "wall ", "gaps": "GPU busy" if device == "cuda" else "no GPU events"}
    assert want[view] in out


def test_debug_model_step(device, capsys):
    from scripts import debug_model_step
    level = logging.getLogger("ember").level
    try:
        # 0: ran without an ember error, outputs and every gradient within 5% of eager's
        assert debug_model_step.main(["mlp", "--small", "--device", device, "--steps", "1"]) == 0
    finally:
        logging.getLogger("ember").setLevel(level)
    assert "0 of 6 gradients off" in capsys.readouterr().out


def test_debug_model_step_variants(device, capsys):
    from scripts import debug_model_step
    # 0: each variant's gradients are within 3x eager's own error against float64
    assert debug_model_step.main(["mlp", "--small", "--device", device, "--variants", "default,in_place_off"]) == 0
    out = capsys.readouterr().out
    assert "default" in out and "in_place_off" in out and "bad 0/6" in out


def test_compile_time(capsys):
    from scripts import compile_time
    assert compile_time.main(["--models", "mlp", "--modes", "infer", "--small", "--workers", "0"]) == 0
    row = capsys.readouterr().out.splitlines()[-1].split()
    assert row[:2] == ["mlp", "infer"] and float(row[2]) > 0


def test_count_compiles():
    # a process of its own: it needs the Triton backend from import on, and patches it to count
    env = dict(os.environ, EMBER_CPU_BACKEND="triton", TRITON_INTERPRET="1")
    p = subprocess.run([sys.executable, "-m", "scripts.count_compiles", "mlp", "--batch", "4"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    line = next(ln for ln in p.stdout.splitlines() if ln.startswith("mlp: kernels generated"))
    generated, defined = (int(line.split(key)[1].split(",")[0]) for key in ("generated ", "defined "))
    assert 0 < defined <= generated


def test_opinfo_sweep(capsys):
    pytest.importorskip("expecttest", reason="PyTorch's OpInfo database needs the expecttest package")
    from scripts import opinfo_sweep
    assert opinfo_sweep.main(["--ops", "abs", "--dtypes", "float32", "--limit-samples", "1"]) == 0
    assert "no unexpected results" in capsys.readouterr().out


def test_gpu_check(tmp_path):
    script = os.path.join(ROOT, "scripts", "gpu_check.sh")
    p = subprocess.run(["bash", script, "--help"], capture_output=True, text=True, timeout=30)
    assert p.returncode == 0 and "--two-gpus" in p.stdout and "GPU_CHECK_STEPS" in p.stdout
    # the set-up steps only: the versions step runs and the summary records it
    env = dict(os.environ, OUT=str(tmp_path), GPU_CHECK_STEPS="none", GPU_CHECK_NO_INSTALL="1")
    p = subprocess.run(["bash", script], env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert "torch" in (tmp_path / "versions.log").read_text()
    assert (tmp_path / "summary.txt").read_text().strip() == next(
        ln for ln in p.stdout.splitlines() if ln.startswith("=== versions: ok"))


def test_results_table_and_chart_match_results_json():
    results = results_chart.load()
    with open(os.path.join(ROOT, "README.md")) as f:
        readme = f.read()
    assert readme == results_chart.readme_with_table(readme, results), \
        "README's results table is stale: python -m benchmarks.results_chart"
    with open(os.path.join(ROOT, "docs", "results.svg")) as f:
        assert f.read() == results_chart.svg(results), "docs/results.svg is stale: python -m benchmarks.results_chart"
    # every one of the six models has both rows, measured or marked so
    table = results_chart.table(results)
    for name in results_chart.MODELS.values():
        assert table.count(f"| {name} |") == 2


def test_results_from_run(tmp_path):
    """An anchor_models.py run becomes results.json's content: speed-ups from its times, nothing invented."""
    run = [{"model": "bert_base", "mode": "infer", "backend": b, "ms": ms}
           for b, ms in (("eager", 9.0), ("inductor", 6.0), ("ember", 4.0))]
    run.append({"model": "gpt2", "mode": "train", "backend": "ember", "error": "timeout 240s"})
    path = tmp_path / "run.json"
    path.write_text(json.dumps(run))
    results = results_chart.from_run(str(path), {"date": "2026-01-01", "device": "GPU", "torch": "t",
                                                 "triton": "x", "command": "c"})
    assert results["cells"] == [{"model": "bert", "mode": "infer", "source": "run",
                                 "ms": {"eager": 9.0, "inductor": 6.0, "ember": 4.0}}]
    table = results_chart.table(results)
    assert "| BERT-base | inference | 4.00 | 2.25x | 1.50x | [1] |" in table
    assert "| GPT-2 | training | - | not measured | not measured |  |" in table


def test_experiments_are_listed_and_compile():
    folder = os.path.join(ROOT, "experiments")
    probes = sorted(f for f in os.listdir(folder) if f.endswith(".py") and f != "__init__.py")
    with open(os.path.join(folder, "README.md")) as f:
        listed = f.read()
    for name in probes:
        assert f"`{name}" in listed, f"experiments/README.md does not describe {name}"
        with open(os.path.join(folder, name)) as f:
            compile(f.read(), name, "exec")          # a syntax error fails here


def test_no_file_edits_the_import_path():
    needle = "sys." + "path"
    offenders = []
    for top in ("scripts", "benchmarks", "experiments", "tests", "docs"):
        for dirpath, _, files in os.walk(os.path.join(ROOT, top)):
            for f in files:
                if f.endswith((".py", ".sh", ".md")):
                    with open(os.path.join(dirpath, f)) as fh:
                        if needle in fh.read():
                            offenders.append(os.path.relpath(os.path.join(dirpath, f), ROOT))
    assert not offenders, f"{offenders} edit {needle}: run tools as `python -m scripts.NAME` from the root instead"


def test_host_sampler_counts_where_a_busy_thread_is():
    import time
    from benchmarks.host_sampler import HostSampler, layer_of

    def spin(seconds):
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            sum(range(100))

    with HostSampler(interval_s=0.001) as sampler:
        spin(0.3)
    summary = sampler.summary()
    assert summary["samples"] > 20, summary
    assert dict(summary["functions_inclusive"]).get("tests/test_tools.py:spin", 0) > 0.8, summary
    assert layer_of("/x/torch/_dynamo/eval_frame.py") == "dynamo"
    assert layer_of("/cache/ab/ember_wrapper_0123.py") == "ember" and layer_of("/w/ember/runtime/x.py") == "ember"
    assert layer_of("/tmp/torchinductor_u/ab/cab.py") == "inductor" and layer_of("/w/train.py") == "program"
