import argparse

from shop.cart import Cart


def main(argv=None):
    parser = argparse.ArgumentParser(prog="shop")
    parser.add_argument("prices", nargs="*", type=float)
    args = parser.parse_args(argv)
    cart = Cart()
    for i, price in enumerate(args.prices):
        cart.add(f"item{i}", price)
    print(f"{cart.total():.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
