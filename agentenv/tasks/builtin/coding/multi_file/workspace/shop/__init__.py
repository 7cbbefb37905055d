"""A tiny shop: prices, carts and a command line."""
