"""Build-once caches of the sandbox (the Prometheus TSDB, the MLflow store), keyed by scenario fingerprint."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

COMPLETE = "COMPLETE"


def build_once(final: Path, build: Callable[[Path], None], marker: str) -> Path:
    """``final``, built by ``build(tmp)`` on first use.

    Built in a temp dir beside it and renamed into place with its COMPLETE marker, so a crashed or
    concurrent build never leaves a half-built cache that looks usable.
    """
    final = Path(final)
    if (final / COMPLETE).exists():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=final.parent))
    try:
        build(tmp)
        (tmp / COMPLETE).write_text(marker + "\n")
        if final.exists():  # an unfinished leftover (no COMPLETE): replace it
            shutil.rmtree(final)
        try:
            tmp.rename(final)
        except OSError:
            if not (final / COMPLETE).exists():  # not a concurrent builder that got there first
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final
