class InsufficientStock(ValueError):
    """Raised when removing more units of an item than are in stock."""


class Inventory:
    """Units in stock per SKU."""

    def __init__(self) -> None:
        self._stock: dict[str, int] = {}

    def add(self, sku: str, quantity: int) -> None:
        """Receive ``quantity`` (> 0) units of ``sku``."""
        if quantity <= 0:
            raise ValueError("quantity must be positive")
        self._stock[sku] = self._stock.get(sku, 0) + quantity

    def remove(self, sku: str, quantity: int) -> None:
        """Ship ``quantity`` units; raises :class:`InsufficientStock` (stock unchanged) if there are not enough."""
        available = self._stock[sku]
        if quantity > available:
            raise InsufficientStock(f"{sku}: requested {quantity}, {available} in stock")
        self._stock[sku] = available - quantity

    def count(self, sku: str) -> int:
        """Units of ``sku`` in stock (0 for unknown SKUs)."""
        return self._stock.get(sku, 0)
