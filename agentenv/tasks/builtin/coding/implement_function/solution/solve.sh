cat >> /workspace/textlib.py <<'PY'


{%- if func == "to_roman" %}
def to_roman(n: int) -> str:
    out = ""
    for value, sym in [(1000, "M"), (900, "CM"), (500, "D"), (400, "CD"), (100, "C"), (90, "XC"),
                       (50, "L"), (40, "XL"), (10, "X"), (9, "IX"), (5, "V"), (4, "IV"), (1, "I")]:
        while n >= value:
            out += sym
            n -= value
    return out
{%- elif func == "rle_encode" %}
def rle_encode(s: str) -> str:
    import itertools
    return "".join(f"{len(list(group))}{ch}" for ch, group in itertools.groupby(s))
{%- else %}
def is_palindrome(s: str) -> bool:
    kept = [c.lower() for c in s if c.isalnum()]
    return kept == kept[::-1]
{%- endif %}
PY
