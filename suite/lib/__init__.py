"""Layer 3, the library techniques and the serving engine share (with :mod:`gpubench.models` and
:mod:`gpubench.serving`): attention conventions and GQA, packing, offload, KV-cache arithmetic and
storage, paged decode, drafting, gradient checks, Triton plumbing and the Triton kernels the library
runs (:mod:`.kernels`), optional packages.

May import: models, serving and one another, measure, records, the contract and checks, errors.
Never a technique or the registry, baselines/, optimizations/, run, gate, reports or cli.
"""
