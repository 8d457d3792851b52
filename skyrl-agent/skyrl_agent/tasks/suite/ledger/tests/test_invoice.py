from ledger import Invoice, Line, Money


def test_subtotal():
    invoice = Invoice("A-1", [Line("pen", 2, Money(150)), Line("pad", 1, Money(300))])
    assert invoice.subtotal().cents == 600


def test_total_with_tax():
    invoice = Invoice("A-2", [Line("book", 1, Money(1000))], tax_rate="0.08")
    assert invoice.total().cents == 1080
