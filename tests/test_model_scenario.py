"""`gpubench run --model`'s generator (gpubench.run.model_scenario): small configs of five families
written here, each checked for the entries it gets at its own shapes, the techniques it does not
get with their reason, the sizing to the device, and validation through the ordinary loader."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpubench.errors import BadInput
from gpubench.models.config import load_model
from gpubench.run import model_scenario as ms
from gpubench.run import scenario as scenariomod

GIB = 2**30
BIG = 64 * GIB  # memory where nothing at these sizes needs shrinking

LLAMA = {
    "model_type": "llama",
    "hidden_size": 256,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 512,
    "vocab_size": 512,
    "max_position_embeddings": 2048,
    "torch_dtype": "bfloat16",
}
QWEN3_MOE = {
    "model_type": "qwen3_moe",
    "hidden_size": 256,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "intermediate_size": 512,
    "moe_intermediate_size": 128,
    "num_experts": 8,
    "num_experts_per_tok": 2,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
    "vocab_size": 512,
    "max_position_embeddings": 4096,
}
GPT_OSS = {  # gpt-oss-like: sliding and full layers alternating, every layer MoE
    "model_type": "gpt_oss",
    "hidden_size": 256,
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "layer_types": ["sliding_attention", "full_attention"] * 2,
    "sliding_window": 32,
    "num_local_experts": 8,
    "experts_per_token": 2,
    "num_experts_per_tok": 2,
    "intermediate_size": 128,
    "vocab_size": 512,
    "max_position_embeddings": 4096,
}
DEEPSEEK = {  # DeepSeek-like MLA: q/k 96 + 32 = 128, v 64; layer 0 dense, one shared expert
    "model_type": "deepseek_v3",
    "hidden_size": 256,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "kv_lora_rank": 64,
    "qk_rope_head_dim": 32,
    "qk_nope_head_dim": 96,
    "v_head_dim": 64,
    "n_routed_experts": 8,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 128,
    "first_k_dense_replace": 1,
    "n_shared_experts": 1,
    "intermediate_size": 512,
    "vocab_size": 512,
    "max_position_embeddings": 4096,
}
LLAMA4 = {  # Llama-4-like: RoPE layers chunked (layers 0-2), every 4th a NoPE full layer
    "model_type": "llama4_text",
    "hidden_size": 256,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "attention_chunk_size": 64,
    "num_local_experts": 4,
    "num_experts_per_tok": 1,
    "intermediate_size": 128,
    "interleave_moe_layer_step": 1,
    "vocab_size": 512,
    "max_position_embeddings": 4096,
}
FAMILIES = {"llama": LLAMA, "qwen3_moe": QWEN3_MOE, "gpt_oss": GPT_OSS, "deepseek": DEEPSEEK, "llama4": LLAMA4}


def config_file(tmp_path: Path, raw: dict, name: str = "config.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(raw))
    return path


def generate(tmp_path, raw, workload="both", device="cpu", memory=BIG, supported_only=False, **kw):
    path = config_file(tmp_path, raw, f"{raw['model_type']}.json")
    cfg = load_model(path)
    return ms.build_model_scenario(
        cfg,
        workload,
        kw.pop("seq_len", None),
        kw.pop("batch", None),
        device,
        memory,
        kw.pop("draft", None),
        spec=kw.pop("spec", str(path)),
        supported_only=supported_only,
    )


def entries(doc, technique):
    return [e for e in doc["entries"] if e["technique"] == technique]


def reason(doc, technique):
    found = [n["reason"] for n in doc["model"]["not_applicable"] if n["technique"] == technique]
    return found[0] if found else None


def test_llama_gets_every_dense_technique_at_its_own_shapes(tmp_path):
    doc = generate(tmp_path, LLAMA)
    (flash,) = entries(doc, "flash_attention")
    assert flash["params"] | {} == {
        "batch": 1,
        "heads": 4,
        "kv_heads": 2,
        "seq_len": 256,
        "head_dim": 64,
        "dtype": "float32",
        "causal": True,
        "mode": ["forward", "train"],
    }
    assert flash["note"] == "full-attention layers (4 of 4)"
    (paged,) = entries(doc, "paged_attention")
    assert paged["params"]["context_len"] == 256 and paged["params"]["kv_heads"] == 2
    offload = entries(doc, "activation_offload")[0]["params"]
    assert (offload["hidden"], offload["heads"], offload["kv_heads"], offload["head_dim"]) == (256, 4, 2, 64)
    assert (offload["intermediate"], offload["vocab"]) == (512, 512)
    model_path = str((tmp_path / "llama.json").resolve())
    packed = entries(doc, "packed_metadata")[0]["params"]
    assert packed["model"] == model_path and packed["layers"] == 0  # the whole model fits
    assert entries(doc, "kv_cache")[0]["params"]["model"] == model_path
    for serving in ("paged_kv_serving", "continuous_batching"):
        params = entries(doc, serving)[0]["params"]
        assert params["model"] == model_path and params["layers"] == 2
    assert reason(doc, "moe_grouping") == "no MoE layers"
    assert "no MoE layers" in reason(doc, "combined_training")
    assert "acceptance depends on the model's weights" in reason(doc, "speculative_decoding")
    assert doc["model"]["family"] == "llama" and doc["model"]["workload"] == "both"
    assert doc["model"]["summary"].startswith("4 layers; GQA 4 q / 2 kv heads x 64")


def test_every_technique_is_either_measured_or_listed_with_a_reason(tmp_path):
    for raw in FAMILIES.values():
        for workload in ms.WORKLOADS:
            doc = generate(tmp_path, raw, workload)
            measured = {e["technique"] for e in doc["entries"]}
            skipped = {n["technique"] for n in doc["model"]["not_applicable"]}
            assert measured | skipped == set(ms.TECHNIQUES), (raw["model_type"], workload)
            assert not measured & skipped, (raw["model_type"], workload)
            assert all(n["reason"] for n in doc["model"]["not_applicable"])


def test_workload_picks_the_training_or_serving_techniques_and_flash_attentions_mode(tmp_path):
    train = generate(tmp_path, LLAMA, "train")
    serve = generate(tmp_path, LLAMA, "serve")
    assert entries(train, "flash_attention")[0]["params"]["mode"] == "train"
    assert entries(serve, "flash_attention")[0]["params"]["mode"] == "forward"
    assert not entries(train, "paged_attention") and "--workload train" in reason(train, "paged_attention")
    assert not entries(serve, "packed_metadata") and "--workload serve" in reason(serve, "packed_metadata")
    assert {e["technique"] for e in train["entries"]} <= set(ms.TRAIN)
    assert {e["technique"] for e in serve["entries"]} <= set(ms.SERVE)


def test_gpt_oss_like_sliding_layers_get_their_own_attention_entries(tmp_path):
    doc = generate(tmp_path, GPT_OSS)
    sliding, full = entries(doc, "flash_attention")
    assert "window" not in full["params"] and full["note"] == "full-attention layers (2 of 4) at 256 tokens"
    assert sliding["params"]["window"] == 32 and sliding["note"] == "sliding layers (2 of 4), window 32"
    assert sliding["params"]["heads"] == 8 and sliding["params"]["kv_heads"] == 2
    paged_sliding, paged_full = entries(doc, "paged_attention")
    assert paged_full["params"]["context_len"] == 256
    assert paged_sliding["params"]["context_len"] == 32 and "window 32" in paged_sliding["note"]
    (moe,) = entries(doc, "moe_grouping")
    assert moe["params"] | {} == {
        "experts": 8,
        "top_k": 2,
        "hidden": 256,
        "expert_dim": 128,
        "tokens": 256,
        "dtype": "float32",
    }
    assert "activation differs" not in moe["note"]  # the layer is gpt-oss's own
    assert entries(doc, "combined_training")[0]["params"]["experts"] == 8
    (packed,) = entries(doc, "packed_metadata")  # a Llama-style stand-in, its MLP the active width
    assert "MoE MLP as a dense one of the active width (256)" in packed["note"]
    assert "sliding 32 on 2 layers" in doc["model"]["summary"]


def test_a_window_at_least_the_sequence_attends_as_a_full_layer(tmp_path):
    doc = generate(tmp_path, GPT_OSS, seq_len=32)
    (flash,) = entries(doc, "flash_attention")
    assert "window" not in flash["params"] and flash["note"] == "full-attention layers (4 of 4)"


def test_qwen3_moe_notes_that_its_activation_is_not_the_measured_layers(tmp_path):
    doc = generate(tmp_path, QWEN3_MOE)
    (moe,) = entries(doc, "moe_grouping")
    assert (moe["params"]["experts"], moe["params"]["top_k"], moe["params"]["expert_dim"]) == (8, 2, 128)
    assert "qwen3_moe's experts use silu" in moe["note"] and "activation differs" in moe["note"]
    assert entries(doc, "combined_training") and entries(doc, "paged_kv_serving")
    assert "active width (256)" in entries(doc, "paged_kv_serving")[0]["note"]  # top-2 x 128


def test_deepseek_like_mla_prefill_dims_and_latent_cache_reasons(tmp_path):
    doc = generate(tmp_path, DEEPSEEK)
    (flash,) = entries(doc, "flash_attention")
    params = flash["params"]
    assert (params["heads"], params["kv_heads"], params["head_dim"], params["head_dim_v"]) == (4, 4, 128, 64)
    assert "MLA prefill" in flash["note"]
    for technique in ("paged_attention", "paged_kv_serving", "continuous_batching"):
        assert "MLA" in reason(doc, technique) and "latent" in reason(doc, technique)
    (moe,) = entries(doc, "moe_grouping")
    assert "MoE layers (3 of 4)" in moe["note"] and "1 shared expert(s)" in moe["note"]
    assert entries(doc, "kv_cache")  # the calculator knows MLA's latent cache


def test_llama4_like_chunked_layers_get_their_own_attention_entry(tmp_path):
    doc = generate(tmp_path, LLAMA4)
    chunked, full = entries(doc, "flash_attention")
    assert chunked["params"]["chunk"] == 64 and chunked["note"] == "chunked layers (3 of 4), chunk 64"
    assert "chunk" not in full["params"] and full["note"].startswith("full-attention layers (1 of 4)")
    paged_chunked = entries(doc, "paged_attention")[0]
    assert paged_chunked["params"]["context_len"] == 64 and "its own chunk" in paged_chunked["note"]


def test_a_head_dim_the_kernels_do_not_take_is_not_applicable_with_why(tmp_path):
    doc = generate(tmp_path, {**LLAMA, "head_dim": 80})
    assert reason(doc, "flash_attention").startswith("head_dim 80: the kernels take head dims 32, 64")
    assert reason(doc, "paged_attention").startswith("head_dim 80: the paged decode kernel takes 64 or 128")


def test_dtype_is_bfloat16_on_cuda_and_float32_on_cpu_and_recorded(tmp_path):
    cuda = generate(tmp_path, LLAMA, device="cuda")
    cpu = generate(tmp_path, LLAMA, device="cpu")
    assert cuda["model"]["dtype"] == "bfloat16" and cpu["model"]["dtype"] == "float32"
    assert {e["params"].get("dtype") for e in cuda["entries"] if e["technique"] != "kv_cache"} == {"bfloat16"}
    assert entries(cuda, "kv_cache")[0]["params"]["kv_dtype"] == "bf16"
    assert cuda["policy"]["flush_l2"] is True and "flush_l2" not in cpu["policy"]


def test_defaults_follow_the_stated_rule(tmp_path):
    cuda = generate(tmp_path, LLAMA, device="cuda")
    assert (cuda["model"]["seq_len"], cuda["model"]["batch"]) == (2048, 4)  # min(max_position 2048, 4096)
    cpu = generate(tmp_path, LLAMA, device="cpu")
    assert (cpu["model"]["seq_len"], cpu["model"]["batch"]) == (256, 1)
    assert cpu["model"]["defaults"] == ms.DEFAULTS_RULE and "4096" in ms.DEFAULTS_RULE
    asked = generate(tmp_path, LLAMA, seq_len=128, batch=2)
    assert entries(asked, "flash_attention")[0]["params"]["seq_len"] == 128
    assert entries(asked, "moe_grouping") == [] and asked["model"]["batch"] == 2


def test_a_small_device_measures_fewer_layers_and_says_so(tmp_path):
    roomy = generate(tmp_path, LLAMA, device="cuda", memory=BIG)
    assert entries(roomy, "kv_cache")[0]["params"]["layers"] == 0
    assert "kv_cache: the whole model (4 layers) allocated" in roomy["model"]["sizing"]
    # 2 x 2 kv heads x 64 x 2 B x 16 requests (at least 16) x 2048 tokens = 16 MiB a layer, 3 copies:
    # 48 MiB; 60% of 160 MiB holds 2
    small = generate(tmp_path, LLAMA, device="cuda", memory=160 * 2**20)
    params = entries(small, "kv_cache")[0]["params"]
    assert params["layers"] == 2 and params["requests"] == ms.KV_MIN_REQUESTS
    assert any(line.startswith("kv_cache: the first 2 of 4 layers allocated") for line in small["model"]["sizing"])
    packed = entries(small, "packed_metadata")
    assert not packed or packed[0]["params"]["layers"] < 4


def test_the_kv_cache_request_floor_gives_way_before_the_case_does(tmp_path):
    """kv_cache holds at least 16 requests, but where one layer of 16 does not fit, fewer (down to
    the batch) rather than no case, and the sizing says so."""
    # 2 x 2 kv heads x 64 x 2 B x 2048 tokens = 1 MiB a request a layer, 3 copies: 3 MiB; 60% of 20 MiB holds 4
    doc = generate(tmp_path, LLAMA, device="cuda", memory=20 * 2**20)
    params = entries(doc, "kv_cache")[0]["params"]
    assert params["requests"] == 4 and params["layers"] == 1
    assert any(line.startswith("kv_cache: 4 requests (not 16)") for line in doc["model"]["sizing"])


def test_what_does_not_fit_at_its_smallest_is_not_applicable_with_the_figure(tmp_path):
    doc = generate(tmp_path, QWEN3_MOE, device="cuda", memory=2**20)
    text = reason(doc, "moe_grouping")
    assert text.startswith("one MoE layer of 8 experts with their gradients (tokens 64) needs ") and "GiB, over" in text


def test_a_cpu_case_is_held_to_the_flop_cap(tmp_path):
    wide = {**LLAMA, "hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8}
    doc = generate(tmp_path, {**wide, "intermediate_size": 14336, "vocab_size": 32000}, device="cpu")
    for entry in entries(doc, "activation_offload"):
        p = entry["params"]
        assert p["layers"] == 1 or p["seq_len"] < 256  # shrunk to the cap
    notes = " ".join(doc["model"]["sizing"]) + " ".join(n["reason"] for n in doc["model"]["not_applicable"])
    assert "FLOPs a call" in notes


def test_speculative_decoding_needs_a_checkpoint_with_weights(tmp_path):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text(json.dumps(LLAMA))
    cfg = load_model(ckpt)
    with pytest.raises(BadInput, match="a draft model needs the target's weights"):
        ms.build_model_scenario(cfg, "serve", None, None, "cpu", BIG, "early:1", spec=str(ckpt))
    (ckpt / "model.safetensors").write_bytes(b"")
    doc = ms.build_model_scenario(cfg, "serve", None, None, "cpu", BIG, "early:1", spec=str(ckpt), supported_only=False)
    ngram, drafted = entries(doc, "speculative_decoding")
    assert ngram["params"]["target"] == str(ckpt.resolve()) and ngram["params"]["drafter"] == "ngram"
    assert drafted["params"]["drafter"] == "draft_model" and drafted["params"]["draft"] == "early:1"
    with pytest.raises(BadInput, match="a serving case"):
        ms.build_model_scenario(cfg, "train", None, None, "cpu", BIG, "early:1", spec=str(ckpt))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"workload": "inference"}, "--workload: 'inference' is not valid; allowed: train, serve, both"),
        ({"seq_len": 1}, "--seq-len: 1 is not valid; allowed: an integer >= 2"),
        ({"batch": 0}, "--batch: 0 is not valid; allowed: an integer >= 1"),
        ({"device": "tpu"}, "device 'tpu': a model scenario is built for cuda or cpu"),
    ],
)
def test_bad_requests_are_refused_with_what_is_allowed(tmp_path, kwargs, message):
    with pytest.raises(BadInput, match="^" + message.replace("(", r"\(").replace(")", r"\)")):
        generate(tmp_path, LLAMA, **kwargs)


def test_the_generated_scenario_loads_through_the_ordinary_parser(tmp_path):
    """Whatever this build supports: the generated mapping is a valid scenario, its model block
    and notes kept."""
    for family, raw in FAMILIES.items():
        doc = generate(tmp_path, raw, supported_only=True)
        scen = scenariomod.parse(ms.to_yaml(doc, "generated"), tmp_path / f"{family}.yaml")
        assert scen.model == doc["model"] and scen.device == "cpu"
        assert [e.note for e in scen.entries] == [e.get("note") for e in doc["entries"]]
        assert scen.to_dict()["model"]["summary"] == doc["model"]["summary"]
        assert "&id" not in ms.to_yaml(doc)  # no YAML anchors: every entry reads whole


def test_every_generated_entry_is_a_valid_entry_of_this_build(tmp_path):
    """The techniques take the model params the generator writes (issue 37: H2's model params,
    H3's window and chunk): nothing is left out for want of a param, and the whole mapping
    validates, the techniques' own cross-param rules included."""
    for family, raw in FAMILIES.items():
        for workload in ms.WORKLOADS:
            doc = generate(tmp_path, raw, workload, supported_only=False)
            scenariomod.parse(ms.to_yaml(doc), tmp_path / f"{family}-{workload}.yaml")
            kept = generate(tmp_path, raw, workload, supported_only=True)
            assert kept["entries"] == doc["entries"], (family, workload, kept["model"]["sizing"])


def test_entries_this_build_cannot_take_are_left_out_and_said(tmp_path, monkeypatch):
    """A technique older than a param the generator writes: its entry is dropped, not written
    into a scenario that would not load, and the reason is in the model block."""
    from gpubench.techniques import catalog

    real = catalog.declaration

    def without_window(name):
        declared = real(name)
        if name != "flash_attention" or declared is None:
            return declared
        import dataclasses

        changes = {"params": tuple(p for p in declared.params if p.name != "window")}
        if hasattr(declared, "benchmarks"):  # the registry's Technique: its window-128 size goes too
            changes["benchmarks"] = tuple(b for b in declared.benchmarks if "window" not in b.params)
        return dataclasses.replace(declared, **changes)

    monkeypatch.setattr(catalog, "declaration", without_window)
    doc = generate(tmp_path, GPT_OSS, supported_only=True)
    assert all("window" not in e["params"] for e in entries(doc, "flash_attention"))
    assert any(
        "flash_attention: the entry for sliding layers (2 of 4), window 32 is left out: "
        "this gpubench's flash_attention takes no window param" in line
        for line in doc["model"]["sizing"]
    )


def test_a_model_no_technique_applies_to_is_refused(tmp_path):
    odd = {**LLAMA, "head_dim": 80}  # no attention kernel takes it; 1 byte holds no training step
    with pytest.raises(BadInput, match="no technique applies to this model on cpu \\(--workload train\\)"):
        generate(tmp_path, odd, "train", memory=1)


# -- the scenario file's model block and entry note ----------------------------------------------------


def parse(text, tmp_path):
    return scenariomod.parse(text, tmp_path / "s.yaml")


ENTRY = "entries:\n  - technique: moe_grouping\n    params: {tokens: 8}\n"


def test_model_block_and_note_are_validated_like_every_key(tmp_path):
    with pytest.raises(BadInput) as err:
        parse(
            "name: x\nmodel:\n  name: m\n  workload: inference\n  seq_len: long\n  colour: red\n"
            "  not_applicable: [{technique: a}]\n" + ENTRY + "    note: [1]\n",
            tmp_path,
        )
    text = str(err.value)
    assert "s.yaml:4: model.workload: 'inference' is not valid; allowed: train, serve, both" in text
    assert "s.yaml:5: model.seq_len: 'long' is not valid; allowed: an integer" in text
    assert "s.yaml:6: model.colour: unknown key; allowed: name, source, family" in text
    assert "model.not_applicable[0]: must be a mapping {technique: NAME, reason: TEXT}" in text
    assert "moe_grouping.note: [1] is not valid; allowed: a string" in text
    with pytest.raises(BadInput, match="model: must be a mapping"):
        parse("name: x\nmodel: gpt\n" + ENTRY, tmp_path)


def test_a_scenario_without_model_block_is_unchanged(tmp_path):
    scen = parse("name: x\n" + ENTRY, tmp_path)
    assert scen.model is None and scen.entries[0].note is None
    assert "model" not in scen.to_dict() and "note" not in scen.to_dict()["entries"][0]
    noted = parse("name: x\nmodel: {name: m, workload: train}\n" + ENTRY + "    note: MoE layers (2 of 4)\n", tmp_path)
    assert noted.model == {"name": "m", "workload": "train"}
    assert noted.to_dict()["entries"][0]["note"] == "MoE layers (2 of 4)"


def test_each_case_finds_its_own_entrys_note_first(tmp_path):
    """The report gives a case the note of the first entry of its technique whose params it was
    drawn from: a sliding or chunked case must not be found under the full layers' entry, whose
    params leave window and chunk at their defaults (0)."""
    from gpubench.techniques import catalog

    for raw in (GPT_OSS, LLAMA4):
        doc = generate(tmp_path, raw)
        for i, entry in enumerate(doc["entries"]):
            declared = catalog.declaration(entry["technique"])
            defaults = {"window": 0, "chunk": 0, **(declared.defaults() if declared else {})}
            case = {**defaults, **{k: (v[0] if isinstance(v, list) else v) for k, v in entry["params"].items()}}
            first = next(
                e
                for e in doc["entries"]
                if e["technique"] == entry["technique"]
                and all(case.get(k) in (v if isinstance(v, list) else [v]) for k, v in e["params"].items())
            )
            assert first is entry, (raw["model_type"], i, entry.get("note"), first.get("note"))


def test_a_checkpoint_directory_gives_the_stand_in_entries_its_config_not_its_weights(tmp_path):
    """--model DIR (config.json and weights): the stand-in entries (packed, serving, kv_cache) name
    DIR/config.json, so they run seeded random weights at its shapes for the layers they are sized
    for instead of loading the whole checkpoint; only the speculative target names DIR."""
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text(json.dumps(LLAMA))
    (ckpt / "model.safetensors").write_bytes(b"")
    doc = ms.build_model_scenario(load_model(ckpt), "both", None, None, "cpu", BIG, spec=str(ckpt))
    stand_ins = [e for e in doc["entries"] if "model" in e["params"]]
    assert {e["technique"] for e in stand_ins} >= {"packed_metadata", "paged_kv_serving", "continuous_batching"}
    assert all(e["params"]["model"] == str((ckpt / "config.json").resolve()) for e in stand_ins)
    assert [e["params"]["target"] for e in entries(doc, "speculative_decoding")] == [str(ckpt.resolve())]


def test_every_generated_case_takes_enough_samples_to_be_ranked(tmp_path):
    """Each entry's policy (the scenario's, then the entry's own) asks for at least
    MIN_CI_SAMPLES samples: fewer get no confidence interval and the answer table never ranks them
    (continuous_batching at 2 runs, cuda steps at 3 did)."""
    from gpubench.records.stats import MIN_CI_SAMPLES

    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text(json.dumps(LLAMA))
    (ckpt / "model.safetensors").write_bytes(b"")
    for device in ms.DEVICES:
        doc = ms.build_model_scenario(load_model(ckpt), "both", None, None, device, BIG, spec=str(ckpt))
        for entry in doc["entries"]:
            policy = {**doc["policy"], **entry.get("policy", {})}
            assert policy["min_reps"] >= MIN_CI_SAMPLES, (device, entry["technique"], policy)
            assert policy["max_reps"] >= policy["min_reps"], (device, entry["technique"], policy)


def test_falcons_plain_mlp_stood_in_by_a_gated_one_says_its_extra_cost(tmp_path):
    """Falcon's MLP is up/down (cfg.gated_mlp False); the stand-in's is SwiGLU at the same width,
    1.5x the MLP's weights and FLOPs: the generated notes and the case's own note say so."""
    from gpubench.models import stand_in

    cfg = load_model("falcon-7b-instruct")
    assert cfg.gated_mlp is False
    doc = ms.build_model_scenario(cfg, "both", None, None, "cuda", 80 * GIB, spec="falcon-7b-instruct")
    stand_ins = [e for e in doc["entries"] if "model" in e["params"] and e["technique"] != "kv_cache"]
    assert stand_ins and all("1.5x its MLP weights and FLOPs" in e["note"] for e in stand_ins)
    assert "1.5x its MLP weights and FLOPs" in stand_in.stand_in_note(cfg, 2)
    assert "1.5x" not in stand_in.stand_in_note(load_model("llama-2-7b"), 2)


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        ({"model_type": "qwen2"}, "model_type 'qwen2' has bias terms on its q/k/v projections"),
        ({"model_type": "qwen3", "head_dim": 64}, "model_type 'qwen3' is not Llama-shaped; allowed: llama, mistral"),
        ({"model_type": "phi3"}, "model_type 'phi3' is not Llama-shaped"),
        ({"attention_bias": True}, "attention_bias set: the checkpoint has bias terms"),
        (
            {"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 8192}},
            "RoPE scaling 'llama3' is not supported (plain RoPE only)",
        ),
    ],
)
def test_speculative_decoding_is_not_applicable_where_the_target_loader_refuses(tmp_path, changes, words):
    """The speculative target is loaded by load_hf: a checkpoint it refuses (its own rules,
    stand_in.checkpoint_problems) is listed not applicable with those words, not generated."""
    from gpubench.models import stand_in

    raw = {**LLAMA, **changes}
    assert any(words in p for p in stand_in.checkpoint_problems(raw))
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text(json.dumps(raw))
    (ckpt / "model.safetensors").write_bytes(b"")
    doc = ms.build_model_scenario(load_model(ckpt), "serve", None, None, "cpu", BIG, spec=str(ckpt))
    assert entries(doc, "speculative_decoding") == []
    assert words in reason(doc, "speculative_decoding")


def test_load_hf_refuses_by_the_same_rule_before_loading_anything(tmp_path):
    """load_hf applies stand_in.checkpoint_problems to config.json first: the same words, and no
    weights read (there are none here)."""
    pytest.importorskip("torch")
    from gpubench.models.llama import load_hf

    (tmp_path / "config.json").write_text(json.dumps({**LLAMA, "model_type": "qwen3", "head_dim": 64}))
    with pytest.raises(BadInput, match="model_type 'qwen3' is not Llama-shaped; allowed: llama, mistral"):
        load_hf(tmp_path)


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        ({"hidden_size": 200, "num_attention_heads": 8, "num_key_value_heads": 8}, "head_dim 25 is odd"),
        ({"intermediate_size": None}, "the config has no intermediate_size"),
    ],
)
def test_an_entry_a_techniques_own_rules_refuse_is_not_applicable_with_the_rules_words(tmp_path, changes, words):
    """The techniques' cross-param rules (validate_fn) run on each generated entry: one they refuse
    is listed not applicable with the rule's words, and the rest loads through the ordinary parser
    (before, the whole scenario was refused as "a gpubench bug")."""
    raw = {**LLAMA, **changes}
    doc = generate(tmp_path, raw, supported_only=True)
    for technique in ("packed_metadata", "paged_kv_serving", "continuous_batching"):
        assert entries(doc, technique) == [] and words in reason(doc, technique), (technique, reason(doc, technique))
    assert doc["entries"]
    scenariomod.parse(ms.to_yaml(doc), tmp_path / "s.yaml")
