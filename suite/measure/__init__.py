"""Layer 2, measurement: timing (interleaved rounds, CUDA events or the CPU clock), energy, NVML
telemetry, hygiene, profiles, the environment and device ceilings, autotuning's cache and the
machine's load.

May import: records, the contract and checks, errors. Never the library (lib, models, serving), a
technique, run, gate, reports or cli.
"""
