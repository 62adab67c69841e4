"""ember's on-disk cache directory: where it is, that it is private, how big it is, and eviction.

One root holds everything ember keeps between processes:

    graphs/ab/<key>        compiled graphs (runtime/graph_cache.py)
    whole/ab/<key>         AOTAutograd's entries of whole Dynamo graphs (runtime/whole_graph_cache.py)
    cpp/ab/ember_cpp_*     C++ kernel sources and shared libraries (codegen/cpp/build.py)
    cpp/flags_*, prelude_* the C++ toolchain's probed flags and precompiled prelude
    autotune/*.json        autotuning choices (runtime/autotune.py)
    ab/ember_*.py          generated Python modules: wrappers and Triton kernels (runtime/loader.py)

The root is `EMBER_CACHE_DIR`, else `$XDG_CACHE_HOME/ember`, else `~/.cache/ember`. ember creates it
readable and writable by its owner alone (0700): the cache holds code ember runs, so a root that other
users can write to is not used for compiled graphs (`is_private`). A file's last use is the later of its
access and modification times; a reused file has its access time set (`mark_used`), so eviction, which
removes the least recently used files until the cache fits `ember.config.cache_max_gb`, keeps what is in use.
"""
from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import shutil
import stat
import tempfile
import time

log = logging.getLogger("ember")
GRAPHS = "graphs"
WHOLE = "whole"           # AOTAutograd's entries of whole Dynamo graphs (runtime/whole_graph_cache.py)
STALE_TMP_S = 3600        # a temporary file this old was left by a process that died while writing it
# folders whose files eviction may remove: each file is one cached artifact, found again by its name
_EVICTABLE_FOLDERS = (GRAPHS, WHOLE, "autotune")


def default_root() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "ember")


def cache_root() -> str:
    """The cache directory, created private (0700) if it does not exist."""
    root = os.environ.get("EMBER_CACHE_DIR")
    if root:
        return _make(root)
    try:
        return _make(default_root())
    except OSError:                    # no writable home: a folder of this user's in the temporary directory
        return _make(os.path.join(tempfile.gettempdir(), f"ember_cache_{os.getuid()}"))


def _make(root: str) -> str:
    if not os.path.isdir(root):
        os.makedirs(os.path.dirname(os.path.abspath(root)), exist_ok=True)
        try:
            os.mkdir(root, 0o700)
        except FileExistsError:        # another process made it first
            pass
    return root


def is_private(root: str) -> bool:
    """Owned by this user and writable by no one else (only then are its compiled graphs trusted)."""
    try:
        st = os.stat(root)
    except OSError:
        return False
    return st.st_uid == os.getuid() and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


def subfolder(*parts: str) -> str:
    """A folder under the cache root, created if missing."""
    d = os.path.join(cache_root(), *parts)
    os.makedirs(d, exist_ok=True)
    return d


def write_atomically(path: str, data: bytes) -> None:
    """Write `data` to `path` so that a reader sees the old file, the new file, or none: never a part."""
    tmp = f"{path}.{os.getpid()}.{os.urandom(4).hex()}.tmp"
    try:
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


_CHECKED = b"ember-checked-1\n"


def write_checked(path: str, payload: bytes) -> None:
    """Write `payload` atomically behind a header and its checksum, for `read_checked`."""
    write_atomically(path, _CHECKED + hashlib.sha256(payload).digest() + payload)


def read_checked(path: str) -> bytes | None:
    """The payload `write_checked` wrote, or None when the file is missing, truncated, corrupted or not
    one of these files."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return None
    head = len(_CHECKED) + 32
    if len(data) < head or not data.startswith(_CHECKED):
        return None
    payload = data[head:]
    return payload if hashlib.sha256(payload).digest() == data[len(_CHECKED):head] else None


def read_entry(path: str) -> bytes | None:
    """A cached entry's payload (`read_checked`), used now (`mark_used`); None when the file is missing, or
    truncated or corrupted (said in a debug log: the caller compiles instead)."""
    payload = read_checked(path)
    if payload is None:
        if os.path.exists(path):
            log.debug("ember cache: %s is truncated or corrupted; ignored, the graph compiles", path)
        return None
    mark_used(path)
    return payload


def write_entry(path: str, payload: bytes, max_gb: float | None) -> None:
    """Store a cached entry (`write_checked`), then evict least recently used files while the cache is larger
    than `max_gb` (None or 0: no limit)."""
    write_checked(path, payload)
    if max_gb is not None and max_gb > 0:
        evict_after_write(cache_root(), max_gb * (1 << 30), path, len(payload))


def _digest(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def record_digest(path: str) -> None:
    """Note the checksum of a file another program wrote (a shared library, a precompiled header) next to
    it, for `verified`."""
    write_atomically(path + ".sha256", _digest(path).encode())


def verified(path: str) -> bool:
    """The file exists and its checksum is the one recorded when it was written (a truncated or corrupted
    file, or one whose checksum is missing, is not used: the caller builds it again)."""
    try:
        with open(path + ".sha256", "rb") as f:
            return f.read().decode("ascii", "replace") == _digest(path)
    except OSError:
        return False


def mark_used(path: str) -> None:
    """Record a use of a cached file (its access time; the modification time stays its build time)."""
    try:
        os.utime(path, (time.time(), os.stat(path).st_mtime))
    except OSError:
        pass


@dataclasses.dataclass
class CachedFile:
    path: str
    size: int
    last_use: float
    evictable: bool


def _is_hex_folder(name: str) -> bool:
    return len(name) == 2 and all(c in "0123456789abcdef" for c in name)


def files(root: str) -> list[CachedFile]:
    """Every file under the root, each marked with whether eviction may remove it."""
    out = []
    stale = time.time() - STALE_TMP_S
    for dirpath, _, names in os.walk(root):
        rel = os.path.relpath(dirpath, root).split(os.sep)
        # graphs/ab, autotune, cpp/ab (C++ libraries), ab and ab/__pycache__ (generated Python modules)
        evictable = rel[0] in _EVICTABLE_FOLDERS or _is_hex_folder(rel[0]) \
            or (rel[0] == "cpp" and len(rel) == 2 and _is_hex_folder(rel[1]))
        for n in names:
            p = os.path.join(dirpath, n)
            try:
                st = os.stat(p)
            except OSError:            # removed meanwhile (another process evicting, a rename)
                continue
            being_written = n.endswith(".tmp") and st.st_mtime > stale
            out.append(CachedFile(p, st.st_size, max(st.st_atime, st.st_mtime), evictable and not being_written))
    return out


def evict(root: str, max_bytes: float, keep: str | None = None) -> tuple[int, int]:
    """Remove the least recently used evictable files until the cache holds at most `max_bytes` (or nothing
    evictable is left). `keep` (a file just written) stays. Returns (bytes removed, bytes left)."""
    found = files(root)
    total = sum(f.size for f in found)
    removed = 0
    for f in sorted((f for f in found if f.evictable and f.path != keep), key=lambda f: f.last_use):
        if total - removed <= max_bytes:
            break
        try:
            os.remove(f.path)
            removed += f.size
        except FileNotFoundError:       # another process evicted it first
            pass
    return removed, total - removed


RESCAN_S = 600.0
_sizes: dict = {}         # root -> [bytes at its last scan plus what this process wrote since, time of the scan]


def evict_after_write(root: str, max_bytes: float, path: str, written: int) -> None:
    """`evict`, after writing `written` bytes to `path`, but without walking the whole cache while the
    size known from its last scan (at most RESCAN_S ago), plus what this process wrote since, fits."""
    known = _sizes.get(root)
    if known is not None and known[0] + written <= max_bytes and time.time() - known[1] < RESCAN_S:
        known[0] += written
        return
    _sizes[root] = [evict(root, max_bytes, keep=path)[1], time.time()]


def usage(root: str) -> dict:
    """Top-level folder -> (files, bytes)."""
    out: dict = {}
    for f in files(root):
        rel = os.path.relpath(f.path, root).split(os.sep)
        top = rel[0] if len(rel) > 1 and not _is_hex_folder(rel[0]) else "modules"
        n, b = out.get(top, (0, 0))
        out[top] = (n + 1, b + f.size)
    return out


def clear(root: str) -> int:
    """Remove everything under the root (the root stays). Returns the bytes removed."""
    _sizes.pop(root, None)
    removed = sum(f.size for f in files(root))
    for name in os.listdir(root):
        p = os.path.join(root, name)
        if os.path.isdir(p) and not os.path.islink(p):
            shutil.rmtree(p, ignore_errors=True)
        else:
            try:
                os.remove(p)
            except FileNotFoundError:
                pass
    return removed
