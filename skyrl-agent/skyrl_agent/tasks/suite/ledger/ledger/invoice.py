from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal

from ledger.money import Money


@dataclass(frozen=True)
class Line:
    """One invoice line: ``quantity`` units at ``unit_price`` each."""

    description: str
    quantity: int
    unit_price: Money

    @property
    def total(self) -> Money:
        """Quantity times unit price."""
        return self.unit_price.times(self.quantity)


class Invoice:
    """An invoice: lines, then tax on their subtotal."""

    def __init__(self, number: str, lines: list[Line] = [], tax_rate: str = "0") -> None:
        self.number = number
        self.lines = lines
        self.tax_rate = Decimal(tax_rate)

    def add_line(self, line: Line) -> None:
        """Append ``line`` to this invoice."""
        self.lines.append(line)

    def subtotal(self) -> Money:
        """Sum of the line totals."""
        total = Money(0)
        for line in self.lines:
            total = total + line.total
        return total

    def tax(self) -> Money:
        """Tax on the subtotal, rounded half up to the cent."""
        return self.subtotal().times(self.tax_rate)

    def total(self) -> Money:
        """Subtotal plus tax."""
        return self.subtotal() + self.tax()
