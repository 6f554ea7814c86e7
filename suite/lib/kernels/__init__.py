"""The library's Triton kernels: flash attention forward (:mod:`.flash_attention_triton`, its tiles
in :mod:`.flash_attention_triton_tiles`), its backward and the differentiable (and varlen) entry
points packed training runs (:mod:`.flash_attention_triton_bwd`), and the paged decode the serving
engine runs (:mod:`.paged_attention_triton`). Each imports Triton at the top: the library loads
them through :func:`gpubench.lib.triton_support.kernel_module` (kernel or PyTorch fallback), so a
machine without Triton gets a reason instead of an ImportError. The optimizations that time them
(``optimizations/flash_attention.py``, ``optimizations/paged_attention.py``) import them from here.

May import what the rest of :mod:`gpubench.lib` may (measure, for the autotuner; never a technique,
baselines/ or optimizations/).
"""
