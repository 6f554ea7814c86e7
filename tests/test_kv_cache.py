"""KV-cache calculator: exact per-family formulas (hand-computed), allocation checked to the byte."""

import json

import pytest
import torch
from click.testing import CliRunner

from gpubench.cli import main
from gpubench.errors import BadInput
from gpubench.lib import kvmath
from gpubench.models import config as model_config
from gpubench.models import params as model_params

GiB = 2**30


def preset_layout(name, kv_dtype="bf16", tp=1):
    return kvmath.layout_for(model_config.load_preset(name), kv_dtype, tp)


def test_llama2_7b_classic_example_4096_tokens_fp16_is_2_gib():
    layout = preset_layout("llama-2-7b", "fp16")
    assert layout.bytes_per_token_per_layer == 2 * 32 * 128 * 2
    assert kvmath.sequence_bytes(layout, 4096, "paged", 16, 4096) == 4096 * 2 * 32 * 4096 * 2 == 2 * GiB
    cfg = model_config.load_preset("llama-2-7b")
    assert kvmath.naive_bytes_per_token(cfg, layout.fmt) == layout.bytes_per_token  # MHA: naive is right


def test_gqa_divides_by_the_group_and_the_naive_formula_overstates_it():
    cfg = model_config.load_preset("llama-3.1-8b")
    layout = kvmath.layout_for(cfg, "bf16")
    assert layout.attention == "GQA" and layout.bytes_per_token_per_layer == 2 * 8 * 128 * 2  # 4 KiB
    assert layout.bytes_per_token == 32 * 4096  # 128 KiB per token
    assert kvmath.naive_bytes_per_token(cfg, layout.fmt) / layout.bytes_per_token == 4.0


def test_mqa_keeps_one_head():
    raw = {
        "model_type": "llama",
        "hidden_size": 2048,
        "num_hidden_layers": 4,
        "num_attention_heads": 16,
        "num_key_value_heads": 1,
    }
    layout = kvmath.layout_for(model_config.from_dict(raw, "mqa", "test"), "fp32")
    assert layout.attention == "MQA" and layout.bytes_per_token == 4 * 2 * 1 * 128 * 4


def test_head_dim_is_read_from_the_config_not_derived():
    cfg = model_config.load_preset("gpt-oss-20b")
    assert cfg.hidden_size // cfg.num_heads == 45 and cfg.head_dim == 64 and cfg.head_dim_from_config
    assert kvmath.layout_for(cfg, "bf16").bytes_per_token_per_layer == 2 * 8 * 64 * 2


def test_mla_stores_one_latent_without_the_factor_two():
    cfg = model_config.load_preset("deepseek-v3")
    layout = kvmath.layout_for(cfg, "bf16")
    assert layout.attention == "MLA" and layout.bytes_per_token_per_layer == (512 + 64) * 2
    assert layout.bytes_per_token == 61 * 1152
    # tensor parallelism does not split the latent
    assert kvmath.layout_for(cfg, "bf16", tp=8).bytes_per_token_per_layer == 1152


def test_sliding_window_conventions_of_each_family():
    mistral = model_config.load_preset("mistral-7b-v0.1")
    assert mistral.layer_windows == (4096,) * 32
    gpt_oss = model_config.load_preset("gpt-oss-120b")
    assert gpt_oss.layer_windows[:4] == (128, None, 128, None) and gpt_oss.sliding_layers == 18
    qwen = model_config.load_preset("qwen2.5-7b")
    assert qwen.sliding_layers == 0  # sliding_window is set but use_sliding_window is false
    raw = {
        **model_config.preset_raw("qwen2.5-7b"),
        "use_sliding_window": True,
        "sliding_window": 4096,
        "max_window_layers": 20,
    }
    on = model_config.from_dict(raw, "qwen-swa", "test")
    assert on.layer_windows[:20] == (None,) * 20 and on.layer_windows[20:] == (4096,) * 8


def test_window_aware_blocks_hand_computed():
    # Mistral window 4096, block 16: aligned end -> 256 blocks; one token more -> the window
    # starts inside a block, so it touches 257 blocks.
    assert kvmath.window_blocks(8192, 4096, 16) == 256
    assert kvmath.window_blocks(8200, 4096, 16) == 257
    assert kvmath.window_blocks(100, 4096, 16) == 7  # shorter than the window: the whole sequence
    layout = preset_layout("mistral-7b-v0.1")
    per_layer = 2 * 8 * 128 * 2
    assert kvmath.sequence_bytes(layout, 8200, "paged", 16, 32768) == 32 * 257 * 16 * per_layer
    assert kvmath.sequence_bytes(layout, 8200, "paged_full", 16, 32768) == 32 * 513 * 16 * per_layer
    assert kvmath.sequence_bytes(layout, 8200, "contiguous", 16, 32768) == 32 * 32768 * per_layer
    assert kvmath.sequence_bytes(layout, 8200, "contiguous_ring", 16, 32768) == 32 * 4096 * per_layer


def test_block_edge_lengths_hand_computed():
    assert kvmath.block_edge_lengths(16, 512) == [1, 15, 16, 17, 31, 32, 33, 511, 512]
    assert kvmath.block_edge_lengths(8, 70) == [1, 7, 8, 9, 15, 16, 17, 63, 64, 65, 69, 70]
    # a sliding window adds the lengths where it starts on a block edge or just past one
    assert kvmath.block_edge_lengths(16, 200, (128, None)) == [
        1,
        15,
        16,
        17,
        31,
        32,
        33,
        127,
        128,
        129,
        143,
        144,
        145,
        191,
        192,
        193,
        199,
        200,
    ]
    assert kvmath.block_edge_lengths(1, 5) == [1, 2, 3, 4, 5]
    assert kvmath.block_edge_lengths(16, 10) == [1, 9, 10]  # capped by the longest


def test_paged_rounds_up_to_blocks_and_contiguous_reserves_max_len():
    layout = preset_layout("llama-2-7b")
    per_token = layout.bytes_per_token
    assert kvmath.sequence_bytes(layout, 100, "paged", 16, 4096) == 112 * per_token
    assert kvmath.sequence_bytes(layout, 100, "contiguous", 16, 4096) == 4096 * per_token
    assert kvmath.token_bytes(layout, [100]) == 100 * per_token


def test_tensor_parallel_splits_or_replicates_kv_heads():
    assert preset_layout("llama-2-7b", tp=2).kv_heads_per_gpu == 16
    assert preset_layout("llama-3.1-70b", tp=8).kv_heads_per_gpu == 1
    replicated = preset_layout("llama-3.1-70b", tp=16)
    assert replicated.kv_heads_per_gpu == 1 and "replicated" in replicated.tp_note
    with pytest.raises(BadInput, match="cannot split evenly"):
        preset_layout("llama-3.1-70b", tp=3)


@pytest.mark.parametrize(
    "fmt,vector_bytes",
    [
        ("fp32", 512),
        ("bf16", 256),
        ("fp16", 256),
        ("fp8", 128),
        ("int8", 128 + 2),  # one fp16 scale per vector
        ("int4", 64 + 4 * 4),  # 4 groups of 32, fp16 scale + zero each
        ("mxfp4", 64 + 4 * 1),  # 4 groups of 32, one e8m0 byte each
        ("nvfp4", 64 + 8 * 1),  # 8 groups of 16, one fp8 byte each
    ],
)
def test_kv_formats_count_their_scales(fmt, vector_bytes):
    assert kvmath.KV_FORMATS[fmt].vector_bytes(128) == vector_bytes


def test_per_tensor_scales_are_a_fixed_cost():
    layout = preset_layout("llama-2-7b", "fp8")
    assert layout.fixed_bytes == 32 * 2 * 4
    assert kvmath.cache_bytes(layout, [10], "paged", 16, 4096) == 32 * 2 * 4 + 16 * layout.bytes_per_token


@pytest.mark.parametrize(
    "name", [n for n in model_config.preset_names() if model_config.preset_raw(n).get("_published_params")]
)
def test_parameter_counts_match_the_published_figures(name):
    raw = model_config.preset_raw(name)
    counted = model_params.count_parameters(model_config.load_preset(name)).total
    assert counted == pytest.approx(raw["_published_params"], rel=0.01)


def test_weight_bytes_follow_the_checkpoint_quantization():
    gpt = model_params.weight_bytes(model_config.load_preset("gpt-oss-20b"))
    assert 12.5 * GiB < gpt.bytes < 13.2 * GiB and "mxfp4" in gpt.note  # MXFP4 experts, bf16 rest
    llama = model_params.weight_bytes(model_config.load_preset("llama-2-7b"), "fp32")
    assert llama.bytes == model_params.count_parameters(model_config.load_preset("llama-2-7b")).total * 4


def test_plan_capacity_figures_are_consistent():
    cfg = model_config.load_preset("llama-2-7b")
    p = kvmath.plan(
        cfg,
        seq_len=4096,
        batch=None,
        kv_dtype="fp16",
        gpu_memory_bytes=80 * GiB,
        utilization=0.9,
        weight_bytes=13 * 10**9,
    )
    free = int(80 * GiB * 0.9) - 13 * 10**9
    assert p.free_bytes == free
    assert p.policies["paged"].max_sequences == free // (2 * GiB)
    assert p.max_tokens == free // (16 * p.bytes_per_token) * 16


def test_bad_input_is_named():
    with pytest.raises(BadInput, match="did you mean 'llama-2-7b'"):
        model_config.load_preset("llama2-7b")
    with pytest.raises(BadInput, match="num_hidden_layers, num_attention_heads"):
        model_config.from_dict({"model_type": "llama", "hidden_size": 8}, "x", "cfg.json")
    with pytest.raises(BadInput, match="'fp6' is not a supported KV dtype"):
        kvmath.kv_format("fp6")
    with pytest.raises(BadInput, match="--seq-len: 0 must be > 0"):
        kvmath.plan(model_config.load_preset("llama-2-7b"), seq_len=0, batch=None, gpu_memory_bytes=GiB, weight_bytes=0)


def cli(*args):
    return CliRunner().invoke(main, ["kv-cache", *args], catch_exceptions=False)


def test_cli_table_json_and_list():
    result = cli(
        "--model", "llama-2-7b", "--seq-len", "4096", "--kv-dtype", "fp16", "--batch", "1", "--gpu-memory", "80"
    )
    assert result.exit_code == 0 and "2 GiB" in result.output and "naive" in result.output
    data = json.loads(cli("--model", "gpt-oss-20b", "--gpu-memory", "80GiB", "--json").output)
    assert data["policies"]["paged"]["max_sequences"] > data["policies"]["contiguous"]["max_sequences"]
    assert data["naive_vs_exact"] > 5
    listing = cli("--list").output
    assert all(name in listing for name in ("llama-3.1-70b", "deepseek-v3", "qwen2.5-7b", "gpt-oss-120b"))


def test_cli_reads_a_hugging_face_config(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(
        json.dumps(
            {
                "hidden_size": 1024,
                "num_hidden_layers": 2,
                "num_attention_heads": 8,
                "num_key_value_heads": 2,
                "vocab_size": 1000,
                "model_type": "llama",
            }
        )
    )
    data = json.loads(cli("--config", str(path), "--seq-len", "10", "--gpu-memory", "1", "--json").output)
    assert data["bytes_per_token"] == 2 * 2 * 2 * 128 * 2


@pytest.mark.parametrize(
    "args,fragment",
    [
        (["--model", "lama-2-7b"], "did you mean"),
        (["--model", "llama-2-7b", "--kv-dtype", "fp6"], "not a supported KV dtype"),
        (["--model", "llama-2-7b", "--seq-len", "-5"], "--seq-len: -5 must be > 0"),
        (["--model", "llama-2-7b", "--batch", "zero"], "--batch: 'zero' is not valid"),
        (["--model", "llama-2-7b", "--gpu-memory", "lots"], "--gpu-memory: 'lots' is not a size"),
        (["--config", "/no/such/config.json"], "no such config file"),
        ([], "give exactly one of --model"),
    ],
)
def test_cli_bad_input_exits_2(args, fragment):
    result = cli(*args)
    assert result.exit_code == 2 and fragment in result.output and "Traceback" not in result.output


def test_cli_names_missing_config_fields(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "deepseek_v3", "hidden_size": 1024, "kv_lora_rank": 512}))
    result = cli("--config", str(path))
    assert result.exit_code == 2
    assert "num_hidden_layers, num_attention_heads, qk_rope_head_dim, qk_nope_head_dim, v_head_dim" in result.output


# -- the technique: real allocations against the prediction ----------------------------------

from gpubench.contract import Measured  # noqa: E402
from gpubench.lib.kvstorage import same_bytes  # noqa: E402
from gpubench.reports import figures  # noqa: E402
from gpubench.techniques import kv_cache as technique  # noqa: E402
from gpubench.techniques.kv_cache import server_memory as kv_server_memory  # noqa: E402
from gpubench.techniques.kv_cache.allocation import KVCacheWorkload  # noqa: E402


def build(**params):
    full = {**technique.TECHNIQUE.defaults(), "max_len": 200, **params}
    return technique.build(full, torch.device("cpu"), seed=3)


@pytest.mark.parametrize(
    "model,kv_dtype",
    [
        ("llama-2-7b", "bf16"),
        ("llama-3.1-8b", "fp8"),
        ("gpt-oss-20b", "bf16"),
        ("deepseek-v3", "int4"),
        ("mistral-7b-v0.1", "nvfp4"),
        ("qwen2.5-7b", "int8"),
        ("llama-2-7b", "fp32"),
    ],
)
def test_allocations_match_the_prediction_to_the_byte_and_read_back_exactly(model, kv_dtype):
    w = build(model=model, kv_dtype=kv_dtype, block_size=16)
    if model == "mistral-7b-v0.1":
        w = build(model=model, kv_dtype=kv_dtype, max_len=300)
    predicted = technique.reference(w)
    for variant in ("contiguous", "paged"):
        out = technique.TECHNIQUE.variants[variant].fn(w)
        result = technique.check(predicted, out)
        assert result.passed, result.detail
        assert out.storage_bytes() == predicted[out.cache.allocator]
    assert predicted["paged"] < predicted["contiguous"]


@pytest.mark.parametrize("block_size", [1, 7, 16, 32])
@pytest.mark.parametrize("model", ["llama-3.1-8b", "gpt-oss-20b"])  # gpt-oss: layer 0 slides (window 128)
def test_block_edge_lengths_allocate_what_the_calculator_predicts_per_sequence_and_read_back(model, block_size):
    w = build(model=model, block_size=block_size, max_len=300, lengths="edges")
    assert w.lengths == kvmath.block_edge_lengths(block_size, 300, w.layout.windows)
    predicted = technique.reference(w)
    for variant in ("contiguous", "paged"):
        out = technique.TECHNIQUE.variants[variant].fn(w)
        result = technique.check(predicted, out)
        assert result.passed, result.detail
    # Per sequence and layer, not only in total: the blocks held are the calculator's.
    cache = out.cache
    for layer, window in enumerate(w.layout.windows):
        for i, n in enumerate(w.lengths):
            expected = kvmath.window_blocks(n, window, block_size) if window else kvmath.blocks_for(n, block_size)
            assert len(cache.block_tables[layer][i]) == expected, (layer, n)


def test_edges_give_one_sequence_per_edge_length_whatever_requests_says():
    w = build(model="llama-3.1-8b", requests=2, max_len=100, block_size=16, lengths="edges")
    assert w.lengths == [1, 15, 16, 17, 31, 32, 33, 95, 96, 97, 99, 100] == [s.length for s in w.sequences]
    assert len(build(model="llama-3.1-8b", requests=2, max_len=100).lengths) == 2  # random: requests


def test_a_sequence_one_block_short_reads_back_missing_instead_of_raising():
    # A token with no block has no slot (vLLM's -1): it is never stored, and the check counts it
    # missing instead of the variant (or the check) dying with an IndexError.
    w = build(model="llama-3.1-8b", max_len=64, block_size=16, lengths="edges")
    out = technique.paged(w)
    i = w.lengths.index(32)
    out.cache.block_tables[0][i] = out.cache.block_tables[0][i][:1]
    assert out.cache.read(i, 0, 0, 32).values.shape[0] == 16
    result = technique.check(technique.reference(w), out)
    assert not result.passed and "16 tokens not stored" in result.detail and "at lengths [32]" in result.detail


def test_sliding_layers_hold_only_their_window_when_paged():
    w = technique.build(
        {**technique.TECHNIQUE.defaults(), "model": "gpt-oss-20b", "max_len": 2000, "requests": 2},
        torch.device("cpu"),
        seed=5,
    )
    out = technique.paged(w)
    sliding, full = out.cache.pools[0], out.cache.pools[1]  # gpt-oss: layer 0 slides (window 128)
    assert sliding.values.shape[0] * 16 <= 2 * (128 + 16) < full.values.shape[0] * 16


def test_check_catches_a_byte_off_and_a_misplaced_block():
    w = build(model="llama-2-7b")
    predicted = technique.reference(w)
    out = technique.paged(w)
    off = technique.check({**predicted, "paged": predicted["paged"] + 1}, out)
    assert not off.passed and off.error == 1.0
    table = out.cache.block_tables[0][0]
    if len(table) > 1:
        table[[0, 1]] = table[[1, 0]]  # swap two blocks of the first sequence
        assert "read-backs differ" in technique.check(predicted, out).detail


def test_metrics_report_reserved_holding_and_utilization():
    w = build(model="llama-2-7b")
    out = technique.contiguous(w)
    m = technique.metrics(w, Measured("contiguous", [1e-3], 1e-3, out, torch.device("cpu")))
    assert m["bytes_reserved"] == m["bytes_predicted"]
    assert m["utilization"] == pytest.approx(m["bytes_holding_tokens"] / m["bytes_reserved"])
    assert 0 < m["utilization"] < 1
    assert m["sequences"] == 4 and m["tokens"] == sum(w.lengths)


def test_serving_memory_fills_90_percent_of_a_gpu_with_copies_of_the_cases_sequences():
    """The breakdown: the whole model's weights over the GPUs they need, then as many copies of the
    case's sequences (all layers) as fit under 90% of the GPU; KV splits into bytes holding tokens
    and bytes reserved but empty, exactly as the calculator counts them; the parts sum to the GPU."""
    w = build(model="llama-2-7b", requests=3)  # 2 layers allocated; the breakdown is all 32
    full = preset_layout("llama-2-7b")
    weights = model_params.weight_bytes(model_config.load_preset("llama-2-7b")).bytes
    fitted = {}
    for variant in ("contiguous", "paged"):
        out = technique.TECHNIQUE.variants[variant].fn(w)
        m = technique.metrics(w, Measured(variant, [1e-3], 1e-3, out, torch.device("cpu")))
        one_copy = kvmath.cache_bytes(full, w.lengths, variant, 16, 200)
        copies = (int(80 * GiB * 0.9) - weights) // one_copy
        assert m["gpus"] == 1 and m["weights_per_gpu_gib"] == weights / GiB
        assert m["sequences_per_gpu"] == 3 * copies
        assert m["kv_holding_tokens_gib"] == copies * kvmath.token_bytes(full, w.lengths) / GiB
        assert m["kv_holding_tokens_gib"] + m["kv_reserved_but_empty_gib"] == pytest.approx(copies * one_copy / GiB)
        parts = ("weights_per_gpu_gib", "kv_holding_tokens_gib", "kv_reserved_but_empty_gib", "free_gib")
        assert sum(m[k] for k in parts) == pytest.approx(80.0)
        assert 8.0 <= m["free_gib"] < 8.0 + one_copy / GiB  # the 10% left, and less than one more copy
        assert m["gpu_memory_gib"] == 80.0 and "reference" in m["gpu_memory_source"]
        fitted[variant] = m["sequences_per_gpu"]
    assert fitted["paged"] > fitted["contiguous"]


def test_a_model_too_big_for_one_gpu_is_split_over_the_fewest_gpus_that_leave_room_for_kv():
    """DeepSeek-V3's 627 GiB: 8 GPUs of 80 GiB would hold 78 GiB each (no room under 72 GiB), so
    16; a case's own tp is kept when it already leaves room, and never lowered."""
    cfg = model_config.load_preset("deepseek-v3")
    assert kv_server_memory.gpus_for_weights(cfg, "bf16", 1, 80 * GiB) == 16
    assert kv_server_memory.gpus_for_weights(cfg, "bf16", 32, 80 * GiB) == 32
    assert kv_server_memory.gpus_for_weights(model_config.load_preset("llama-3.1-8b"), "bf16", 1, 80 * GiB) == 1
    w = build(model="deepseek-v3")
    m = kv_server_memory.serving_memory(w.device, w.params, w.lengths, "paged")
    room = kv_server_memory.UTILIZATION - kv_server_memory.KV_ROOM
    assert m["gpus"] == 16 and m["weights_per_gpu_gib"] <= room * 80
    assert m["kv_holding_tokens_gib"] > 0.1 * 80


def test_workload_is_typed_and_seeded():
    a, b = build(model="llama-2-7b"), build(model="llama-2-7b")
    assert isinstance(a, KVCacheWorkload) and a.lengths == b.lengths and len(a.sequences) == 4
    assert all(same_bytes(x.layers[0].values, y.layers[0].values) for x, y in zip(a.sequences, b.sequences))
    assert [s.length for s in a.sequences] == a.lengths and a.layout.num_layers == 2


def _real_case(model):
    """A case record as the runner writes it, with the metrics this technique computes."""
    w = build(model=model)
    variants = {}
    for name, role in (("contiguous", "baseline"), ("paged", "optimized")):
        out = technique.TECHNIQUE.variants[name].fn(w)
        metrics = technique.metrics(w, Measured(name, [1e-3], 1e-3, out, torch.device("cpu")))
        variants[name] = {"role": role, "stats": {"median": 1e-3}, "metrics": metrics}
    return {"technique": "kv_cache", "params": w.params, "variants": variants}


def test_plots_draw_measured_vs_predicted_bytes_and_a_stacked_gpu_breakdown_per_variant():
    cases = [_real_case("llama-2-7b"), _real_case("gpt-oss-20b")]
    bytes_plot, breakdown_plot = technique.TECHNIQUE.plots
    fig = figures.declared(bytes_plot, cases)
    assert len(fig.axes) == 2  # a panel per case
    for ax, case in zip(fig.axes, cases):
        heights = sorted(round(p.get_height(), 6) for p in ax.patches)
        expected = sorted(
            round(case["variants"][v]["metrics"][k] / 2**20, 6)
            for v in ("contiguous", "paged")
            for k in ("bytes_reserved", "bytes_predicted")
        )
        assert heights == expected  # both allocators, measured beside predicted, in MiB
    fig = figures.declared(breakdown_plot, cases)
    ax = fig.axes[0]
    assert len(ax.patches) == 2 * 2 * 4  # cases x variants x (weights, KV holding tokens, KV empty, free)
    assert [t.get_text() for t in fig.legends[0].get_texts()] == [
        "weights per GPU",
        "KV holding tokens",
        "KV reserved but empty",
        "free",
    ]
    # each variant's bar stacks to the GPU's memory
    ends = {}
    for p in ax.patches:
        ends[p.get_y()] = max(ends.get(p.get_y(), 0.0), p.get_x() + p.get_width())
    assert all(end == pytest.approx(80.0) for end in ends.values())
    assert figures.declared(bytes_plot, []) is None and figures.declared(breakdown_plot, []) is None


def test_variants_named_by_allocator_and_registered():
    from gpubench import techniques

    assert techniques.get("kv_cache") is technique.TECHNIQUE and technique.TECHNIQUE.incomplete() == []
    assert technique.TECHNIQUE.playing("baseline", torch.device("cpu")).name == "contiguous"
    assert technique.TECHNIQUE.playing("optimized", torch.device("cpu")).name == "paged"
    assert technique.TECHNIQUE.figures_fn is None


def test_chunked_layers_hold_only_the_last_tokens_chunk():
    """Llama-4's chunked local attention (chunk 8,192, blocks of 16): at 8,192 tokens the last token
    is the chunk's last, all 512 blocks held; one token more starts a new chunk (1 block); at
    8,200 the new chunk spans 8,192 .. 8,199, inside block 512 (1 block). Live tokens follow the
    same chunk, and a contiguous ring keeps a chunk of slots."""
    assert kvmath.chunk_blocks(8192, 8192, 16) == 512
    assert kvmath.chunk_blocks(8193, 8192, 16) == 1 and kvmath.chunk_blocks(8200, 8192, 16) == 1
    assert kvmath.chunk_blocks(8210, 8192, 16) == 2 and kvmath.chunk_blocks(100, 8192, 16) == 7
    assert kvmath.live_tokens((None, 8192), 8193) == 1 and kvmath.live_tokens((None, 8192), 8192) == 8192
    assert kvmath.layer_slots(None, 20000, "contiguous_ring", 16, 20000, chunk=8192) == 8192
    raw = {
        "hidden_size": 512,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 1,
        "head_dim": 128,
        "model_type": "llama4_text",
        "attention_chunk_size": 64,
    }
    layout = kvmath.layout_for(model_config.from_dict(raw, "l4", "test"), "bf16")
    assert layout.spans == ((None, 64), (None, 64), (None, 64), (None, None))
    per_token_layer = 2 * 1 * 128 * 2
    # 100 tokens, block 16: chunked layers hold positions 64..99 (blocks 4..6: 3), the full one 7 blocks
    assert kvmath.sequence_bytes(layout, 100, "paged", 16, 100) == (3 * 3 + 7) * 16 * per_token_layer
    assert kvmath.token_bytes(layout, [100]) == (3 * 36 + 100) * per_token_layer
