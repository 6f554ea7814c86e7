"""A technique's ``model`` param names a built-in size, a preset, a config.json or a checkpoint
directory: the Llama-style stand-in keeps the model's real shapes (head_dim from the config, GQA,
an MoE's active width), refuses MLA models and unknown names with what is allowed, records which
stand-in ran, and leaves the built-in sizes' behaviour (old scenarios) exactly as it was. The
serving pairs, packed_metadata and kv_cache take every form."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from gpubench.contract import Measured, Recorder
from gpubench.errors import BadInput
from gpubench.models import llama, stand_in
from gpubench.models.config import load_model
from gpubench.models.llama import SIZES, LlamaConfig, model_from, random_weights
from gpubench.techniques import continuous_batching, kv_cache, packed_metadata, paged_kv_serving

CPU = torch.device("cpu")
# Qwen3-0.6B's attention shapes at a tenth of the size: head_dim (32) is not hidden / heads (16).
QWEN3_LIKE = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "hidden_act": "silu",
    "hidden_size": 64,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "intermediate_size": 96,
    "vocab_size": 97,
    "max_position_embeddings": 512,
    "rope_theta": 1000000,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True,
    "use_sliding_window": False,
    "sliding_window": None,
    "max_window_layers": 3,
    "attention_bias": False,
    "torch_dtype": "bfloat16",
}
# A gpt-oss-like MoE config: 8 experts, top-2 of width 24, sliding windows on even layers.
MOE_LIKE = {
    "architectures": ["GptOssForCausalLM"],
    "model_type": "gpt_oss",
    "hidden_act": "silu",
    "hidden_size": 48,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 1,
    "head_dim": 16,
    "intermediate_size": 24,
    "num_local_experts": 8,
    "num_experts_per_tok": 2,
    "experts_per_token": 2,
    "vocab_size": 101,
    "max_position_embeddings": 512,
    "rope_theta": 150000,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": False,
    "attention_bias": True,
    "sliding_window": 8,
    "layer_types": ["sliding_attention", "full_attention"],
}


SMALL_WEIGHTS = random_weights(SIZES["tiny"], 0)


def write_config(folder: Path, raw: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "config.json"
    path.write_text(json.dumps(raw))
    return path


# -- the stand-in's config ------------------------------------------------------------------------


def test_from_model_keeps_the_configs_head_dim_heads_vocab_rope_and_tied_embeddings(tmp_path):
    cfg = load_model(write_config(tmp_path / "qwen3-like", QWEN3_LIKE))
    c = LlamaConfig.from_model(cfg)
    assert (c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim) == (64, 4, 2, 32)  # 4 x 32 != 64
    assert (c.num_layers, c.intermediate_size, c.vocab_size) == (3, 96, 97)
    assert (c.rope_theta, c.rms_eps, c.max_position, c.tie_word_embeddings) == (1e6, 1e-6, 512, True)
    assert LlamaConfig.from_model(cfg, layers=2).num_layers == 2


@pytest.mark.parametrize("name, width", [("gpt-oss-20b", 4 * 2880), ("llama-3.1-8b", 14336), ("qwen2.5-7b", 18944)])
def test_presets_take_their_published_shapes_and_an_moe_its_active_width(name, width):
    """gpt-oss-20b: 64 q / 8 kv heads of 64 (not 2880 / 64) and a dense MLP of top-4 x 2880."""
    cfg = load_model(name)
    c = LlamaConfig.from_model(cfg, layers=1)
    assert (c.num_heads, c.num_kv_heads, c.head_dim) == (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim)
    assert c.intermediate_size == width and c.num_layers == 1 and c.vocab_size == cfg.vocab_size


def test_the_active_width_adds_the_shared_experts():
    """Qwen2-MoE style: top_k routed experts plus the always-on shared one."""
    cfg = load_model("gpt-oss-20b")
    moe = replace(cfg.moe, top_k=2, expert_dim=100, shared_experts=1, shared_expert_dim=300)
    assert stand_in.active_mlp_width(replace(cfg, moe=moe)) == 2 * 100 + 300


def test_an_mla_model_is_refused_with_the_reason_and_what_is_allowed():
    with pytest.raises(BadInput) as exc:
        LlamaConfig.from_model(load_model("deepseek-v3"))
    text = str(exc.value)
    assert "multi-head latent attention" in text and "cannot hold" in text and "GQA" in text
    with pytest.raises(BadInput, match="latent"):
        model_from("deepseek-v3", 0, torch.float32, CPU, layers=1)


def test_more_layers_than_the_model_has_are_refused():
    with pytest.raises(BadInput, match=r"layers \(25\) exceeds gpt-oss-20b's 24 layers"):
        LlamaConfig.from_model(load_model("gpt-oss-20b"), layers=25)


# -- model_from ------------------------------------------------------------------------------------


def test_a_built_in_size_gives_the_weights_it_always_gave():
    """Default behaviour unchanged: model_from("tiny") is random_weights(SIZES["tiny"]) bit for bit,
    and layers N is that size with N layers (any number, as packed_metadata always allowed)."""
    for spec, layers in (("tiny", 0), ("small", 0), ("tiny", 3)):
        got = model_from(spec, 7, torch.float32, CPU, layers=layers)
        config = replace(SIZES[spec], num_layers=layers) if layers else SIZES[spec]
        want = random_weights(config, 7)
        assert got.config == config and got.source == "random"
        assert all(torch.equal(a, b) for a, b in zip(got.parameters(), want.parameters()))


def test_a_config_path_gives_seeded_random_weights_at_its_shapes_that_run(tmp_path):
    path = write_config(tmp_path / "qwen3-like", QWEN3_LIKE)
    weights = model_from(str(path), 3, torch.float32, CPU, layers=2)
    assert weights.config == LlamaConfig.from_model(load_model(path), 2)
    assert weights.layers[0].wq.shape == (4 * 32, 64) and weights.layers[0].wk.shape == (2 * 32, 64)
    assert weights.lm_head is weights.embed and "qwen3-like" in weights.source  # tied, as the config says
    again = model_from(str(path), 3, torch.float32, CPU, layers=2)
    assert all(torch.equal(a, b) for a, b in zip(weights.parameters(), again.parameters()))  # seeded
    tokens = torch.arange(5)
    logits = llama.forward(weights, tokens, tokens, lambda i, q, k, v: llama.causal_attention(q, k, v))
    assert logits.shape == (5, 97) and torch.isfinite(logits).all()


def test_a_preset_and_a_checkpoint_directory_without_weights_are_random_at_their_shapes(tmp_path, monkeypatch):
    folder = tmp_path / "ckpt"
    write_config(folder, QWEN3_LIKE)
    assert model_from(str(folder), 0, torch.float32, CPU).config.head_dim == 32
    # a preset's weights are drawn at its config's shapes (gpt-oss-20b's embedding alone is 2.3 GB:
    # the config they are drawn at is what is checked here)
    drawn = []
    monkeypatch.setattr(llama, "random_weights", lambda config, *a: drawn.append(config) or SMALL_WEIGHTS)
    assert model_from("gpt-oss-20b", 0, torch.float32, CPU, layers=1) is SMALL_WEIGHTS
    assert drawn == [LlamaConfig.from_model(load_model("gpt-oss-20b"), 1)]


def test_a_checkpoint_directory_with_weights_still_loads_them(tmp_path, monkeypatch):
    """A directory holding weights goes to load_hf, as before; ``layers`` keeps its first ones."""
    folder = tmp_path / "ckpt"
    write_config(folder, QWEN3_LIKE)
    (folder / "model.safetensors").write_bytes(b"")
    loaded = replace(random_weights(replace(SIZES["tiny"], num_layers=3), 0), source=str(folder))
    calls = []
    monkeypatch.setattr(llama, "load_hf", lambda path, dtype, device: calls.append(path) or loaded)
    got = model_from(str(folder), 0, torch.float32, CPU, layers=2)
    assert calls == [str(folder)] and got.config.num_layers == 2 and got.layers == loaded.layers[:2]
    with pytest.raises(BadInput, match=r"layers \(4\) exceeds"):
        model_from(str(folder), 0, torch.float32, CPU, layers=4)
    # packed_metadata trains from seeded weights: the same directory is a config to it
    assert stand_in.resolve(str(folder), weights=False).kind == "config"


def test_an_unknown_model_names_every_form_allowed():
    with pytest.raises(BadInput) as exc:
        model_from("llama-9z", 0, torch.float32, CPU)
    text = str(exc.value)
    assert "'llama-9z'" in text and "tiny, small, 100m, 1b" in text and "gpt-oss-20b" in text
    assert "config.json" in text and "checkpoint directory" in text


def test_a_broken_config_file_is_named_by_its_own_error(tmp_path):
    path = tmp_path / "config.json"
    path.write_text("{not json")
    assert "not a readable JSON config" in stand_in.model_problems(str(path))[0]


def test_the_built_in_size_names_are_the_decoders_and_the_module_is_torch_free():
    assert stand_in.BUILT_IN_SIZES == tuple(SIZES)
    code = "import sys, gpubench.models.stand_in; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    assert out.stdout.strip() == "False"


# -- what a case records ---------------------------------------------------------------------------


def test_the_stand_in_note_says_shapes_layers_moe_and_windows(tmp_path):
    note = stand_in.stand_in_note(load_model("gpt-oss-20b"), layers=2)
    assert note.startswith("Llama-style stand-in at gpt-oss-20b's attention shapes (GQA 64 q / 8 kv heads x 64")
    assert "2 of 24 layers" in note and "seeded random weights" in note
    assert "MoE as a dense MLP of the active width (top-4 x 2880 = 11520" in note
    assert "sliding windows not applied (window 128 on 1 of the 2 layers run)" in note
    dense = stand_in.stand_in_note(load_model("llama-3.1-8b"))
    assert "32 of 32 layers" in dense and "MoE" not in dense and "sliding" not in dense


# -- the techniques ------------------------------------------------------------------------------

SERVING_SMALL = {
    "requests": 4,
    "arrival": "all",
    "prompt_len": "uniform:4:8",
    "output_len": "uniform:2:6",
    "max_len": 16,
    "kv_budget_mib": 0.05,
    "max_batch": 4,
}


@pytest.mark.parametrize("module", [continuous_batching, paged_kv_serving])
def test_serving_runs_a_config_at_its_shapes_and_records_the_stand_in(module, tmp_path):
    """A config.json's stand-in, its first layer only, passes the token check in both engines,
    and the metrics say which stand-in ran."""
    T = module.TECHNIQUE
    path = write_config(tmp_path / "moe-like", MOE_LIKE)
    params = {**T.defaults(), **SERVING_SMALL, "model": str(path), "layers": 1}
    assert T.validate_fn(params) == []
    w = T.build_fn(params, CPU, 0)
    assert w.weights.config.num_layers == 1 and w.weights.config.intermediate_size == 2 * 24
    ref = T.reference_fn(w)
    for name in T.variants:
        rec = Recorder()
        out = T.variants[name].call(w, rec)
        assert T.check_fn(ref, out).passed
        m = T.metrics_fn(w, Measured(name, [0.1], 0.1, out, CPU, records=[rec.values]))
        assert m["model_layers"] == 1
        assert m["model_note"].startswith("Llama-style stand-in at moe-like's attention shapes")
        assert "1 of 2 layers" in m["model_note"] and "active width" in m["model_note"]


def test_serving_defaults_are_todays_and_record_no_stand_in():
    """Old scenarios measure the same thing: tiny, all its layers, no note."""
    T = continuous_batching.TECHNIQUE
    assert (T.defaults()["model"], T.defaults()["layers"]) == ("tiny", 0)
    w = T.build_fn({**T.defaults(), **SERVING_SMALL}, CPU, 0)
    assert w.weights.config == SIZES["tiny"] and w.model_note == ""


@pytest.mark.parametrize(
    "model, layers, words",
    [
        ("no-such-model", 0, "allowed: a built-in size (tiny, small, 100m, 1b), a preset"),
        ("deepseek-v3", 0, "multi-head latent attention"),
        ("gpt-oss-20b", 30, "layers (30) exceeds gpt-oss-20b's 24 layers"),
    ],
)
def test_serving_and_packed_metadata_refuse_a_model_they_cannot_run(model, layers, words):
    for T in (continuous_batching.TECHNIQUE, paged_kv_serving.TECHNIQUE, packed_metadata.TECHNIQUE):
        problems = T.validate_fn({**T.defaults(), "model": model, "layers": layers})
        assert any(words in p for p in problems), (T.name, problems)


def test_the_model_param_is_an_open_string_in_the_catalogue():
    """A preset or a path is not a choice list: the param takes any string, and its own rules
    (the technique's validate) check it."""
    for T in (continuous_batching.TECHNIQUE, paged_kv_serving.TECHNIQUE, packed_metadata.TECHNIQUE):
        assert T.param("model").choices is None and T.param("layers").min == 0
        assert "preset" in T.param("model").help and "config.json" in T.param("model").help
    assert kv_cache.TECHNIQUE.param("model").choices is None


def test_packed_metadata_trains_a_presets_stand_in_and_records_it(tmp_path):
    """packed_metadata at a config's shapes (head_dim 32 of hidden 64): both variants bitwise the
    per_layer step and each document alone; FLOPs from the stand-in's parameters; the note."""
    T = packed_metadata.TECHNIQUE
    path = write_config(tmp_path / "qwen3-like", QWEN3_LIKE)
    params = {**T.defaults(), "model": str(path), "layers": 2, "rows": 1, "seq_len": 32, "mean_doc_len": 8}
    assert T.validate_fn(params) == []
    w = T.build_fn(params, CPU, 0)
    assert w.config == LlamaConfig.from_model(load_model(path), 2)
    ref = T.reference_fn(w)
    for name in ("per_layer", "cached"):
        w.reset()
        rec = Recorder()
        out = T.variants[name].call(w, rec)
        assert T.check_fn(ref, out).passed
        m = T.metrics_fn(w, Measured(name, [0.01], 0.01, out, CPU, records=[rec.values]))
        assert m["flops"] == 6 * (w.config.num_params()) * 32  # tied: the embedding is the head's matmul
        assert "qwen3-like" in m["model_note"] and "2 of 3 layers" in m["model_note"]


def test_packed_metadata_defaults_are_todays():
    T = packed_metadata.TECHNIQUE
    w = T.build_fn({**T.defaults(), "rows": 1, "seq_len": 32, "mean_doc_len": 8}, CPU, 0)
    assert w.config == SIZES["tiny"]
    w4 = T.build_fn({**T.defaults(), "layers": 4, "rows": 1, "seq_len": 32, "mean_doc_len": 8}, CPU, 0)
    assert w4.config == replace(SIZES["tiny"], num_layers=4)  # a built-in size takes any layer count
    m = T.metrics_fn(w, Measured("cached", [0.01], 0.01, None, CPU))
    assert "model_note" not in m


def test_kv_cache_allocates_a_config_json_layout(tmp_path):
    """kv_cache's model may be a config.json: its layout (head_dim 16, one KV head, window 8 on
    layer 0) allocated and checked to the byte; an unknown name is refused naming the presets."""
    T = kv_cache.TECHNIQUE
    path = write_config(tmp_path / "moe-like", MOE_LIKE)
    params = {**T.defaults(), "model": str(path), "max_len": 64}
    assert T.validate_fn(params) == []
    w = T.build_fn(params, CPU, 0)
    assert w.layout.num_layers == 2
    predicted = T.reference_fn(w)
    for name in ("contiguous", "paged"):
        out = T.variants[name].fn(w)
        assert T.check_fn(predicted, out).passed
    problems = T.validate_fn({**T.defaults(), "model": "llama-9z"})
    assert problems and "presets:" in problems[0] and "config.json" in problems[0]


def test_the_serve_command_runs_a_configs_first_layers_and_says_which_stand_in(tmp_path):
    """`gpubench serve --model config.json --layers 1`: the stand-in's first layer serves the
    trace; the JSON names the layers and the stand-in; more layers than the model has is exit 2."""
    from click.testing import CliRunner

    from gpubench.cli import main

    path = write_config(tmp_path / "moe-like", MOE_LIKE)
    args = ["serve", "--model", str(path), "--requests", "3", "--arrival", "all", "--prompt-len", "fixed:4"]
    args += ["--output-len", "fixed:3", "--max-len", "16", "--engine", "continuous+paged", "--device", "cpu"]
    result = CliRunner().invoke(main, [*args, "--layers", "1", "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert doc["layers"] == 1 and "moe-like's attention shapes" in doc["model_note"]
    assert doc["engines"]["continuous+paged"]["requests"] == 3
    result = CliRunner().invoke(main, [*args, "--layers", "3"])
    assert result.exit_code == 2 and "layers (3) exceeds moe-like's 2 layers" in result.output


def test_the_note_names_dense_layers_of_an_moe_and_chunked_layers(tmp_path):
    """Qwen2-MoE style (MoE on every second layer, a shared expert): the active width adds the
    shared expert and the note says the dense layers take it too; chunked layers are named."""
    qwen_moe = {  # as Qwen2-MoE publishes: no head_dim (hidden / heads) and no attention_bias field
        **{k: v for k, v in QWEN3_LIKE.items() if k not in ("head_dim", "attention_bias")},
        "architectures": ["Qwen2MoeForCausalLM"],
        "model_type": "qwen2_moe",
        "num_hidden_layers": 4,
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 16,
        "shared_expert_intermediate_size": 40,
        "decoder_sparse_step": 2,
    }
    cfg = load_model(write_config(tmp_path / "qwen-moe", qwen_moe))
    assert LlamaConfig.from_model(cfg).intermediate_size == 2 * 16 + 40
    note = stand_in.stand_in_note(cfg)
    assert "top-2 x 16 + 1 shared x 40 = 72" in note and "2 of the 4 layers run are dense in the model" in note
    llama4 = {  # Llama-4 style: RoPE layers chunked, every 4th a NoPE layer with full attention
        "architectures": ["Llama4ForCausalLM"],
        "model_type": "llama4_text",
        "hidden_act": "silu",
        "hidden_size": 64,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "intermediate_size": 32,
        "intermediate_size_mlp": 64,
        "num_local_experts": 4,
        "num_experts_per_tok": 1,
        "interleave_moe_layer_step": 1,
        "vocab_size": 97,
        "max_position_embeddings": 512,
        "rope_theta": 500000,
        "rms_norm_eps": 1e-5,
        "attention_chunk_size": 16,
        "no_rope_layers": [1, 1, 1, 0],
    }
    note = stand_in.stand_in_note(load_model(write_config(tmp_path / "llama4-like", llama4)))
    assert "chunked attention not applied (chunk 16 on 3 of the 4 layers run)" in note
    assert "top-1 x 32 + 1 shared x 32 = 64" in note


@pytest.mark.parametrize("module", [kv_cache, packed_metadata, paged_kv_serving, continuous_batching])
def test_ignore_fields_carries_the_users_word_into_each_techniques_rules(tmp_path, module):
    """A config with a field the reader does not know: refused by the technique's rules, accepted
    with ignore_fields naming it (comma-separated: more than one), as `run --model --ignore-field`
    writes it."""
    raw = {
        "model_type": "llama",
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "intermediate_size": 128,
        "vocab_size": 96,
        "max_position_embeddings": 256,
        "odd_one": 1,
        "odd_two": 2,
    }
    path = tmp_path / "config.json"
    path.write_text(json.dumps(raw))
    tech = module.TECHNIQUE
    params = {**tech.defaults(), "model": str(path), "layers": 1}
    assert any("odd_one" in p for p in tech.validate_fn(params))
    assert tech.validate_fn({**params, "ignore_fields": "odd_one, odd_two"}) == []
    assert stand_in.ignore_list(" odd_one, ,odd_two") == ("odd_one", "odd_two")


def test_a_checkpoint_the_loader_refuses_is_refused_when_the_scenario_loads(tmp_path):
    """A checkpoint directory with weights whose config load_hf refuses (Qwen2's biases) is a
    problem of the model param itself, found torch-free before any case runs."""
    folder = tmp_path / "qwen2-ckpt"
    write_config(folder, {**QWEN3_LIKE, "model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"]})
    (folder / "model.safetensors").write_bytes(b"")
    problems = stand_in.model_problems(str(folder))
    assert problems and "qwen2" in problems[0] and "bias" in problems[0]
    llama = tmp_path / "llama-ckpt"
    write_config(llama, {**QWEN3_LIKE, "model_type": "llama", "architectures": ["LlamaForCausalLM"]})
    (llama / "model.safetensors").write_bytes(b"")
    assert stand_in.model_problems(str(llama)) == []
