"""Layer 3, the library (with :mod:`gpubench.lib` and :mod:`gpubench.serving`): may import lib,
serving, measure, records, the contract and errors; never a technique, run, gate, reports or cli.

Model code and configs shared by several techniques (configs and parameter counts now; the
small decoder and MoE layer join as their techniques land)."""
