cat > /workspace/mathutils.py <<'PY'
"""Small helpers used across the project."""


def clamp(x, low, high):
    """Return x limited to the closed interval [low, high]."""
{%- if bug == "clamp" %}
    return max(low, min(x, low))
{%- else %}
    return max(low, min(x, high))
{%- endif %}


def mean(xs):
    """Arithmetic mean of a non-empty list of numbers."""
{%- if bug == "mean" %}
    return sum(xs) / (len(xs) + 1)
{%- else %}
    return sum(xs) / len(xs)
{%- endif %}


def count_words(text):
    """Number of whitespace-separated words in text (any run of spaces, tabs or newlines separates)."""
{%- if bug == "count_words" %}
    return len(text.split(" "))
{%- else %}
    return len(text.split())
{%- endif %}
PY
