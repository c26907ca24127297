"""Placement: which bookies hold a new ledger, and which one replaces a failed bookie.

As BookKeeper's default policy, bookies are drawn at random so ledgers spread evenly. The
random source is injected: the same seed and the same registry give the same ensembles.
"""

from __future__ import annotations

import random as random_module
from collections.abc import Collection, Iterable

from quorumlog.errors import NotEnoughBookiesError


def choose_ensemble(
    writable_bookies: Iterable[str],
    ensemble_size: int,
    random: random_module.Random,
    exclude: Collection[str] = (),
) -> list[str]:
    """`ensemble_size` distinct writable bookies (not in `exclude`), in random order.

    NotEnoughBookiesError when fewer are available."""
    if ensemble_size < 1:
        raise ValueError("ensemble_size must be >= 1")
    # Sorted first, so the draw depends on the seed and the set, not the registry's order.
    candidates = sorted(set(writable_bookies) - set(exclude))
    if len(candidates) < ensemble_size:
        raise NotEnoughBookiesError(ensemble_size, len(candidates))
    return random.sample(candidates, ensemble_size)


def choose_replacement(
    writable_bookies: Iterable[str],
    ensemble: Collection[str],
    random: random_module.Random,
    exclude: Collection[str] = (),
) -> str:
    """A writable bookie to take a failed one's place: never one already in `ensemble`
    (two positions on one bookie would let one crash take out two copies), nor one in
    `exclude` (bookies this writer saw fail)."""
    return choose_ensemble(writable_bookies, 1, random, exclude=set(ensemble) | set(exclude))[0]


def replace_bookies(
    ensemble: list[str],
    failed_positions: Collection[int],
    writable_bookies: Iterable[str],
    random: random_module.Random,
    exclude: Collection[str] = (),
) -> list[str]:
    """`ensemble` with each failed position given a new bookie (in position order).

    NotEnoughBookiesError when there are not enough writable bookies for all of them."""
    writable = sorted(set(writable_bookies))
    replaced = list(ensemble)
    # Failed bookies stay excluded even if the registry still lists them as writable.
    unavailable = set(ensemble) | set(exclude)
    for position in sorted(failed_positions):
        try:
            bookie = choose_replacement(writable, replaced, random, exclude=unavailable)
        except NotEnoughBookiesError:
            raise NotEnoughBookiesError(
                len(failed_positions), len(set(writable) - unavailable)
            ) from None
        replaced[position] = bookie
        unavailable.add(bookie)
    return replaced
