"""Exact integer arithmetic that specs and the planner share: divisors from the factorisation (never a
scan over 1..n), so counts up to the specs' bounds answer at once. Pure Python."""

from __future__ import annotations


def prime_factors(n: int) -> dict[int, int]:
    """{prime: power} of n >= 1 (trial division up to sqrt(n))."""
    factors: dict[int, int] = {}
    p = 2
    while p * p <= n:
        while n % p == 0:
            factors[p] = factors.get(p, 0) + 1
            n //= p
        p += 1 if p == 2 else 2
    if n > 1:
        factors[n] = factors.get(n, 0) + 1
    return factors


def divisors(n: int) -> list[int]:
    """Every divisor of n >= 1, sorted."""
    result = [1]
    for prime, power in prime_factors(n).items():
        result = [d * prime**e for d in result for e in range(power + 1)]
    return sorted(result)
