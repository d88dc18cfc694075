"""Comparing a candidate loss curve with a reference one: the H2 paper's mean relative error
MRE = mean_i |(y_i - yhat_i) / y_i| over aligned steps (y: reference, yhat: candidate), the
maximum relative error, and the same statistics per window of steps."""

from __future__ import annotations

import dataclasses
import math

from ditorch.precision.loss_log import LossLog, check_finite
from h2.core.errors import UserError

DEFAULT_THRESHOLD = 0.015  # the paper's criterion: MRE < 1.5 %
DEFAULT_WINDOW = 50


@dataclasses.dataclass(frozen=True)
class WindowStats:
    first_step: int
    last_step: int
    count: int
    mre: float
    max_relative_error: float
    mean_signed_error: float  # mean of (yhat - y) / y: positive when the candidate's loss is higher


@dataclasses.dataclass(frozen=True)
class LossDiff:
    steps: list[int]  # the reference's aligned steps
    reference: list[float]
    candidate: list[float]
    signed_errors: list[float]  # (yhat_i - y_i) / y_i per aligned step
    threshold: float
    windows: list[WindowStats]
    align: str = "step"
    candidate_steps: list[int] = dataclasses.field(default_factory=list)  # the candidate's step for each aligned step
    tokens: list[int] = dataclasses.field(default_factory=list)  # consumed tokens at each aligned step (--align tokens)
    requested: int = 0  # reference steps asked for; with --align tokens some may have no candidate counterpart

    @property
    def mre(self) -> float:
        return sum(abs(e) for e in self.signed_errors) / len(self.signed_errors)

    @property
    def max_relative_error(self) -> float:
        return max(abs(e) for e in self.signed_errors)

    @property
    def max_error_step(self) -> int:
        return self.steps[max(range(len(self.steps)), key=lambda i: abs(self.signed_errors[i]))]

    @property
    def passed(self) -> bool:
        return self.mre < self.threshold

    def to_dict(self) -> dict:
        return {
            "steps": len(self.steps), "first_step": self.steps[0], "last_step": self.steps[-1], "mre": self.mre,
            "max_relative_error": self.max_relative_error, "max_error_step": self.max_error_step,
            "threshold": self.threshold, "passed": self.passed, "align": self.align, "requested_steps": self.requested,
            "candidate_first_step": self.candidate_steps[0], "candidate_last_step": self.candidate_steps[-1],
            "windows": [dataclasses.asdict(w) for w in self.windows]
        }


def requested_steps(reference: LossLog, steps: int | None) -> list[int]:
    """The reference's steps (its first `steps` if given), in order."""
    wanted = sorted(reference.steps)
    if steps is not None:
        if len(wanted) < steps:
            raise UserError(f"{reference.path}: --steps {steps} asked, but the reference has only {len(wanted)} steps")
        wanted = wanted[:steps]
    return wanted


def aligned_steps(reference: LossLog, candidate: LossLog, steps: int | None = None) -> list[int]:
    """The reference's steps (its first `steps` if given), in order; each must be in the candidate."""
    wanted = requested_steps(reference, steps)
    last = max(candidate.steps)
    if last < wanted[-1]:
        raise UserError(f"{candidate.path}: the curve ends at step {last}, but the comparison needs steps up to "
                        f"{wanted[-1]} ({len(wanted)} reference steps)")
    missing = [step for step in wanted if step not in candidate.losses]
    if missing:
        shown = ", ".join(map(str, missing[:5])) + (", ..." if len(missing) > 5 else "")
        hint = "" if steps is not None else "; pass --steps N to compare only the first N steps"
        raise UserError(f"{candidate.path}: missing {len(missing)} of the reference's {len(wanted)} steps "
                        f"(steps {shown}){hint}")
    return wanted


def aligned_by_tokens(reference: LossLog, candidate: LossLog, steps: int | None = None) -> list[tuple[int, int, int]]:
    """(reference step, candidate step, tokens) for each requested reference step that ends at a token
    count a candidate step also ends at; the candidate must reach the last requested step's count."""
    wanted = requested_steps(reference, steps)
    needed = reference.consumed_tokens(wanted[-1], "reference")
    by_tokens: dict[int, int] = {}
    for step in sorted(candidate.steps):
        tokens = candidate.consumed_tokens(step, "candidate")
        if tokens in by_tokens:
            raise UserError(
                f"{candidate.where(step)}: steps {by_tokens[tokens]} and {step} both end at {tokens} tokens")
        by_tokens[tokens] = step
    reached = max(by_tokens)
    if reached < needed:
        raise UserError(f"{candidate.path}: the curve ends at {reached} tokens (step {by_tokens[reached]}), but the "
                        f"reference's {len(wanted)} steps reach {needed} tokens")
    pairs = [(step, by_tokens[tokens], tokens) for step in wanted
             if (tokens := reference.consumed_tokens(step, "reference")) in by_tokens]
    if not pairs:
        raise UserError(
            f"{candidate.path}: no candidate step ends at a token count a reference step ends at "
            f"(reference step {wanted[0]} ends at {reference.consumed_tokens(wanted[0], 'reference')} tokens)")
    return pairs


def _window_stats(steps: list[int], errors: list[float]) -> WindowStats:
    return WindowStats(first_step=steps[0], last_step=steps[-1],
                       count=len(steps), mre=sum(abs(e) for e in errors) / len(errors), max_relative_error=max(
                           abs(e) for e in errors), mean_signed_error=sum(errors) / len(errors))


def compare_losses(reference: LossLog, candidate: LossLog, *, threshold: float = DEFAULT_THRESHOLD,
                   steps: int | None = None, window: int = DEFAULT_WINDOW, align: str = "step") -> LossDiff:
    if not (threshold > 0 and math.isfinite(threshold)):
        raise UserError(f"--threshold must be a positive number, got {threshold}")
    if steps is not None and steps < 1:
        raise UserError(f"--steps must be at least 1, got {steps}")
    if window < 1:
        raise UserError(f"--window must be at least 1, got {window}")
    if align == "step":
        chosen = aligned_steps(reference, candidate, steps)
        pairs = [(step, step, None) for step in chosen]
        requested = len(chosen)
    elif align == "tokens":
        pairs = aligned_by_tokens(reference, candidate, steps)
        requested = len(requested_steps(reference, steps))
    else:
        raise UserError(f"--align must be step or tokens, got {align}")
    chosen, candidate_steps = [p[0] for p in pairs], [p[1] for p in pairs]
    check_finite(reference, chosen, "reference")
    check_finite(candidate, candidate_steps, "candidate")
    for step in chosen:
        if reference.losses[step] == 0:
            raise UserError(f"{reference.where(step)}: reference loss is 0 at step {step}; "
                            f"the relative error is undefined")
    y = [reference.losses[s] for s in chosen]
    y_hat = [candidate.losses[s] for s in candidate_steps]
    errors = [(c - r) / r for r, c in zip(y, y_hat)]
    windows = [_window_stats(chosen[i:i + window], errors[i:i + window]) for i in range(0, len(chosen), window)]
    tokens = [p[2] for p in pairs] if align == "tokens" else []
    return LossDiff(chosen, y, y_hat, errors, threshold, windows, align, candidate_steps, tokens, requested)


def format_report(diff: LossDiff, reference_path: str, candidate_path: str, reference_format: str = "",
                  candidate_format: str = "") -> str:
    verdict = "PASS" if diff.passed else "FAIL"
    lines = [
        f"reference {reference_path}" + (f" ({reference_format})" if reference_format else ""),
        f"candidate {candidate_path}" + (f" ({candidate_format})" if candidate_format else ""),
        _alignment_line(diff),
        f"MRE {100 * diff.mre:.4f}%  (threshold {100 * diff.threshold:.4f}%)",
        f"max relative error {100 * diff.max_relative_error:.4f}% at {_step_name(diff, diff.max_error_step)} "
        f"(reference {diff.reference[diff.steps.index(diff.max_error_step)]:.6g}, "
        f"candidate {diff.candidate[diff.steps.index(diff.max_error_step)]:.6g})",
        "",
        f"{'steps':>15} {'n':>5} {'MRE %':>10} {'max rel %':>10} {'mean signed %':>14}",
    ]
    for w in diff.windows:
        lines.append(f"{f'{w.first_step}..{w.last_step}':>15} {w.count:>5} {100 * w.mre:>10.4f} "
                     f"{100 * w.max_relative_error:>10.4f} {100 * w.mean_signed_error:>+14.4f}")
    lines += ["", f"{verdict}: MRE {100 * diff.mre:.4f}% {'<' if diff.passed else '>='} {100 * diff.threshold:.4f}%"]
    return "\n".join(lines)


def _alignment_line(diff: LossDiff) -> str:
    if diff.align == "step":
        return f"aligned steps {diff.steps[0]}..{diff.steps[-1]} ({len(diff.steps)} steps)"
    return (f"aligned by consumed tokens: {len(diff.steps)} of {diff.requested} reference steps "
            f"(reference steps {diff.steps[0]}..{diff.steps[-1]} = candidate steps "
            f"{diff.candidate_steps[0]}..{diff.candidate_steps[-1]}, {diff.tokens[0]}..{diff.tokens[-1]} tokens)")


def _step_name(diff: LossDiff, step: int) -> str:
    if diff.align == "step":
        return f"step {step}"
    index = diff.steps.index(step)
    return f"reference step {step} (candidate step {diff.candidate_steps[index]}, {diff.tokens[index]} tokens)"
