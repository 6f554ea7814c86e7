"""Optimizations: our implementation of each technique (gpubench.optimizations.<technique>)."""
