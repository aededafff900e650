"""Where fusec keeps what it builds: FUSEC_CACHE_DIR, or ~/.cache/fusec.

Subfolders: grammar (Lark's parse tables), templates (compiled Jinja2),
sim (host builds of modules), cuda (cubins and PTX)."""
from __future__ import annotations

import os
from pathlib import Path


def cache_dir(kind: str) -> Path:
    base = os.environ.get("FUSEC_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "fusec")
    return Path(base) / kind
