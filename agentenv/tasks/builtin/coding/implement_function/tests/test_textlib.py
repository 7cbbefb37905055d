import json
from pathlib import Path

import pytest

import textlib

FUNC = json.loads((Path(__file__).with_name("variant.json")).read_text())["params"]["func"]


def only(name):
    return pytest.mark.skipif(FUNC != name, reason=f"this variant asks for {FUNC}")


@only("to_roman")
def test_to_roman():
    cases = {1: "I", 4: "IV", 9: "IX", 14: "XIV", 40: "XL", 90: "XC", 400: "CD", 1994: "MCMXCIV", 3999: "MMMCMXCIX"}
    for n, want in cases.items():
        assert textlib.to_roman(n) == want


@only("rle_encode")
def test_rle_encode():
    assert textlib.rle_encode("aaabcc") == "3a1b2c"
    assert textlib.rle_encode("") == ""
    assert textlib.rle_encode("zzzzzzzzzzzz") == "12z"


@only("is_palindrome")
def test_is_palindrome():
    assert textlib.is_palindrome("A man, a plan, a canal: Panama")
    assert textlib.is_palindrome("")
    assert not textlib.is_palindrome("palindrome")
