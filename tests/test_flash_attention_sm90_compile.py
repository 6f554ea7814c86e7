"""Every flash-attention kernel form compiles for sm_90 (H100 / H200) with Triton's own compiler and
ptxas, no GPU needed: the forward's pointer path and its tensor-descriptor (TMA) path, the
backward's preprocess, dQ and dK/dV kernels, at head dims 64 / 96 / 128 / 192-128 / 256. Triton's
interpreter runs Python the compiler rejects (a kernel reading a plain global float did, here), and
it cannot say whether a tile fits the chip, so this is where both are caught. Each form's shared
memory and registers (from the compiled cubin) are printed (``pytest -s`` shows them) for the GPU
session that will time them. Skipped where Triton has no CUDA backend."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

# Run in a fresh process: the compiler only runs with the interpreter off, and gpubench turns the
# interpreter on where there is no CUDA.
COMPILE_FOR_SM90 = r"""
import json, os, subprocess, sys, tempfile
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
import gpubench.lib.kernels.flash_attention_triton as fwd
import gpubench.lib.kernels.flash_attention_triton_bwd as bwd

FP32_SCALARS = ("qk_scale_log2", "sm_scale")
DESCRIPTORS = ("q_ptr", "k_ptr", "v_ptr", "out_ptr", "do_ptr")  # out: forward, do: backward


def signature(fn, consts, tma):
    # bf16 tensors, fp32 lse / delta, int32 offsets and lengths; with tma q, k, v and the forward's
    # out or the backward's do are 4-D descriptors whose boxes are the tiles.
    sig = {}
    for i, name in enumerate(fn.arg_names):
        if fn.params[i].is_constexpr:
            continue
        if tma and name in DESCRIPTORS:
            rows = consts["BLOCK_N"] if name in ("k_ptr", "v_ptr") else consts["BLOCK_M"]
            cols = consts["BLOCK_D"] if name in ("q_ptr", "k_ptr") else consts["BLOCK_DV"]
            sig[name] = f"tensordesc<bf16[1,1,{rows},{cols}]>"
        elif name.endswith("_ptr"):
            sig[name] = ("*i32" if name.startswith("cu_") else "*fp32" if name in ("lse_ptr", "delta_ptr")
                         else "*bf16")
        else:
            sig[name] = "fp32" if name in FP32_SCALARS else "i32"
    return sig


def registers(kernel):
    # ptxas's figures, read back from the cubin by the cuobjdump Triton ships with its CUDA backend.
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    if not os.path.exists(tool):
        return None, None
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(kernel.asm["cubin"])
        f.flush()
        text = subprocess.run([tool, "-res-usage", f.name], capture_output=True, text=True).stdout
    fields = dict(item.split(":", 1) for line in text.splitlines() if "REG:" in line for item in line.split())
    return int(fields["REG"]), int(fields["LOCAL"])


def dims(d, dv):
    return dict(HEAD_DIM=d, HEAD_DIM_V=dv, BLOCK_D=max(16, triton.next_power_of_2(d)),
                BLOCK_DV=max(16, triton.next_power_of_2(dv)))


COMMON = dict(DOT_PRECISION="tf32", DOT_IN_FP32=False)
FORWARD = [  # name, (d, dv), causal, bottom_right, varlen, lse, tma, (BLOCK_M, BLOCK_N, warps, stages), LOCAL
    ("fwd pointer 64 varlen", (64, 64), True, True, True, True, False, (32, 16, 4, 2), 0),
    ("fwd pointer 128 causal", (128, 128), True, True, False, True, False, (128, 64, 8, 3), 0),
    ("fwd pointer 192/128 top-left", (192, 128), True, False, False, False, False, (32, 16, 4, 2), 0),
    ("fwd pointer 256", (256, 256), False, False, False, True, False, (128, 64, 8, 2), 0),
    ("fwd tma 128 causal", (128, 128), True, True, False, True, True, (128, 128, 8, 3), 0),
    ("fwd tma 128 top-left", (128, 128), True, False, False, False, True, (256, 64, 8, 2), 0),
    ("fwd tma 64", (64, 64), False, False, False, True, True, (128, 64, 4, 4), 0),
    ("fwd tma 96 causal", (96, 96), True, True, False, True, True, (128, 64, 4, 3), 0),
    ("fwd tma 192/128 causal", (192, 128), True, True, False, True, True, (128, 64, 8, 3), 0),
    ("fwd tma 256", (256, 256), False, False, False, True, True, (64, 64, 4, 3), 0),
    # local masks (issue 37): a sliding window (LOCAL 1) and chunks (2), both load paths
    ("fwd pointer 128 window", (128, 128), True, True, False, True, False, (128, 64, 8, 3), 1),
    ("fwd pointer 64 varlen chunk", (64, 64), True, True, True, True, False, (64, 32, 4, 3), 2),
    ("fwd tma 128 window", (128, 128), True, True, False, True, True, (128, 128, 8, 3), 1),
    ("fwd tma 64 chunk", (64, 64), True, True, False, True, True, (128, 64, 4, 4), 2),
]
BACKWARD = [  # name, kernel, (d, dv), causal, varlen, tma, (BLOCK_M, BLOCK_N, warps, stages), LOCAL
    ("bwd dq 128 causal", bwd._bwd_dq, (128, 128), True, False, False, (128, 64, 8, 3), 0),
    ("bwd dkdv 128 causal", bwd._bwd_dkdv, (128, 128), True, False, False, (64, 128, 8, 3), 0),
    ("bwd dq 192/128 varlen", bwd._bwd_dq, (192, 128), True, True, False, (64, 32, 8, 2), 0),
    ("bwd dkdv 256", bwd._bwd_dkdv, (256, 256), False, False, False, (32, 64, 8, 2), 0),
    ("bwd tma dq 128 causal", bwd._bwd_dq, (128, 128), True, False, True, (128, 32, 4, 5), 0),
    ("bwd tma dkdv 128 causal", bwd._bwd_dkdv, (128, 128), True, False, True, (64, 128, 8, 4), 0),
    ("bwd tma dq 96", bwd._bwd_dq, (96, 96), False, False, True, (128, 64, 8, 3), 0),
    ("bwd tma dkdv 192/128 causal", bwd._bwd_dkdv, (192, 128), True, False, True, (32, 64, 8, 2), 0),
    ("bwd tma dq 128 window", bwd._bwd_dq, (128, 128), True, False, True, (128, 32, 4, 5), 1),
    ("bwd tma dkdv 128 window", bwd._bwd_dkdv, (128, 128), True, False, True, (64, 128, 8, 4), 1),
    ("bwd dq 64 varlen chunk", bwd._bwd_dq, (64, 64), True, True, False, (64, 32, 4, 3), 2),
    ("bwd dkdv 64 varlen chunk", bwd._bwd_dkdv, (64, 64), True, True, False, (32, 64, 4, 3), 2),
]

def compile_form(name, fn, consts, tma, warps, stages):
    kernel = triton.compile(ASTSource(fn, signature(fn, consts, tma), consts), target=GPUTarget("cuda", 90, 32),
                            options=dict(num_warps=warps, num_stages=stages))
    regs, local = registers(kernel)
    return dict(name=name, shared=kernel.metadata.shared, registers=regs, local=local,
                tma="cp.async.bulk.tensor" in kernel.asm["ptx"], consts={k: consts[k] for k in consts
                                                                        if k.startswith("BLOCK")}, stages=stages)


for name, (d, dv), causal, bottom_right, varlen, lse, tma, (bm, bn, warps, stages), local in FORWARD:
    # A negative scale is the rare form (scaled before the row maximum): one pointer form has it.
    consts = dict(dims(d, dv), CAUSAL=causal, BOTTOM_RIGHT=bottom_right, VARLEN=varlen, STORE_LSE=lse, USE_TMA=tma,
                  SCALE_POSITIVE=name != "fwd pointer 192/128 top-left", LOCAL=local, BLOCK_M=bm, BLOCK_N=bn,
                  **COMMON)
    print(json.dumps(compile_form(name, fwd._flash_attention_fwd, consts, tma, warps, stages)), flush=True)
for name, kernel, (d, dv), causal, varlen, tma, (bm, bn, warps, stages), local in BACKWARD:
    consts = dict(dims(d, dv), CAUSAL=causal, BOTTOM_RIGHT=True, VARLEN=varlen, USE_TMA=tma, LOCAL=local, BLOCK_M=bm,
                  BLOCK_N=bn, **COMMON)
    print(json.dumps(compile_form(name, kernel, consts, tma, warps, stages)), flush=True)
consts = dict(HEAD_DIM_V=128, BLOCK_DV=128, VARLEN=True, BLOCK_M=bwd.PREPROCESS_BLOCK_M)
print(json.dumps(compile_form("bwd preprocess 128 varlen", bwd._bwd_preprocess, consts, False, 4, 2)), flush=True)
"""

SM90_SHARED_BYTES = 232448  # shared memory a block may opt into on an H100 / H200 (227 KiB)


@pytest.fixture(scope="module")
def sm90_forms(tmp_path_factory):
    env = {
        **os.environ,
        "TRITON_INTERPRET": "0",  # compiled, not interpreted
        "TRITON_CACHE_DIR": str(tmp_path_factory.mktemp("triton-cache")),
    }  # compile afresh
    result = subprocess.run(
        [sys.executable, "-c", COMPILE_FOR_SM90], env=env, capture_output=True, text=True, timeout=600
    )
    if result.returncode != 0 and (
        "No module named 'triton.backends.nvidia'" in result.stderr
        or "ptxas" in result.stderr
        and "not found" in result.stderr
    ):
        pytest.skip(f"Triton cannot compile for CUDA here: {result.stderr.strip().splitlines()[-1]}")
    assert result.returncode == 0, result.stderr[-3000:]
    forms = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    for form in forms:
        print(
            f"sm_90 {form['name']}: {form['consts']} stages {form['stages']}: shared {form['shared']} bytes, "
            f"{form['registers']} registers a thread, {form['local']} bytes local (spills)"
        )
    return forms


def test_every_kernel_form_compiles_for_sm90_and_fits_its_shared_memory(sm90_forms):
    """All 27 forms (14 forward and 12 backward, on the pointer and descriptor paths, plain and with a
    sliding window or chunks, and the backward's preprocess) compile for sm_90, each within the 227
    KiB of shared memory an H100 / H200 block may use."""
    assert len(sm90_forms) == 27
    too_big = [f["name"] for f in sm90_forms if f["shared"] > SM90_SHARED_BYTES]
    assert not too_big, too_big


def test_descriptor_forms_copy_by_tma_and_pointer_forms_do_not(sm90_forms):
    """The descriptor paths (forward and backward) really issue TMA copies (cp.async.bulk.tensor) on
    sm_90, and the pointer paths (GPUs before sm_90, varlen, layouts TMA cannot address) do not
    depend on them."""
    for form in sm90_forms:
        assert form["tma"] == (" tma " in form["name"]), form["name"]


def test_descriptor_shared_memory_estimate_bounds_the_compilers_figure(sm90_forms):
    """The autotuner prunes descriptor configs by descriptor_shared_bytes before tuning; that
    estimate must never be below what the compiler allocates (a config it kept could then fail to
    launch), nor far above (it would drop configs that fit)."""
    from gpubench.lib.kernels.flash_attention_triton_tiles import descriptor_shared_bytes

    for form in (f for f in sm90_forms if f["tma"] and f["name"].startswith("fwd")):
        blocks = form["consts"]
        estimate = descriptor_shared_bytes(
            blocks["BLOCK_M"], blocks["BLOCK_N"], blocks["BLOCK_D"], blocks["BLOCK_DV"], form["stages"]
        )
        assert estimate - 2048 <= form["shared"] <= estimate, (form["name"], form["shared"], estimate)
