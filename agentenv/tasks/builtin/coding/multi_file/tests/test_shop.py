import json
from pathlib import Path

import pytest

PARAMS = json.loads((Path(__file__).with_name("variant.json")).read_text())["params"]
NEW = PARAMS["new_name"]


def test_renamed_and_old_name_gone():
    from shop import pricing

    assert hasattr(pricing, NEW)
    assert not hasattr(pricing, "compute_total")
    for module in ("pricing", "cart", "cli"):
        text = (Path("/workspace/shop") / f"{module}.py").read_text()
        assert "compute_total" not in text, module


def test_total_and_discount():
    from shop import pricing

    fn = getattr(pricing, NEW)
    assert fn([10.0, 5.0]) == 18.0
    assert fn([10.0, 5.0], discount_pct=10) == pytest.approx(16.2)


def test_cart_passes_discount():
    from shop.cart import Cart

    cart = Cart()
    cart.add("a", 100.0)
    assert cart.total() == 120.0
    assert cart.total(discount_pct=50) == 60.0


def test_cli_code(capsys):
    from shop import cli

    assert cli.main(["10", "5", "--code", PARAMS["code"]]) == 0
    assert capsys.readouterr().out.strip() == "16.20"
    assert cli.main(["10", "5", "--code", "nope" + PARAMS["code"]]) == 0
    assert capsys.readouterr().out.strip() == "18.00"
