"""What a cold compile leaves alive: Python objects the cyclic collector tracks, before and after a first
training step of a Hugging Face BERT (random weights) compiled with BACKEND, with a fresh cache, and how long
one full collection then takes. Any machine (CPU); needs transformers.

    python -m experiments.retained_objects_probe [--backend ember] [--layers 12] [--hidden 256] [--top N]

Everything a compiled graph keeps alive stays for as long as the compiled model does, and every full
collection of Python's collector walks it. `--top N` lists the N types whose count grew most.
"""
from __future__ import annotations

import argparse
import collections
import gc
import os
import tempfile
import time


def census() -> collections.Counter:
    gc.collect()
    return collections.Counter(f"{type(o).__module__}.{type(o).__qualname__}" for o in gc.get_objects())


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", default="ember")
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--top", type=int, default=0)
    a = p.parse_args(argv)
    root = tempfile.mkdtemp(prefix="retained_")
    os.environ.setdefault("EMBER_CACHE_DIR", os.path.join(root, "ember"))
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", os.path.join(root, "inductor"))
    import torch
    import ember  # noqa: F401  (registers the backend)
    from transformers import BertConfig, BertModel
    model = BertModel(BertConfig(num_hidden_layers=a.layers, hidden_size=a.hidden, num_attention_heads=4,
                                 intermediate_size=4 * a.hidden))
    x = torch.randint(0, 30000, (2, 64))
    compiled = torch.compile(model, backend=a.backend)
    before = census()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = compiled(x).last_hidden_state.float().pow(2).mean()
    loss.backward()
    del loss
    after = census()
    t = time.perf_counter()
    gc.collect()
    full = time.perf_counter() - t
    print(f"{a.backend}: {sum(before.values())} tracked objects before the first step, {sum(after.values())} after "
          f"({sum((after - before).values())} more); a full collection then took {full:.3f} s")
    for name, n in (after - before).most_common(a.top):
        print(f"  {n:7d}  {name}")


if __name__ == "__main__":
    main()
