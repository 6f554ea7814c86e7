"""Baselines: each technique the way the common stacks do it today (gpubench.baselines.<technique>)."""
