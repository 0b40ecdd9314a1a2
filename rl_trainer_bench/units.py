"""Byte counts and times as people read them, one spelling for every report of the package.

Memory and collective reports span bytes to hundreds of GiB; a fixed unit either hides the small
rows (0.000G) or drowns the large ones in digits, so the unit follows the size. Step times are
printed in milliseconds everywhere, in the precision the caller's table needs; a confidence level
in as many digits as it has (a sequential look's level is 99.64%, not 100%).
"""

from __future__ import annotations

_UNITS = (("TiB", 1024**4), ("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024))


def human_bytes(count: float | None) -> str:
    """`1.50 GiB`, `12.00 KiB`, `512 B`; negative counts keep their sign; None is `n/a`."""
    if count is None:
        return "n/a"
    sign, size = ("-" if count < 0 else ""), abs(count)
    for unit, scale in _UNITS:
        if size >= scale:
            return f"{sign}{size / scale:.2f} {unit}"
    return f"{sign}{int(size)} B"


def milliseconds(seconds: float, spec: str = ".2f") -> str:
    """`seconds` as a number of milliseconds in the format `spec` (`"+.2f"` signs it, `".3g"`
    keeps three significant digits); the unit itself is left to the caller's text."""
    return format(seconds * 1e3, spec)


def confidence_level(share: float) -> str:
    """`0.99` as `99%`, `0.99642` as `99.64%`: four significant digits, no trailing zeros."""
    return f"{100 * share:.4g}%"
