"""Accuracy, loss, per-class precision and recall from one evaluation pass; and their text form."""

import numpy as np


def report(counts: np.ndarray, loss_sum: float, labels: list[str]) -> dict:
    """The evaluation report of `counts[true, predicted]` and the summed cross-entropy of its examples.

    A class no example was predicted as has precision None; one with no
    example in the split has recall None (0/0 is not a score).
    """
    counts = np.asarray(counts, dtype=np.int64)
    total = int(counts.sum())
    correct = np.diag(counts)
    predicted = counts.sum(axis=0)
    actual = counts.sum(axis=1)
    per_class = {
        label: {
            "precision": float(correct[i] / predicted[i]) if predicted[i] else None,
            "recall": float(correct[i] / actual[i]) if actual[i] else None,
            "num_examples": int(actual[i]),
        }
        for i, label in enumerate(labels)
    }
    return {
        "num_examples": total,
        "accuracy": float(correct.sum() / total) if total else None,
        "loss": float(loss_sum / total) if total else None,
        "per_class": per_class,
        "labels": list(labels),
        "confusion_matrix": counts.tolist(),
    }


def _score(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"


def format_report(result: dict) -> str:
    """The report as text: a summary line, a per-class table, the confusion matrix."""
    labels = result["labels"]
    width = max(len("class"), *(len(label) for label in labels))
    lines = [
        f"{result['num_examples']} images of split {result['split']!r}: accuracy {_score(result['accuracy'])}, "
        f"loss {_score(result['loss'])}",
        "",
        f"{'class':<{width}}  precision  recall  images",
    ]
    for label in labels:
        scores = result["per_class"][label]
        lines.append(
            f"{label:<{width}}  {_score(scores['precision']):>9}  {_score(scores['recall']):>6}  "
            f"{scores['num_examples']:>6}"
        )
    cell = max(
        5,
        *(len(label) for label in labels),
        *(len(str(n)) for row in result["confusion_matrix"] for n in row),
    )
    lines += ["", "confusion matrix (rows: true class, columns: predicted class)"]
    lines.append(" " * width + "  " + " ".join(f"{label:>{cell}}" for label in labels))
    for label, row in zip(labels, result["confusion_matrix"], strict=True):
        lines.append(f"{label:<{width}}  " + " ".join(f"{count:>{cell}}" for count in row))
    return "\n".join(lines)
