"""A user-defined exception of the recorded-error tests, in a module of its own so that a
worker process can have it imported, or not (``errors_worker.py --import-user-errors``)."""

from __future__ import annotations


class CardDeclinedError(Exception):
    """A module-level application error with fields of its own."""

    def __init__(self, card: str, amount_cents: int) -> None:
        super().__init__(f"card {card} declined for {amount_cents} cents")
        self.card = card
        self.amount_cents = amount_cents
