"""Dual ascent: the one update of every Lagrange multiplier a method keeps (LOPD's beta, USD's lambda)."""
from __future__ import annotations


def dual_ascent(multiplier: float, violation: float, lr: float) -> float:
    """multiplier <- max(0, multiplier + lr * violation): grows while its constraint is violated (violation > 0),
    shrinks back to 0 while it holds."""
    return max(0.0, multiplier + lr * violation)
