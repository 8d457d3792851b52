"""Stock keeping and invoicing with exact money arithmetic."""

from ledger.inventory import Inventory, InsufficientStock
from ledger.invoice import Invoice, Line
from ledger.money import Money

__all__ = ["InsufficientStock", "Inventory", "Invoice", "Line", "Money"]
