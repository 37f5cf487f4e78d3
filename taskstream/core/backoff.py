"""Retry backoff as a pure function of the attempt, the policy and an injected random number."""

from __future__ import annotations

from taskstream.core.model import Backoff


def compute_backoff(failures: int, policy: Backoff, rand: float = 0.0) -> int:
    """Delay in ms before the next attempt after `failures` failed attempts (failures >= 1).

    `rand` in [0, 1) spreads retries by up to `policy.jitter` of the delay; pass 0 for no jitter.
    """
    if failures < 1:
        raise ValueError(f"failures must be >= 1, got {failures}")
    exponent = min(failures - 1, 62)  # avoid float overflow on absurd attempt counts
    delay = min(float(policy.max_ms), policy.initial_ms * policy.factor**exponent)
    delay += delay * policy.jitter * rand
    return int(min(delay, policy.max_ms * (1 + policy.jitter)))
