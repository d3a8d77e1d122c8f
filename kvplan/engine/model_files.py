"""Is a model directory complete? A cheap structural check before transformers reads it.

A truncated `model.safetensors` (a full disk, a killed copy, a cache entry of an older kvplan that wrote in
place) or a cut-off `tokenizer.json` otherwise reaches the user as a Rust or JSON traceback from deep inside
transformers. Reading each safetensors header (8 bytes of length, then JSON naming every tensor's byte range) and
parsing the small JSON files costs milliseconds even for smollm2's 540 MB, and catches every truncation: the
last tensor's end must be exactly the file's end.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

MAX_HEADER_BYTES = 100_000_000  # safetensors' own limit on the header
MAX_JSON_BYTES = 64_000_000  # the largest tokenizer.json files are tens of MB


def problem(folder: Path) -> str | None:
    """None when every weights file and JSON file in `folder` is whole, else what is wrong (one short line)."""
    weights = sorted(folder.glob("*.safetensors"))
    if not weights and not any(folder.glob("*.bin")):
        return "holds no weights (*.safetensors or *.bin)"
    for path in weights:
        why = _safetensors_problem(path)
        if why:
            return f"{path.name} {why}"
    for path in sorted(folder.glob("*.json")):
        try:
            if path.stat().st_size > MAX_JSON_BYTES:
                return f"{path.name} is larger than {MAX_JSON_BYTES} bytes"
            json.loads(path.read_bytes())
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            return f"{path.name} is not complete JSON ({type(exc).__name__} at byte {getattr(exc, 'pos', '?')})"
        except OSError as exc:
            return f"{path.name} cannot be read ({exc.strerror or exc})"
    return None


def _safetensors_problem(path: Path) -> str | None:
    try:
        size = path.stat().st_size
        with path.open("rb") as f:
            head = f.read(8)
            if len(head) < 8:
                return f"is truncated ({size} bytes, no header)"
            (length,) = struct.unpack("<Q", head)
            if length > min(MAX_HEADER_BYTES, size - 8):
                return f"is truncated or not safetensors (a {length}-byte header in a {size}-byte file)"
            header = json.loads(f.read(length))
    except (UnicodeDecodeError, json.JSONDecodeError):
        return "has a corrupt header (not JSON)"
    except OSError as exc:
        return f"cannot be read ({exc.strerror or exc})"
    if not isinstance(header, dict):
        return "has a corrupt header (not a JSON object)"
    ends = [0]
    for key, entry in header.items():
        offsets = entry.get("data_offsets") if isinstance(entry, dict) else None
        if key == "__metadata__":
            continue
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(type(o) is int for o in offsets)):
            return "has a corrupt header (a tensor without a byte range)"
        ends.append(offsets[1])
    expected = 8 + length + max(ends)
    if expected != size:
        return f"is truncated ({size} bytes; its header describes {expected})"
    return None
