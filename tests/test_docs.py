"""docs/pipeline.md is generated from a real run of ember: the generator must still run, and the doc must
name every module it describes (so a renamed module means: regenerate the doc)."""
import importlib.util
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _generator():
    path = os.path.join(ROOT, "scripts", "gen_pipeline_doc.py")
    spec = importlib.util.spec_from_file_location("gen_pipeline_doc", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod        # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


def test_documented_modules_exist_and_committed_doc_names_them():
    gen = _generator()
    with open(os.path.join(ROOT, "docs", "pipeline.md")) as f:
        doc = f.read()
    for m in gen.MODULES:
        assert os.path.exists(os.path.join(ROOT, m)), f"{m} is described by docs/pipeline.md but does not exist"
        assert m in doc, f"docs/pipeline.md does not mention {m}: run python scripts/gen_pipeline_doc.py"


def test_generator_runs(tmp_path, device):
    gen = _generator()
    out = tmp_path / "pipeline.md"
    assert gen.main(["--out", str(out), "--device", device]) == 0
    text = out.read_text()
    for m in gen.MODULES:
        assert m in text, m
    # every captured stage made it into the doc
    for marker in ("class GraphModule", "torch.ops.aten.var_mean", "reduction(welford", "group 0 (kernel",
                   "@triton.jit", "CallKernel(", "def call(args):", "## The same example with gradients"):
        assert marker in text, marker
    assert "max |ember - eager|" in text
