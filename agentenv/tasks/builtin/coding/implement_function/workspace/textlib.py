"""A small text library. Each function's docstring is its specification."""


def to_roman(n: int) -> str:
    """Roman numeral of 1 <= n <= 3999 using subtractive notation (4 -> 'IV', 1994 -> 'MCMXCIV')."""
    raise NotImplementedError


def rle_encode(s: str) -> str:
    """Run-length encoding: each run as count then character ('aaabcc' -> '3a1b2c'; '' -> '')."""
    raise NotImplementedError


def is_palindrome(s: str) -> bool:
    """True when s reads the same backwards, ignoring case and every non-alphanumeric character."""
    raise NotImplementedError
