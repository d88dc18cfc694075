"""The precision-diff figure: both loss curves above, the relative error per step below."""

from __future__ import annotations

import os

from ditorch.precision.loss_diff import LossDiff
from h2.core.errors import UserError


def plot_loss_diff(diff: LossDiff, path: str, *, reference_label: str, candidate_label: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    from matplotlib import pyplot

    figure, (losses, errors) = pyplot.subplots(2, 1, figsize=(8, 6), sharex=True, gridspec_kw={"height_ratios": [3, 2]})
    losses.plot(diff.steps, diff.reference, label=f"reference: {reference_label}", linewidth=1.2)
    losses.plot(diff.steps, diff.candidate, label=f"candidate: {candidate_label}", linewidth=1.0, linestyle="--")
    losses.set_ylabel("training loss")
    losses.legend(loc="upper right", fontsize=8)
    losses.grid(alpha=0.3)
    losses.set_title(f"MRE {100 * diff.mre:.3f}% (threshold {100 * diff.threshold:.2f}%): "
                     f"{'PASS' if diff.passed else 'FAIL'}")
    errors.plot(diff.steps, [100 * abs(e) for e in diff.signed_errors], color="tab:red", linewidth=0.8,
                label="|relative error| per step")
    errors.axhline(100 * diff.mre, color="tab:purple", linestyle="-", linewidth=1.0, label="MRE")
    errors.axhline(100 * diff.threshold, color="black", linestyle=":", linewidth=1.0, label="threshold")
    errors.set_ylim(bottom=0)
    errors.set_xlabel("step")
    errors.set_ylabel("relative error (%)")
    errors.legend(loc="upper right", fontsize=8)
    errors.grid(alpha=0.3)
    figure.tight_layout()
    folder = os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(folder, exist_ok=True)
        figure.savefig(path, dpi=110, format="png")
    except OSError as error:
        raise UserError(f"--plot {path}: cannot write ({error.strerror or error})") from None
    finally:
        pyplot.close(figure)
