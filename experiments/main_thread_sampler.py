"""Where one thread's wall time goes, without cProfile's cost or its mixing of threads: a background thread
reads the main thread's stack every few milliseconds (`sys._current_frames`) and weighs each sample by the
time since the previous one. Collections of the garbage collector that run on the main thread are timed
apart through `gc.callbacks`.

    with MainThreadSampler() as sampler:
        first_call()
    sampler.summary(top=40)          # inclusive and own seconds per function, collections, imports
    sampler.write_folded(path)       # "frame;frame;frame seconds" lines, for a flame graph or a diff

    python -m experiments.main_thread_sampler A.folded B.folded [N]   # the N functions whose inclusive
                                                                      # seconds differ most between two runs
"""
from __future__ import annotations

import collections
import gc
import sys
import threading
import time


def _frame_name(code) -> str:
    filename = code.co_filename
    for marker in ("site-packages/", "dist-packages/", "/lib/python3"):
        if marker in filename:
            filename = filename.split(marker, 1)[1]
            break
    return f"{filename}:{code.co_name}:{code.co_firstlineno}"


class MainThreadSampler:
    def __init__(self, interval_s: float = 0.002, depth: int = 400):
        self.interval_s = interval_s
        self.depth = depth
        self.thread_id = threading.main_thread().ident
        self.stacks: collections.Counter = collections.Counter()     # tuple of names, outermost first -> seconds
        self.collections: list[tuple[int, float]] = []               # (generation, seconds)
        self._gc_start = None
        self._stop = threading.Event()
        self._worker = threading.Thread(target=self._run, name="main-thread-sampler", daemon=True)
        self.wall_s = 0.0

    def _gc_callback(self, phase, info):
        if threading.get_ident() != self.thread_id:
            return
        if phase == "start":
            self._gc_start = time.perf_counter()
        elif self._gc_start is not None:
            self.collections.append((info.get("generation", -1), time.perf_counter() - self._gc_start))
            self._gc_start = None

    def _run(self):
        last = time.perf_counter()
        while not self._stop.wait(self.interval_s):
            frame = sys._current_frames().get(self.thread_id)
            now = time.perf_counter()
            names = []
            while frame is not None and len(names) < self.depth:
                names.append(_frame_name(frame.f_code))
                frame = frame.f_back
            self.stacks[tuple(reversed(names))] += now - last
            last = now

    def __enter__(self):
        gc.callbacks.append(self._gc_callback)
        self._t0 = time.perf_counter()
        self._worker.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._worker.join()
        self.wall_s = time.perf_counter() - self._t0
        gc.callbacks.remove(self._gc_callback)
        return False

    def inclusive(self) -> dict[str, float]:
        return inclusive_seconds(self.stacks)

    def summary(self, top: int = 40) -> dict:
        own = collections.Counter()
        for stack, seconds in self.stacks.items():
            if stack:
                own[stack[-1]] += seconds
        importing = sum(s for stack, s in self.stacks.items() if any("_find_and_load" in n for n in stack))
        return {"wall_s": round(self.wall_s, 3), "sampled_s": round(sum(self.stacks.values()), 3),
                "importing_s": round(importing, 3),
                "collections": {f"gen{g}": [sum(1 for gg, _ in self.collections if gg == g),
                                            round(sum(s for gg, s in self.collections if gg == g), 3)]
                                for g in sorted({g for g, _ in self.collections})},
                "inclusive": [(n, round(s, 3)) for n, s in collections.Counter(self.inclusive()).most_common(top)],
                "own": [(n, round(s, 3)) for n, s in own.most_common(top)]}

    def write_folded(self, path: str) -> None:
        with open(path, "w") as f:
            for stack, seconds in self.stacks.most_common():
                f.write(f"{';'.join(stack)} {seconds:.6f}\n")


def inclusive_seconds(stacks) -> dict[str, float]:
    total = collections.Counter()
    for stack, seconds in stacks.items():
        for name in set(stack):          # a recursive function counts once per sample
            total[name] += seconds
    return dict(total)


def read_folded(path: str) -> collections.Counter:
    stacks = collections.Counter()
    with open(path) as f:
        for line in f:
            frames, _, seconds = line.rstrip("\n").rpartition(" ")
            stacks[tuple(frames.split(";"))] += float(seconds)
    return stacks


def diff(a_path: str, b_path: str, n: int = 40) -> None:
    a, b = inclusive_seconds(read_folded(a_path)), inclusive_seconds(read_folded(b_path))
    names = sorted(set(a) | set(b), key=lambda k: -abs(a.get(k, 0) - b.get(k, 0)))
    print(f"{'A s':>8} {'B s':>8} {'B-A':>8}  function")
    for name in names[:n]:
        print(f"{a.get(name, 0):8.3f} {b.get(name, 0):8.3f} {b.get(name, 0) - a.get(name, 0):+8.3f}  {name}")


if __name__ == "__main__":
    diff(sys.argv[1], sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 40)
