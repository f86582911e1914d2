"""GLUE's official metrics in numpy: accuracy, F1, Matthews correlation, Pearson and Spearman correlation.

Written out rather than imported so the runtime needs neither scipy nor scikit-learn; the tests check them against
hand-computed values. A correlation with no value (fewer than 2 pairs, or one side constant) is NaN, as scipy gives,
never a number that could pass for a score.
"""
from __future__ import annotations

import numpy as np


def accuracy(predictions, labels) -> float:
    return float(np.mean(np.asarray(predictions) == np.asarray(labels)))


def f1(predictions, labels) -> float:
    """Binary F1 of the positive class (label 1), as GLUE scores MRPC and QQP."""
    predictions, labels = np.asarray(predictions), np.asarray(labels)
    true_positive = np.sum((predictions == 1) & (labels == 1))
    predicted, actual = np.sum(predictions == 1), np.sum(labels == 1)
    return float(2 * true_positive / (predicted + actual)) if predicted + actual else 0.0


def matthews_corrcoef(predictions, labels) -> float:
    """Binary MCC (CoLA); 0 when a row or column of the confusion matrix is empty, as scikit-learn does."""
    p, y = np.asarray(predictions) == 1, np.asarray(labels) == 1
    tp, tn = float(np.sum(p & y)), float(np.sum(~p & ~y))
    fp, fn = float(np.sum(p & ~y)), float(np.sum(~p & y))
    denominator = np.sqrt((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn))
    return float((tp * tn - fp * fn) / denominator) if denominator else 0.0


def pearson(x, y) -> float:
    """Pearson's r; NaN when undefined (fewer than 2 pairs, or x or y constant)."""
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    if len(x) < 2:
        return float("nan")
    x, y = x - x.mean(), y - y.mean()
    denominator = np.sqrt(np.sum(x * x) * np.sum(y * y))
    return float(np.sum(x * y) / denominator) if denominator else float("nan")


def average_ranks(x) -> np.ndarray:
    """Ranks 1..n with ties sharing their mean rank (what Spearman's rho needs)."""
    x = np.asarray(x, np.float64)
    order = np.argsort(x, kind="stable")
    sorted_x = x[order]
    group_starts = np.r_[True, sorted_x[1:] != sorted_x[:-1]]
    group = np.cumsum(group_starts) - 1
    first = np.flatnonzero(group_starts)
    last = np.r_[first[1:], len(x)] - 1
    ranks = np.empty(len(x))
    ranks[order] = (first[group] + last[group]) / 2 + 1
    return ranks


def spearman(x, y) -> float:
    return pearson(average_ranks(x), average_ranks(y))


METRICS = {"accuracy": accuracy, "f1": f1, "mcc": matthews_corrcoef, "pearson": pearson, "spearman": spearman}


def compute(names: tuple[str, ...], predictions, labels) -> dict[str, float]:
    """The named metrics of one task (see glue.TASKS), each as a fraction (GLUE reports them x100)."""
    return {name: METRICS[name](predictions, labels) for name in names}
