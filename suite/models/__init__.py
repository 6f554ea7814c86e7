"""Model code and configs shared by several techniques (configs and parameter counts now; the
small decoder and MoE layer join as their techniques land)."""
