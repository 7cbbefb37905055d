"""Tolerant comparison of values, JSON documents, CSV tables and free-text answers.

Pure functions, shared by the files and answer verifiers. Each returns
``(equal, why_not)`` so a failed check can say where the first difference is.
"""

from __future__ import annotations

import csv
import io
import json
import math
import re
import unicodedata
from typing import Any


def parse_number(text: str) -> float | None:
    """A number from an answer like ``"1,234.5"``, ``"$12"``, ``"42%"`` or ``"7 items"``; None if absent."""
    cleaned = text.strip().replace(",", "").replace("_", "")
    cleaned = re.sub(r"^[^\d+\-.]+", "", cleaned)  # currency signs and words before the number
    match = re.match(r"[+\-]?(\d+(\.\d*)?|\.\d+)([eE][+\-]?\d+)?", cleaned)
    if not match:
        return None
    try:
        return float(match.group(0))
    except ValueError:
        return None


def close(a: float, b: float, tolerance: float) -> bool:
    """Equal within ``tolerance`` absolute *or* relative (large values get relative slack)."""
    return math.isclose(a, b, rel_tol=tolerance, abs_tol=tolerance)


def normalize_text(text: str) -> str:
    """Case-folded, accents and punctuation dropped, whitespace collapsed."""
    text = unicodedata.normalize("NFKD", text)
    text = "".join(ch for ch in text if not unicodedata.combining(ch)).casefold()
    text = re.sub(r"[^\w\s.\-]", " ", text)
    return " ".join(text.split()).strip(" .")


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    return None


def json_equal(actual: Any, expected: Any, tolerance: float, path: str = "$") -> tuple[bool, str]:
    """Structural equality; numbers compared with tolerance, dict key order ignored, list order kept."""
    a_num, e_num = _number(actual), _number(expected)
    if a_num is not None and e_num is not None:
        return (True, "") if close(a_num, e_num, tolerance) else (False, f"{path}: {actual!r} != {expected!r}")
    if isinstance(expected, dict):
        if not isinstance(actual, dict):
            return False, f"{path}: expected an object, got {type(actual).__name__}"
        if set(actual) != set(expected):
            missing, extra = sorted(set(expected) - set(actual)), sorted(set(actual) - set(expected))
            return False, f"{path}: keys differ (missing {missing}, unexpected {extra})"
        for key in sorted(expected):
            ok, why = json_equal(actual[key], expected[key], tolerance, f"{path}.{key}")
            if not ok:
                return ok, why
        return True, ""
    if isinstance(expected, list):
        if not isinstance(actual, list):
            return False, f"{path}: expected a list, got {type(actual).__name__}"
        if len(actual) != len(expected):
            return False, f"{path}: length {len(actual)} != {len(expected)}"
        for i, (a, e) in enumerate(zip(actual, expected, strict=True)):
            ok, why = json_equal(a, e, tolerance, f"{path}[{i}]")
            if not ok:
                return ok, why
        return True, ""
    return (True, "") if actual == expected else (False, f"{path}: {actual!r} != {expected!r}")


def parse_csv(text: str) -> list[list[str]]:
    rows = list(csv.reader(io.StringIO(text)))
    return [[cell.strip() for cell in row] for row in rows if any(cell.strip() for cell in row)]


def csv_equal(actual: list[list[str]], expected: list[list[str]], tolerance: float) -> tuple[bool, str]:
    """Row-by-row equality; cells that both parse as numbers are compared with tolerance."""
    if len(actual) != len(expected):
        return False, f"{len(actual)} rows != {len(expected)} rows"
    for r, (arow, erow) in enumerate(zip(actual, expected, strict=True)):
        if len(arow) != len(erow):
            return False, f"row {r}: {len(arow)} cells != {len(erow)}"
        for c, (a, e) in enumerate(zip(arow, erow, strict=True)):
            if a == e:
                continue
            a_num, e_num = _strict_number(a), _strict_number(e)
            if a_num is None or e_num is None or not close(a_num, e_num, tolerance):
                return False, f"row {r} column {c}: {a!r} != {e!r}"
    return True, ""


def _strict_number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def load_json(text: str) -> tuple[Any, str]:
    try:
        return json.loads(text), ""
    except json.JSONDecodeError as exc:
        return None, f"not valid JSON: {exc}"


__all__ = ["close", "csv_equal", "json_equal", "load_json", "normalize_text", "parse_csv", "parse_number"]
