TAX_RATE = 0.2


def compute_total(prices):
    """Sum of prices plus tax, rounded to cents."""
    subtotal = sum(prices)
    return round(subtotal * (1 + TAX_RATE), 2)
