"""The strict config.json reader (gpubench.models.config + families): every family the KV
calculator knows, tested against the published configs shipped as presets; an unknown family or
field is refused naming it; absent fields take transformers' defaults and say so."""

from __future__ import annotations

import inspect
import json
import math

import pytest
from click.testing import CliRunner

from gpubench.cli import main
from gpubench.errors import BadInput
from gpubench.models import config as model_config
from gpubench.models import families
from gpubench.models import params as model_params

# Per preset, the published numbers (the config's own, read off the file by hand) the reader must
# reproduce: family, attention, query / KV heads, head_dim, sliding and chunked layer counts, MoE
# (experts, top-k, expert width, MoE layers, shared experts, shared width), the dense MLP width,
# MLA (kv_lora_rank, qk_rope_head_dim, q_lora_rank) and the activation as the family's MLP reads it.
EXPECTED = {
    "smollm2-135m": dict(
        family="llama", attention="GQA", heads=9, kv=3, head_dim=64, act="silu", dense=1536, tied=True
    ),
    "llama-2-7b": dict(family="llama", attention="MHA", heads=32, kv=32, head_dim=128, act="silu", dense=11008),
    "llama-2-70b": dict(family="llama", attention="GQA", heads=64, kv=8, head_dim=128, act="silu", dense=28672),
    "llama-3.1-8b": dict(family="llama", attention="GQA", heads=32, kv=8, head_dim=128, act="silu", dense=14336),
    "llama-3.1-70b": dict(family="llama", attention="GQA", heads=64, kv=8, head_dim=128, act="silu", dense=28672),
    "mistral-7b-v0.1": dict(
        family="mistral", attention="GQA", heads=32, kv=8, head_dim=128, sliding=32, act="silu", dense=14336
    ),
    "mixtral-8x7b-v0.1": dict(
        family="mixtral",
        attention="GQA",
        heads=32,
        kv=8,
        head_dim=128,
        act="silu",
        moe=(8, 2, 14336, 32, 0, None),
        dense=14336,
    ),
    "qwen2.5-7b": dict(family="qwen2", attention="GQA", heads=28, kv=4, head_dim=128, act="silu", dense=18944),
    "qwen1.5-moe-a2.7b-chat": dict(
        family="qwen2_moe",
        attention="MHA",
        heads=16,
        kv=16,
        head_dim=128,
        act="silu",
        moe=(60, 4, 1408, 24, 1, 5632),
        dense=5632,
    ),
    "qwen3-0.6b": dict(
        family="qwen3", attention="GQA", heads=16, kv=8, head_dim=128, act="silu", dense=3072, tied=True
    ),
    "qwen3-30b-a3b": dict(
        family="qwen3_moe",
        attention="GQA",
        heads=32,
        kv=4,
        head_dim=128,
        act="silu",
        moe=(128, 8, 768, 48, 0, None),
        dense=6144,
    ),
    "gemma-2-2b-it": dict(
        family="gemma2",
        attention="GQA",
        heads=8,
        kv=4,
        head_dim=256,
        sliding=13,
        act="gelu_pytorch_tanh",
        dense=9216,
        tied=True,
    ),
    "gemma-3-1b-it": dict(
        family="gemma3",
        attention="MQA",
        heads=4,
        kv=1,
        head_dim=256,
        sliding=22,
        act="gelu_pytorch_tanh",
        dense=6912,
        tied=True,
    ),
    "gpt-oss-20b": dict(
        family="gpt_oss",
        attention="GQA",
        heads=64,
        kv=8,
        head_dim=64,
        sliding=12,
        act="swiglu_clamp",
        moe=(32, 4, 2880, 24, 0, None),
        dense=2880,
    ),
    "gpt-oss-120b": dict(
        family="gpt_oss",
        attention="GQA",
        heads=64,
        kv=8,
        head_dim=64,
        sliding=18,
        act="swiglu_clamp",
        moe=(128, 4, 2880, 36, 0, None),
        dense=2880,
    ),
    "deepseek-v2-lite": dict(
        family="deepseek_v2",
        attention="MLA",
        heads=16,
        kv=16,
        act="silu",
        moe=(64, 6, 1408, 26, 2, 1408),
        dense=10944,
        mla=(512, 64, None),
    ),
    "deepseek-v3": dict(
        family="deepseek_v3",
        attention="MLA",
        heads=128,
        kv=128,
        act="silu",
        moe=(256, 8, 2048, 58, 1, 2048),
        dense=18432,
        mla=(512, 64, 1536),
    ),
    "llama-4-scout-17b-16e-instruct": dict(
        family="llama4",
        attention="GQA",
        heads=40,
        kv=8,
        head_dim=128,
        chunked=36,
        act="silu",
        moe=(16, 1, 8192, 48, 1, 8192),
        dense=16384,
    ),
    "phi-3-mini-4k-instruct": dict(
        family="phi3", attention="MHA", heads=32, kv=32, head_dim=96, sliding=32, act="silu", dense=8192
    ),
    "phi-4": dict(family="phi3", attention="GQA", heads=40, kv=10, head_dim=128, act="silu", dense=17920),
    "falcon-7b-instruct": dict(
        family="falcon", attention="MQA", heads=71, kv=1, head_dim=64, act="gelu", dense=18176, tied=True, gated=False
    ),
}

# Published figures that are not the count rounded to their last digit, each with its reason; the
# others must be within half a unit of their last digit.
NOT_ROUNDED = {
    "mistral-7b-v0.1": "Mistral's blog says 7.3B for 7.24B (rounded up)",
    "qwen2.5-7b": "the card's 7.61B truncates 7.6156B",
}


def test_every_preset_has_published_expectations():
    """A new preset must come with the numbers its test checks."""
    assert sorted(EXPECTED) == model_config.preset_names()


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_each_preset_reads_as_published(name):
    want, cfg = EXPECTED[name], model_config.load_preset(name)
    assert cfg.name == name
    assert (cfg.family, cfg.attention, cfg.num_heads, cfg.num_kv_heads) == (
        want["family"],
        want["attention"],
        want["heads"],
        want["kv"],
    )
    if "head_dim" in want:
        assert cfg.head_dim == want["head_dim"]
    assert cfg.sliding_layers == want.get("sliding", 0)
    assert cfg.chunked_layers == want.get("chunked", 0)
    assert cfg.hidden_act == want["act"]
    assert cfg.dense_intermediate_size == want["dense"]
    assert cfg.tie_word_embeddings == want.get("tied", False)
    assert cfg.gated_mlp == want.get("gated", True)
    moe = want.get("moe")
    if moe is None:
        assert cfg.moe is None
    else:
        m = cfg.moe
        assert (m.num_experts, m.top_k, m.expert_dim, m.moe_layers, m.shared_experts, m.shared_expert_dim) == moe
    mla = want.get("mla")
    if mla is None:
        assert cfg.mla is None
    else:
        assert (cfg.mla.kv_lora_rank, cfg.mla.qk_rope_head_dim, cfg.mla.q_lora_rank) == mla


def _half_unit(x: float) -> float:
    """Half a unit of the published figure's last significant digit (7.3e9 -> 0.05e9)."""
    k = math.floor(math.log10(x))
    while k > 0 and round(x / 10**k) * 10**k != x:
        k -= 1
    return 0.5 * 10**k


@pytest.mark.parametrize(
    "name", [n for n in model_config.preset_names() if model_config.preset_raw(n).get("_published_params")]
)
def test_parameter_count_is_the_published_figure_within_its_rounding(name):
    published = model_config.preset_raw(name)["_published_params"]
    counted = model_params.count_parameters(model_config.load_preset(name)).total
    if name in NOT_ROUNDED:
        assert counted == pytest.approx(published, rel=0.01), NOT_ROUNDED[name]
    else:
        assert abs(counted - published) <= _half_unit(published), (counted, published)


def test_half_unit_of_a_published_figure():
    assert _half_unit(7.3e9) == pytest.approx(0.05e9)
    assert _half_unit(68.98e9) == pytest.approx(0.005e9)
    assert _half_unit(135e6) == pytest.approx(0.5e6)


def test_parameter_counts_hand_computed_for_two_families():
    """SmolLM2-135M: 134,515,008 (a public write-up's count, tied embeddings); Mixtral-8x7B:
    attention 41.9M + 8 experts x 3 x 4096 x 14336 + router 8 x 4096 + 2 norms per layer."""
    assert model_params.count_parameters(model_config.load_preset("smollm2-135m")).total == 134_515_008
    h, layers = 4096, 32
    per_layer = (h * h * 2 + h * 1024 * 2) + 8 * 3 * h * 14336 + 8 * h + 2 * h
    total = layers * per_layer + h + 2 * 32000 * h
    assert model_params.count_parameters(model_config.load_preset("mixtral-8x7b-v0.1")).total == total


# -- refusals ---------------------------------------------------------------------------------


def _llama(**extra):
    return {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, **extra}


def test_an_unknown_family_names_its_model_type_and_the_families():
    with pytest.raises(BadInput) as err:
        model_config.from_dict({**_llama(), "model_type": "bloom"}, "x", "cfg.json")
    text = str(err.value)
    assert "model_type 'bloom' is not a family" in text and "qwen3_moe" in text and "falcon" in text


def test_without_a_model_type_the_architectures_name_the_family():
    raw = {k: v for k, v in _llama().items() if k != "model_type"}
    qwen = {**raw, "architectures": ["Qwen3ForCausalLM"], "num_key_value_heads": 2}
    assert model_config.from_dict(qwen, "x", "t").family == "qwen3"
    with pytest.raises(BadInput, match=r"no model_type and its architectures \(\['BloomForCausalLM'\]\)"):
        model_config.from_dict({**raw, "architectures": ["BloomForCausalLM"]}, "x", "t")
    with pytest.raises(BadInput, match=r"architectures \(none\)"):
        model_config.from_dict(raw, "x", "t")


def test_an_unknown_field_is_refused_naming_it_the_family_and_the_way_on():
    with pytest.raises(BadInput) as err:
        model_config.from_dict(_llama(attention_chunk_size=8192, zz_new=1), "x", "cfg.json")
    text = str(err.value)
    assert "attention_chunk_size=8192, zz_new=1" in text and "llama family" in text
    assert "--ignore-field" in text and "ignore_fields" in text and "LlamaConfig" in text


def test_ignore_fields_accepts_named_fields_unread_and_underscore_keys_are_notes():
    cfg = model_config.from_dict(_llama(zz_new=1, _note="ours"), "x", "t", ignore_fields=["zz_new"])
    assert cfg.ignored_fields == ("zz_new",) and "zz_new" not in cfg.raw
    with pytest.raises(BadInput, match="zz_other"):  # only the fields named
        model_config.from_dict(_llama(zz_new=1, zz_other=2), "x", "t", ignore_fields=["zz_new"])
    absent = model_config.from_dict(_llama(), "x", "t", ignore_fields=["zz_new"])
    assert absent.ignored_fields == ()  # named but not there: nothing was ignored
    with pytest.raises(BadInput, match="--ignore-field head_dim, rope_theta: the llama reader uses or knows"):
        model_config.from_dict(_llama(), "x", "t", ignore_fields=["rope_theta", "head_dim"])


def test_a_defaulted_kv_head_count_that_does_not_divide_says_where_it_came_from():
    with pytest.raises(BadInput, match="no num_key_value_heads: 32 is transformers' Qwen3Config default; set it"):
        model_config.from_dict({**_llama(), "model_type": "qwen3"}, "x", "t")


def test_a_family_field_is_refused_in_another_family():
    """Experts on a dense family, a sliding window on Llama: not silently read or dropped."""
    for extra in ({"num_local_experts": 8}, {"sliding_window": 4096}, {"kv_lora_rank": 512}):
        with pytest.raises(BadInput, match=next(iter(extra))):
            model_config.from_dict(_llama(**extra), "x", "t")


# -- defaults: transformers', and said ---------------------------------------------------------


def test_an_absent_field_takes_the_familys_transformers_default_and_says_so():
    mistral = model_config.from_dict({**_llama(), "model_type": "mistral", "num_attention_heads": 32}, "m", "t")
    assert mistral.num_kv_heads == 8 and "num_key_value_heads=8" in mistral.defaults_used  # MistralConfig's
    assert mistral.layer_windows == (4096, 4096)  # MistralConfig's sliding_window
    llama = model_config.from_dict(_llama(), "l", "t")
    assert llama.num_kv_heads == 4 and llama.head_dim == 16  # = heads; hidden / heads (derived, not listed)
    assert "max_position_embeddings=2048" in llama.defaults_used and llama.max_position_embeddings == 2048
    gemma = model_config.from_dict({**_llama(), "model_type": "gemma2"}, "g", "t")
    assert gemma.tie_word_embeddings and "tie_word_embeddings=true" in gemma.defaults_used
    falcon = model_config.from_dict({**_llama(), "model_type": "falcon"}, "f", "t")
    assert falcon.intermediate_size == 256 and any(u.startswith("ffn_hidden_size=256") for u in falcon.defaults_used)


def test_model_defining_fields_have_no_default():
    with pytest.raises(BadInput, match="lacks required field.*num_hidden_layers"):
        model_config.from_dict({"model_type": "qwen3", "hidden_size": 64, "num_attention_heads": 4}, "x", "t")
    with pytest.raises(BadInput, match="qk_rope_head_dim, qk_nope_head_dim, v_head_dim"):
        model_config.from_dict({**_llama(), "model_type": "deepseek_v3", "kv_lora_rank": 64}, "x", "t")
    with pytest.raises(BadInput, match="num_experts_per_tok"):  # DeepseekV2Config has no default for it
        model_config.from_dict(
            {
                **_llama(),
                "model_type": "deepseek_v2",
                "kv_lora_rank": 64,
                "qk_rope_head_dim": 8,
                "qk_nope_head_dim": 8,
                "v_head_dim": 8,
            },
            "x",
            "t",
        )


def _transformers_default(cls, key):
    params = inspect.signature(cls.__init__).parameters
    if key in params and params[key].default is not inspect.Parameter.empty:
        return True, params[key].default
    fields = getattr(cls, "__dataclass_fields__", {})
    if key in fields and fields[key].default is not inspect.Parameter.empty:
        return True, fields[key].default
    return False, None


def test_the_defaults_table_is_transformers_own():
    """Each family's defaults are the class defaults of transformers 5.x's config classes, where
    the class declares the field (checked when transformers 5 is installed)."""
    transformers = pytest.importorskip("transformers")
    if not transformers.__version__.startswith("5."):
        pytest.skip(f"the table is transformers 5's; installed {transformers.__version__}")
    from transformers import CONFIG_MAPPING

    checked, wrong = 0, []
    for fam in families.FAMILIES.values():
        cls = CONFIG_MAPPING[fam.model_types[0]]
        for key, ours in fam.defaults.items():
            found, theirs = _transformers_default(cls, key)
            if not found:
                continue
            checked += 1
            if theirs is None and key == "mlp_only_layers":
                theirs = []  # the class turns None into []
            if theirs != ours:
                wrong.append(f"{fam.name}.{key}: ours {ours!r}, {cls.__name__} {theirs!r}")
    assert not wrong
    assert checked > 100


def test_every_familys_fields_exist_in_transformers_or_a_published_config():
    """No family lists a field nobody publishes or reads: each is a transformers config class
    attribute, a common PretrainedConfig field, or one a shipped preset publishes."""
    transformers = pytest.importorskip("transformers")
    from transformers import CONFIG_MAPPING

    published = set()
    for name in model_config.preset_names():
        raw = model_config.preset_raw(name)
        published |= set(raw) | set(raw.get("text_config") or {})
    published |= {"sliding_window_size"}  # gemma-2-9b's (tests/data/configs)
    published |= {"n_layer", "n_head", "n_head_kv", "n_embed"}  # RefinedWeb's names (FalconConfig reads them)
    # DeepSeek's own config code publishes these (DeepSeek-V2's config in search-index file id
    # 51778167731; a DeepSeek-V3-shaped header config in 5961536744); Phi-4-mini-instruct publishes
    # partial_rotary_factor (file id 71463455676)
    published |= {"aux_loss_alpha", "seq_aux", "scoring_func", "ep_size", "partial_rotary_factor"}
    unknown = []
    for fam in families.FAMILIES.values():
        instance = CONFIG_MAPPING[fam.model_types[0]]()
        for key in fam.fields:
            if key not in published and not hasattr(instance, key):
                unknown.append(f"{fam.name}.{key}")
    assert not unknown, transformers.__version__


# -- family quirks -----------------------------------------------------------------------------


def test_qwen2_moe_always_has_its_shared_expert_and_dense_layers_by_step():
    raw = {
        **_llama(num_hidden_layers=6),
        "model_type": "qwen2_moe",
        "num_key_value_heads": 2,
        "decoder_sparse_step": 2,
        "mlp_only_layers": [5],
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 32,
        "intermediate_size": 128,
    }
    cfg = model_config.from_dict(raw, "q", "t")
    assert cfg.moe.layers == (False, True, False, True, False, False)  # (i+1) % 2 == 0, not layer 5
    assert (cfg.moe.shared_experts, cfg.moe.shared_expert_dim) == (1, 5632)  # the class default
    assert "shared_expert_intermediate_size=5632" in cfg.defaults_used
    pc = model_params.count_parameters(cfg)
    assert pc.groups["mlp"] == 4 * 3 * 64 * 128  # four dense layers at intermediate_size
    assert pc.groups["router"] == 2 * (64 * 4 + 64)  # router + the shared expert's one-output gate


def test_deepseek_dense_layers_use_intermediate_size():
    cfg = model_config.load_preset("deepseek-v2-lite")
    assert cfg.moe.layers[0] is False and all(cfg.moe.layers[1:])
    pc = model_params.count_parameters(cfg)
    assert pc.groups["mlp"] == 3 * 2048 * 10944  # layer 0 only
    assert pc.groups["shared_experts"] == 26 * 2 * 3 * 2048 * 1408


def test_llama4_interleaved_moe_layers_and_dense_width():
    raw = json.loads(json.dumps(model_config.preset_raw("llama-4-scout-17b-16e-instruct")))
    raw["text_config"].update(num_hidden_layers=8, interleave_moe_layer_step=2)
    cfg = model_config.from_dict(raw, "l4", "t")
    assert cfg.moe.layers == (False, True) * 4  # (i + 1) % 2 == 0, as transformers' moe_layers
    assert cfg.layer_chunks == (8192, 8192, 8192, None) * 2  # every 4th layer NoPE, full attention
    pc = model_params.count_parameters(cfg)
    assert pc.groups["mlp"] == 4 * 3 * 5120 * 16384  # dense layers at intermediate_size_mlp
    raw["text_config"]["moe_layers"] = [0, 7]
    assert model_config.from_dict(raw, "l4", "t").moe.layers == (True,) + (False,) * 6 + (True,)


def test_a_wrapper_is_read_through_its_text_config_strictly():
    raw = json.loads(json.dumps(model_config.preset_raw("llama-4-scout-17b-16e-instruct")))
    assert model_config.from_dict(raw, "l4", "t").model_type == "llama4_text"
    with pytest.raises(BadInput, match="wrapper field.*audio_config"):
        model_config.from_dict({**raw, "audio_config": {}}, "l4", "t")
    raw["text_config"]["model_type"] = "qwen3"
    with pytest.raises(BadInput, match="text_config.model_type 'qwen3' is not of the llama4 family"):
        model_config.from_dict(raw, "l4", "t")


def test_gpt_oss_records_its_clamped_swiglu_and_refuses_disagreeing_top_k():
    raw = model_config.preset_raw("gpt-oss-20b")
    cfg = model_config.from_dict({**raw, "swiglu_limit": 5.0}, "g", "t")
    assert (cfg.hidden_act, cfg.swiglu_limit) == ("swiglu_clamp", 5.0)
    with pytest.raises(BadInput, match="num_experts_per_tok=4 and experts_per_token=2 disagree"):
        model_config.from_dict({**raw, "experts_per_token": 2}, "g", "t")


def test_gemma_reads_hidden_activation_and_refuses_two_different_windows():
    raw = model_config.preset_raw("gemma-2-2b-it")
    cfg = model_config.from_dict({**raw, "hidden_act": "silu"}, "g", "t")
    assert cfg.hidden_act == "gelu_pytorch_tanh"  # Gemma-2's MLP reads hidden_activation
    assert cfg.layer_windows[:4] == (4096, None, 4096, None)
    assert model_config.from_dict({**raw, "sliding_window_size": 4096}, "g", "t").sliding_layers == 13
    with pytest.raises(BadInput, match="sliding_window_size=2048 and sliding_window=4096 differ"):
        model_config.from_dict({**raw, "sliding_window_size": 2048}, "g", "t")


def test_falcon_refinedweb_names_and_kv_heads():
    """RefinedWebModel's n_layer / n_head are FalconConfig's num_hidden_layers / heads; the new
    decoder architecture reads its KV heads from n_head_kv; its two LayerNorms per layer count."""
    old = {"model_type": "RefinedWebModel", "hidden_size": 4544, "n_head": 71, "n_layer": 32, "multi_query": True}
    cfg = model_config.from_dict(old, "rw", "t")
    assert (cfg.family, cfg.num_layers, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim) == ("falcon", 32, 71, 1, 64)
    new = {"model_type": "RefinedWeb", "hidden_size": 8192, "n_head": 128, "n_layer": 60, "n_head_kv": 8}
    cfg40 = model_config.from_dict({**new, "new_decoder_architecture": True}, "rw", "t")
    assert cfg40.num_kv_heads == 8
    seven = model_config.load_preset("falcon-7b-instruct")
    assert model_params.count_parameters(seven).groups["norms"] == 32 * 2 * 4544 + 2 * 4544  # one LN per layer


def test_phi4_is_read_by_the_phi3_family():
    assert model_config.load_preset("phi-4").family == "phi3"


# -- the CLI -----------------------------------------------------------------------------------


def test_kv_cache_refuses_an_unknown_field_and_goes_on_with_ignore_field(tmp_path):
    raw = {k: v for k, v in model_config.preset_raw("smollm2-135m").items() if not k.startswith("_")}
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**raw, "zz_new_knob": 3}))
    args = ["kv-cache", "--config", str(path), "--gpu-memory", "80", "--seq-len", "1024"]
    result = CliRunner().invoke(main, args)
    text = " ".join(result.output.split())
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "zz_new_knob=3" in text and "--ignore-field" in text
    ok = CliRunner().invoke(main, [*args, "--ignore-field", "zz_new_knob", "--json"])
    assert ok.exit_code == 0, ok.output
    plan = json.loads(ok.output)
    assert plan["ignored_fields"] == ["zz_new_knob"]
    assert "max_position_embeddings=2048" in plan["config_defaults_used"]


def test_kv_cache_prints_the_defaults_a_config_left_to_transformers():
    result = CliRunner().invoke(
        main, ["kv-cache", "--model", "smollm2-135m", "--gpu-memory", "80", "--seq-len", "1024"]
    )
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "absent fields read at defaults (transformers' unless said): max_position_embeddings=2048" in text
    assert text.index("smollm2-135m: GQA, 30 layers") > text.index("max_position_embeddings=2048")


# -- configs as transformers 5 saves them -----------------------------------------------------


def _transformers_5():
    transformers = pytest.importorskip("transformers")
    if not transformers.__version__.startswith("5."):
        pytest.skip(f"transformers 5's fields; installed {transformers.__version__}")
    from transformers import CONFIG_MAPPING

    return CONFIG_MAPPING


def _without_layer_types(saved):
    """The saved dict as an older or hand-written config has it: no layer_types (inner or outer)."""
    out = {k: v for k, v in saved.items() if k != "layer_types"}
    if isinstance(out.get("text_config"), dict):
        out["text_config"] = {k: v for k, v in out["text_config"].items() if k != "layer_types"}
    return out


def _transformers_spans(hf, layers):
    """(windows, chunks) per layer as transformers' config object says: its layer_types (which
    each class defaults from the family's rule when the dict has none) with its sliding_window and
    attention_chunk_size; a class without layer_types (Mistral, Mixtral, Phi-3) passes its one
    sliding_window to every layer's attention."""
    hf = getattr(hf, "text_config", None) or hf
    window, chunk = getattr(hf, "sliding_window", None), getattr(hf, "attention_chunk_size", None)
    types = getattr(hf, "layer_types", None)
    if types is None:
        return (window,) * layers, (None,) * layers
    assert len(types) == layers
    return (
        tuple(window if t == "sliding_attention" else None for t in types),
        tuple(chunk if t == "chunked_attention" else None for t in types),
    )


@pytest.mark.parametrize("model_type", sorted(families.MODEL_TYPES))
@pytest.mark.parametrize("layer_types", ["as saved", "left out"])
def test_a_config_transformers_5_saves_is_read(model_type, layer_types):
    """Every field a transformers 5 config class writes (its defaults, to_dict) is one the
    family's reader knows, under either of its names (attribute_map's aliases); its sliding and
    chunked layers are the ones transformers' class says, whether the dict lists layer_types or
    leaves the class to default them (gpt-oss: alternating, not every layer); its MoE layers are
    those of the decoder transformers builds from it."""
    mapping = _transformers_5()
    if model_type not in mapping:
        pytest.skip(f"{model_type}: no transformers class (RefinedWeb* are remote-code names)")
    saved = json.loads(mapping[model_type]().to_json_string())
    if model_type == "deepseek_v2":
        saved["num_experts_per_tok"] = 6  # DeepseekV2Config has no default for it
    if layer_types == "left out":
        saved = _without_layer_types(saved)
    cfg = model_config.from_dict(saved, model_type, f"transformers {model_type}")
    assert cfg.family == families.MODEL_TYPES[model_type]
    hf = mapping[model_type].from_dict(saved)
    windows, chunks = _transformers_spans(hf, cfg.num_layers)
    assert (cfg.layer_windows, cfg.layer_chunks) == (windows, chunks)
    if cfg.family in model_config.MOE_FIELDS:
        assert cfg.moe is not None and cfg.moe.layers == _moe_layers_transformers_builds(hf)


# Small configs, as keyword arguments of transformers' config classes, whose layer patterns are
# not all-alike: sliding from max_window_layers, Gemma-3's every sixth layer full, dense layers
# by decoder_sparse_step / mlp_only_layers / first_k_dense_replace / interleave_moe_layer_step /
# moe_layers, Llama-4's chunked RoPE layers.
_SMALL = {
    "hidden_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 32,
    "vocab_size": 64,
    "num_hidden_layers": 6,
}
_MLA = {
    "num_key_value_heads": 4,
    "kv_lora_rank": 16,
    "q_lora_rank": 16,
    "qk_rope_head_dim": 8,
    "qk_nope_head_dim": 8,
    "v_head_dim": 8,
    "n_routed_experts": 4,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 16,
    "n_group": 1,
    "topk_group": 1,
}
PATTERN_CASES = {
    "gemma2": ("gemma2", {**_SMALL, "sliding_window": 16}),
    "gemma3": ("gemma3_text", {**_SMALL, "sliding_window": 16, "num_hidden_layers": 12}),
    "gpt_oss": ("gpt_oss", {**_SMALL, "sliding_window": 16, "num_local_experts": 4, "num_experts_per_tok": 2}),
    "qwen2": ("qwen2", {**_SMALL, "use_sliding_window": True, "sliding_window": 16, "max_window_layers": 2}),
    "qwen3": ("qwen3", {**_SMALL, "use_sliding_window": True, "sliding_window": 16, "max_window_layers": 2}),
    "qwen2_moe": (
        "qwen2_moe",
        {
            **_SMALL,
            "decoder_sparse_step": 2,
            "mlp_only_layers": [3],
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 16,
            "shared_expert_intermediate_size": 16,
        },
    ),
    "qwen3_moe": (
        "qwen3_moe",
        {**_SMALL, "mlp_only_layers": [0, 5], "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 16},
    ),
    "llama4": (
        "llama4_text",
        {
            **_SMALL,
            "interleave_moe_layer_step": 3,
            "attention_chunk_size": 32,
            "intermediate_size_mlp": 48,
            "num_local_experts": 4,
        },
    ),
    "llama4 moe_layers": (
        "llama4_text",
        {**_SMALL, "moe_layers": [0, 4], "intermediate_size_mlp": 48, "num_local_experts": 4},
    ),
    "deepseek_v3": ("deepseek_v3", {**_SMALL, **_MLA, "first_k_dense_replace": 2}),
    "deepseek_v2": ("deepseek_v2", {**_SMALL, **_MLA, "first_k_dense_replace": 1}),
    "mixtral": ("mixtral", {**_SMALL, "sliding_window": 16, "num_local_experts": 4, "num_experts_per_tok": 2}),
    "mistral": ("mistral", {**_SMALL, "sliding_window": 16}),
}


MOE_CASES = {c for c, (t, _) in PATTERN_CASES.items() if families.MODEL_TYPES[t] in model_config.MOE_FIELDS}


def _moe_layers_transformers_builds(hf):
    """Per layer, whether the decoder transformers builds from ``hf`` has an MoE MLP (one with
    experts), built on the meta device (no memory, no weights)."""
    torch = pytest.importorskip("torch")
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf)
    return tuple(hasattr(getattr(layer, "mlp", None) or layer.feed_forward, "experts") for layer in model.model.layers)


@pytest.mark.parametrize("case", sorted(PATTERN_CASES))
def test_layer_patterns_read_as_transformers_builds_them(case):
    """Sliding, chunked and MoE layers, per layer, are what transformers' config class says and
    its modeling code builds, with layer_types as saved and left out."""
    mapping = _transformers_5()
    model_type, kwargs = PATTERN_CASES[case]
    hf, layers = mapping[model_type](**kwargs), kwargs["num_hidden_layers"]
    moe_layers = _moe_layers_transformers_builds(hf) if case in MOE_CASES else (False,) * layers
    saved = json.loads(hf.to_json_string())
    for raw in (saved, _without_layer_types(saved)):
        cfg = model_config.from_dict(raw, case, f"transformers {case}")
        assert cfg.num_layers == layers
        assert (cfg.layer_windows, cfg.layer_chunks) == _transformers_spans(mapping[model_type].from_dict(raw), layers)
        assert (cfg.moe.layers if cfg.moe else (False,) * layers) == moe_layers


def test_an_alias_reads_as_its_field_and_two_different_values_are_refused():
    raw = {k: v for k, v in model_config.preset_raw("qwen3-30b-a3b").items() if not k.startswith("_")}
    renamed = {**{k: v for k, v in raw.items() if k != "num_experts"}, "num_local_experts": 128}
    assert model_config.from_dict(renamed, "q", "t").moe.num_experts == 128  # Qwen3MoeConfig's other name
    with pytest.raises(BadInput, match="num_local_experts=64 and num_experts=128 name the same field"):
        model_config.from_dict({**raw, "num_local_experts": 64}, "q", "t")


def test_mla_and_gemma_consistency_checks():
    v3 = model_config.preset_raw("deepseek-v3")
    assert model_config.from_dict({**v3, "qk_head_dim": 192}, "d", "t").mla.qk_rope_head_dim == 64
    with pytest.raises(BadInput, match=r"qk_head_dim=128 is not qk_nope_head_dim \+ qk_rope_head_dim \(128 \+ 64\)"):
        model_config.from_dict({**v3, "qk_head_dim": 128}, "d", "t")
    with pytest.raises(BadInput, match="use_bidirectional_attention is true: not a causal language model"):
        model_config.from_dict(
            {**model_config.preset_raw("gemma-2-2b-it"), "use_bidirectional_attention": True}, "g", "t"
        )


def test_falcon_norms_follow_num_ln_in_parallel_attn():
    """Falcon's new decoder architecture has two LayerNorms per parallel block unless
    num_ln_in_parallel_attn says one (transformers' FalconDecoderLayer)."""
    base = {"model_type": "falcon", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4}
    two = model_config.from_dict({**base, "new_decoder_architecture": True, "num_kv_heads": 2}, "f", "t")
    one = model_config.from_dict(
        {**base, "new_decoder_architecture": True, "num_kv_heads": 2, "num_ln_in_parallel_attn": 1}, "f", "t"
    )
    assert model_params.count_parameters(two).groups["norms"] == 2 * 2 * 2 * 64 + 2 * 64
    assert model_params.count_parameters(one).groups["norms"] == 2 * 1 * 2 * 64 + 2 * 64


def test_qwen_slides_only_with_use_sliding_window_whatever_layer_types_say():
    """transformers' Qwen configs set the window to None unless use_sliding_window, so a config it
    saves (layer_types always written) with sliding_attention entries has no sliding layer."""
    raw = {
        **_llama(num_hidden_layers=4, num_key_value_heads=2),
        "model_type": "qwen3",
        "sliding_window": 64,
        "layer_types": ["sliding_attention", "full_attention"] * 2,
    }
    assert model_config.from_dict(raw, "q", "t").sliding_layers == 0
    on = model_config.from_dict({**raw, "use_sliding_window": True}, "q", "t")
    assert on.layer_windows == (64, None, 64, None)


def test_the_one_line_summary_names_the_measured_shapes():
    """The line the generated scenario's model block carries (issue 37's example for gpt-oss-20b)."""
    summary = {
        n: model_config.load_preset(n).summary
        for n in ("gpt-oss-20b", "deepseek-v2-lite", "llama-4-scout-17b-16e-instruct")
    }
    assert (
        summary["gpt-oss-20b"]
        == "24 layers; GQA 64 q / 8 kv heads x 64; sliding 128 on 12 layers; MoE 32 experts top-4 x 2880"
    )
    assert summary["deepseek-v2-lite"] == (
        "27 layers; MLA 16 heads, latent 512 + rope 64; MoE 64 experts top-6 x 1408 + 2 shared x 1408 "
        "on 26 layers (dense x 10944)"
    )
    assert summary["llama-4-scout-17b-16e-instruct"] == (
        "48 layers; GQA 40 q / 8 kv heads x 128; chunked 8192 on 36 layers; MoE 16 experts top-1 x 8192 + 1 shared x 8192"
    )


# -- review fixes (issue 37) -------------------------------------------------------------------


def test_gpt_oss_without_layer_types_alternates_sliding_and_full_layers():
    """GptOssConfig (and vLLM) default layer_types to sliding on even layers, full on odd ones:
    a gpt-oss config without layer_types is not every layer sliding."""
    raw = {k: v for k, v in model_config.preset_raw("gpt-oss-20b").items() if k != "layer_types"}
    cfg = model_config.from_dict(raw, "g", "t")
    assert cfg.layer_windows == (128, None) * 12
    assert cfg.layer_windows == model_config.load_preset("gpt-oss-20b").layer_windows


@pytest.mark.parametrize("value", ["1", -1, True, 1.5])
def test_max_window_layers_must_be_an_integer_of_at_least_zero(value):
    raw = {**_llama(num_key_value_heads=2), "model_type": "qwen2", "use_sliding_window": True, "sliding_window": 8}
    assert model_config.from_dict({**raw, "max_window_layers": 1}, "q", "t").layer_windows == (None, 8)
    with pytest.raises(BadInput, match=r"max_window_layers=.*allowed: an integer >= 0"):
        model_config.from_dict({**raw, "max_window_layers": value}, "q", "t")


@pytest.mark.parametrize("key", ["torch_dtype", "dtype"])
@pytest.mark.parametrize("value", ["float64", ["x"], "int3", ""])
def test_an_unknown_weight_dtype_is_refused_naming_the_field_and_the_allowed(key, value):
    """Weight bytes are read from the dtype: one not known is refused, never read as 2 bytes."""
    with pytest.raises(BadInput) as err:
        model_config.from_dict(_llama(**{key: value}), "x", "cfg.json")
    text = str(err.value)
    assert f"cfg.json: {key}=" in text and "allowed: float32, float16, bfloat16" in text and "bf16" in text


def test_a_known_dtype_and_its_alias_set_the_weight_bytes():
    for value, width in (("float32", 4), ("bf16", 2), ("float16", 2)):
        cfg = model_config.from_dict(_llama(torch_dtype=value), "x", "t")
        pc = model_params.count_parameters(cfg)
        assert model_params.weight_bytes(cfg).bytes == pc.total * width
    assert model_config.from_dict(_llama(dtype="bf16", torch_dtype="bfloat16"), "x", "t").torch_dtype == "bfloat16"
    with pytest.raises(BadInput, match="torch_dtype='float32' and dtype='bfloat16' name the weights' dtype twice"):
        model_config.from_dict(_llama(dtype="bfloat16", torch_dtype="float32"), "x", "t")


def _qwen3_moe(**extra):
    return {
        **_llama(num_hidden_layers=2, num_key_value_heads=2),
        "model_type": "qwen3_moe",
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 16,
        "intermediate_size": 48,
        **extra,
    }


def test_moe_layer_indices_outside_the_model_are_refused():
    with pytest.raises(BadInput, match=r"mlp_only_layers names layer\(s\) 2, 5, but the model has 2 .*0 to 1"):
        model_config.from_dict(_qwen3_moe(mlp_only_layers=[0, 5, 2]), "q", "t")
    with pytest.raises(BadInput, match=r"mlp_only_layers names layer\(s\) -1"):
        model_config.from_dict(_qwen3_moe(mlp_only_layers=[-1]), "q", "t")
    raw = json.loads(json.dumps(model_config.preset_raw("llama-4-scout-17b-16e-instruct")))
    raw["text_config"].update(num_hidden_layers=2, moe_layers=[5])
    with pytest.raises(BadInput, match=r"moe_layers names layer\(s\) 5, but the model has 2"):
        model_config.from_dict(raw, "l4", "t")


def test_an_moe_config_with_no_moe_layer_reads_as_the_dense_model_transformers_builds():
    """Every layer in mlp_only_layers (or Llama-4's moe_layers empty, DeepSeek's dense layers
    covering all): transformers builds dense MLPs only, so no MoE is read (no technique measures
    experts the model lacks), and the parameters are the dense MLPs'."""
    cfg = model_config.from_dict(_qwen3_moe(mlp_only_layers=[0, 1]), "q", "t")
    assert cfg.moe is None and "MoE" not in cfg.summary
    assert model_params.count_parameters(cfg).groups["mlp"] == 2 * 3 * 64 * 48
    raw = json.loads(json.dumps(model_config.preset_raw("llama-4-scout-17b-16e-instruct")))
    raw["text_config"].update(num_hidden_layers=2, moe_layers=[])
    llama4 = model_config.from_dict(raw, "l4", "t")
    assert llama4.moe is None and llama4.intermediate_size == llama4.dense_intermediate_size == 16384
    v2 = {**model_config.preset_raw("deepseek-v2-lite"), "num_hidden_layers": 1}  # first_k_dense_replace 1
    assert model_config.from_dict(v2, "d", "t").moe is None


def test_mla_reads_no_kv_head_count():
    """MLA caches a latent and gives every query head its own key and value: a DeepSeek-V3-shaped
    config of 16 heads without num_key_value_heads (DeepseekV3Config's default 128) is read."""
    raw = {k: v for k, v in model_config.preset_raw("deepseek-v3").items() if k != "num_key_value_heads"}
    cfg = model_config.from_dict({**raw, "num_attention_heads": 16}, "d", "t")
    assert (cfg.attention, cfg.num_heads, cfg.num_kv_heads) == ("MLA", 16, 16)
    assert not any(u.startswith("num_key_value_heads=") for u in cfg.defaults_used)


def test_a_family_named_by_its_architectures_reads_its_own_rules():
    """Without model_type, the family the architectures name decides: Falcon's new decoder
    architecture reads num_kv_heads (not multi_query's one head); Gemma-2's layers alternate."""
    falcon = {
        "architectures": ["FalconForCausalLM"],
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 8,
        "new_decoder_architecture": True,
        "num_kv_heads": 2,
    }
    assert model_config.from_dict(falcon, "f", "t").num_kv_heads == 2
    gemma = {
        k: v for k, v in model_config.preset_raw("gemma-2-2b-it").items() if k not in ("model_type", "layer_types")
    }
    assert model_config.from_dict(gemma, "g", "t").layer_windows[:4] == (4096, None, 4096, None)
    assert model_config.from_dict(gemma, "g", "t").sliding_layers == 13
