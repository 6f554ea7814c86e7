"""Shipped scenario files (YAML); ``gpubench list`` shows them."""
