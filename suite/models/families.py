"""The model families :mod:`gpubench.models.config` reads, field by field.

Each :class:`Family` names the ``model_type`` values (and, for configs without one, the
``architectures`` classes) it covers, every field its reader uses or knows to change nothing a
technique measures, and the defaults transformers applies when a field is absent. A config field
that no entry names is refused (:func:`gpubench.models.config.from_dict`), never guessed at.

Defaults (``Family.defaults``) are the class defaults of transformers 5.25's configuration classes
(``LlamaConfig``, ``MistralConfig``, ...; tests/test_model_config.py checks them against the
installed transformers when it is there). Only fields the reader uses are listed; a default is
applied only where the field is absent, and :attr:`ModelConfig.defaults_used` names each one.

================  =====================================================================================
family            defaults applied when the field is absent (transformers 5.25)
================  =====================================================================================
llama             num_key_value_heads = num_attention_heads, head_dim = hidden_size / heads,
                  hidden_act silu, intermediate_size 11008, vocab_size 32000,
                  max_position_embeddings 2048, tie_word_embeddings false, attention_bias false,
                  mlp_bias false
mistral           num_key_value_heads 8, sliding_window 4096 (every layer), intermediate_size 14336,
                  vocab_size 32000, max_position_embeddings 131072, tie false
mixtral           as mistral but sliding_window none; num_local_experts 8, num_experts_per_tok 2
qwen2             num_key_value_heads 32, intermediate_size 22016, vocab_size 151936,
                  max_position_embeddings 32768, use_sliding_window false, max_window_layers 28
qwen2_moe         num_key_value_heads 16, intermediate_size 5632, num_experts 60,
                  num_experts_per_tok 4, moe_intermediate_size 1408,
                  shared_expert_intermediate_size 5632, decoder_sparse_step 1, mlp_only_layers []
qwen3             num_key_value_heads 32, head_dim 128, intermediate_size 22016, vocab 151936,
                  max_position_embeddings 32768, use_sliding_window false, max_window_layers 28
qwen3_moe         num_key_value_heads 4, intermediate_size 6144, num_experts 128,
                  num_experts_per_tok 8, moe_intermediate_size 768, decoder_sparse_step 1
gemma2            num_key_value_heads 4, head_dim 256, hidden_activation gelu_pytorch_tanh,
                  sliding_window 4096 (even layers), intermediate_size 9216, vocab 256000,
                  max_position_embeddings 8192, tie_word_embeddings TRUE
gemma3            as gemma2 but vocab 262208, max_position_embeddings 131072,
                  sliding_window_pattern 6
gpt_oss           num_key_value_heads 8, head_dim 64, sliding_window 128, intermediate_size 2880,
                  num_local_experts 128, num_experts_per_tok 4, swiglu_limit 7.0, swiglu_alpha 1.702,
                  attention_bias true
deepseek_v2       num_key_value_heads = heads, intermediate_size 11008, vocab 102400,
                  max_position_embeddings 2048, n_routed_experts 64, n_shared_experts 2,
                  moe_intermediate_size 1407, first_k_dense_replace 0, moe_layer_freq 1
deepseek_v3       num_key_value_heads 128, intermediate_size 18432, vocab 129280,
                  max_position_embeddings 4096, n_routed_experts 256, n_shared_experts 1,
                  num_experts_per_tok 8, moe_intermediate_size 2048, first_k_dense_replace 3,
                  moe_layer_freq 1
llama4            num_key_value_heads 8, head_dim 128, intermediate_size 8192,
                  intermediate_size_mlp 16384, num_local_experts 16, num_experts_per_tok 1,
                  interleave_moe_layer_step 1, attention_chunk_size 8192, no_rope_layer_interval 4,
                  vocab 202048, max_position_embeddings 131072
phi3              num_key_value_heads = heads, intermediate_size 8192, vocab 32064,
                  max_position_embeddings 4096, sliding_window none
falcon            ffn_hidden_size = 4 x hidden_size, activation gelu, multi_query true,
                  new_decoder_architecture false, parallel_attn true, bias false, vocab 65024,
                  max_position_embeddings 2048, tie_word_embeddings TRUE, num_ln_in_parallel_attn
                  = 2 in the new decoder architecture, else 1
================  =====================================================================================

A field may come under another name (``Family.aliases``: transformers' ``attribute_map``, e.g.
Qwen3-MoE's ``num_local_experts`` for ``num_experts``, which a config saved by transformers 5
uses; Falcon's RefinedWeb ``n_layer`` / ``n_head`` / ``n_head_kv`` / ``n_embed``); both names
given with different values are refused.

Always required, defaults or not (a default describes one published model, not the user's):
hidden_size, num_hidden_layers, num_attention_heads, and for MLA models kv_lora_rank,
qk_rope_head_dim, qk_nope_head_dim, v_head_dim. DeepSeek-V2's num_experts_per_tok has no default.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# Fields of transformers' PretrainedConfig and of every published config that change no shape a
# technique measures: token ids, generation settings, bookkeeping, initialisation, dropout, norm
# epsilons and RoPE settings (RoPE changes values, not the shapes or the cache layout).
COMMON_FIELDS = frozenset(
    {
        # what the reader uses for every family
        "architectures",
        "model_type",
        "hidden_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "vocab_size",
        "intermediate_size",
        "max_position_embeddings",
        "torch_dtype",
        "dtype",
        "tie_word_embeddings",
        "quantization_config",
        # shape-neutral
        "transformers_version",
        "bos_token_id",
        "eos_token_id",
        "pad_token_id",
        "sep_token_id",
        "decoder_start_token_id",
        "use_cache",
        "initializer_range",
        "initializer_factor",
        "rms_norm_eps",
        "layer_norm_eps",
        "layer_norm_epsilon",
        "rope_theta",
        "rope_scaling",
        "rope_parameters",
        "attention_dropout",
        "hidden_dropout",
        "output_attentions",
        "output_hidden_states",
        "return_dict",
        "torchscript",
        "use_bfloat16",
        "pruned_heads",
        "chunk_size_feed_forward",
        "is_encoder_decoder",
        "is_decoder",
        "add_cross_attention",
        "tie_encoder_decoder",
        "id2label",
        "label2id",
        "problem_type",
        "tokenizer_class",
        "prefix",
        "task_specific_params",
        "finetuning_task",
        "auto_map",
        "max_length",
        "min_length",
        "do_sample",
        "early_stopping",
        "num_beams",
        "temperature",
        "top_k",
        "top_p",
        "repetition_penalty",
        "length_penalty",
        "no_repeat_ngram_size",
        "num_return_sequences",
        "bad_words_ids",
    }
)

_MOE_SHAPE_NEUTRAL = {"output_router_logits", "router_aux_loss_coef", "norm_topk_prob"}
_QWEN_WINDOW = {"use_sliding_window", "sliding_window", "max_window_layers", "layer_types"}
_DEEPSEEK = {
    "kv_lora_rank",
    "q_lora_rank",
    "qk_rope_head_dim",
    "qk_nope_head_dim",
    "v_head_dim",
    "n_routed_experts",
    "n_shared_experts",
    "num_experts_per_tok",
    "moe_intermediate_size",
    "moe_layer_freq",
    "first_k_dense_replace",
    "attention_bias",
    "mlp_bias",
    "hidden_act",
    "head_dim",
    # routing and bookkeeping: which experts a token takes, not how many or how wide
    "norm_topk_prob",
    "scoring_func",
    "topk_method",
    "n_group",
    "topk_group",
    "routed_scaling_factor",
    "aux_loss_alpha",
    "seq_aux",
    "ep_size",
    "pretraining_tp",
    "output_router_logits",
    "qk_head_dim",  # qk_nope_head_dim + qk_rope_head_dim (refused when it is not)
    # the multi-token-prediction module sits outside num_hidden_layers (not measured)
    "num_nextn_predict_layers",
}


@dataclass(frozen=True)
class Family:
    name: str
    model_types: tuple[str, ...]
    architectures: tuple[str, ...]
    fields: frozenset[str]  # beyond COMMON_FIELDS
    defaults: dict[str, Any] = field(default_factory=dict)
    transformers_class: str = ""
    wrapper_fields: frozenset[str] = frozenset()  # multimodal wrapper's own keys (text_config inside)
    # Other names of a field, as transformers' attribute_map (or FalconConfig) reads them: alias ->
    # the name the reader uses (a config transformers 5 saves may use either)
    aliases: dict[str, str] = field(default_factory=dict)


def _f(*names: str | set[str]) -> frozenset[str]:
    out: set[str] = set()
    for n in names:
        out |= {n} if isinstance(n, str) else n
    return frozenset(out)


_WRAPPER = {
    "text_config",
    "vision_config",
    "boi_token_index",
    "eoi_token_index",
    "image_token_index",
    "boi_token_id",
    "eoi_token_id",
    "image_token_id",
    "initializer_range",
}

FAMILIES: dict[str, Family] = {
    f.name: f
    for f in (
        Family(
            "llama",
            ("llama",),
            ("LlamaForCausalLM",),
            # rope_interleaved and is_llama_config: published by SmolLM2 (a nanotron export);
            # transformers stores and ignores them.
            _f(
                "head_dim",
                "hidden_act",
                "attention_bias",
                "mlp_bias",
                "pretraining_tp",
                "rope_interleaved",
                "is_llama_config",
            ),
            {
                "hidden_act": "silu",
                "intermediate_size": 11008,
                "vocab_size": 32000,
                "max_position_embeddings": 2048,
                "tie_word_embeddings": False,
                "attention_bias": False,
                "mlp_bias": False,
            },
            "LlamaConfig",
        ),
        Family(
            "mistral",
            ("mistral",),
            ("MistralForCausalLM",),
            _f("head_dim", "hidden_act", "sliding_window"),
            {
                "num_key_value_heads": 8,
                "hidden_act": "silu",
                "sliding_window": 4096,
                "intermediate_size": 14336,
                "vocab_size": 32000,
                "max_position_embeddings": 131072,
                "tie_word_embeddings": False,
            },
            "MistralConfig",
        ),
        Family(
            "mixtral",
            ("mixtral",),
            ("MixtralForCausalLM",),
            _f(
                "head_dim",
                "hidden_act",
                "sliding_window",
                "num_local_experts",
                "num_experts_per_tok",
                "router_jitter_noise",
                _MOE_SHAPE_NEUTRAL,
            ),
            {
                "num_key_value_heads": 8,
                "hidden_act": "silu",
                "sliding_window": None,
                "intermediate_size": 14336,
                "vocab_size": 32000,
                "max_position_embeddings": 131072,
                "tie_word_embeddings": False,
                "num_local_experts": 8,
                "num_experts_per_tok": 2,
            },
            "MixtralConfig",
            aliases={"num_experts": "num_local_experts"},
        ),
        Family(
            "qwen2",
            ("qwen2",),
            ("Qwen2ForCausalLM",),
            _f("hidden_act", _QWEN_WINDOW),
            {
                "num_key_value_heads": 32,
                "hidden_act": "silu",
                "intermediate_size": 22016,
                "vocab_size": 151936,
                "max_position_embeddings": 32768,
                "tie_word_embeddings": False,
                "use_sliding_window": False,
                "max_window_layers": 28,
            },
            "Qwen2Config",
        ),
        Family(
            "qwen2_moe",
            ("qwen2_moe",),
            ("Qwen2MoeForCausalLM",),
            _f(
                "hidden_act",
                _QWEN_WINDOW,
                _MOE_SHAPE_NEUTRAL,
                "num_experts",
                "num_experts_per_tok",
                "moe_intermediate_size",
                "shared_expert_intermediate_size",
                "decoder_sparse_step",
                "mlp_only_layers",
                "qkv_bias",
            ),
            {
                "num_key_value_heads": 16,
                "hidden_act": "silu",
                "intermediate_size": 5632,
                "vocab_size": 151936,
                "max_position_embeddings": 32768,
                "tie_word_embeddings": False,
                "use_sliding_window": False,
                "max_window_layers": 28,
                "num_experts": 60,
                "num_experts_per_tok": 4,
                "moe_intermediate_size": 1408,
                "shared_expert_intermediate_size": 5632,
                "decoder_sparse_step": 1,
                "mlp_only_layers": [],
            },
            "Qwen2MoeConfig",
        ),
        Family(
            "qwen3",
            ("qwen3",),
            ("Qwen3ForCausalLM",),
            _f("head_dim", "hidden_act", "attention_bias", _QWEN_WINDOW),
            {
                "num_key_value_heads": 32,
                "head_dim": 128,
                "hidden_act": "silu",
                "intermediate_size": 22016,
                "vocab_size": 151936,
                "max_position_embeddings": 32768,
                "tie_word_embeddings": False,
                "attention_bias": False,
                "use_sliding_window": False,
                "max_window_layers": 28,
            },
            "Qwen3Config",
        ),
        Family(
            "qwen3_moe",
            ("qwen3_moe",),
            ("Qwen3MoeForCausalLM",),
            _f(
                "head_dim",
                "hidden_act",
                "attention_bias",
                _QWEN_WINDOW,
                _MOE_SHAPE_NEUTRAL,
                "num_experts",
                "num_experts_per_tok",
                "moe_intermediate_size",
                "decoder_sparse_step",
                "mlp_only_layers",
            ),
            {
                "num_key_value_heads": 4,
                "hidden_act": "silu",
                "intermediate_size": 6144,
                "vocab_size": 151936,
                "max_position_embeddings": 32768,
                "tie_word_embeddings": False,
                "attention_bias": False,
                "use_sliding_window": False,
                "num_experts": 128,
                "num_experts_per_tok": 8,
                "moe_intermediate_size": 768,
                "decoder_sparse_step": 1,
                "mlp_only_layers": [],
            },
            "Qwen3MoeConfig",
            aliases={"num_local_experts": "num_experts"},
        ),
        Family(
            "gemma2",
            ("gemma2",),
            ("Gemma2ForCausalLM",),
            # hidden_act is published beside hidden_activation; Gemma-2's MLP reads hidden_activation
            _f(
                "head_dim",
                "hidden_act",
                "hidden_activation",
                "sliding_window",
                "layer_types",
                "attention_bias",
                "query_pre_attn_scalar",
                "attn_logit_softcapping",
                "final_logit_softcapping",
                "cache_implementation",
                # gemma-2-9b publishes this older name beside sliding_window, which transformers
                # reads; the reader refuses the two when they differ
                "sliding_window_size",
                "use_bidirectional_attention",  # refused when true: not a causal LM
            ),
            {
                "num_key_value_heads": 4,
                "head_dim": 256,
                "hidden_activation": "gelu_pytorch_tanh",
                "sliding_window": 4096,
                "intermediate_size": 9216,
                "vocab_size": 256000,
                "max_position_embeddings": 8192,
                "tie_word_embeddings": True,
                "attention_bias": False,
            },
            "Gemma2Config",
        ),
        Family(
            "gemma3",
            ("gemma3_text", "gemma3"),
            ("Gemma3ForCausalLM", "Gemma3ForConditionalGeneration"),
            _f(
                "head_dim",
                "hidden_act",
                "hidden_activation",
                "sliding_window",
                "sliding_window_pattern",
                "layer_types",
                "attention_bias",
                "query_pre_attn_scalar",
                "attn_logit_softcapping",
                "final_logit_softcapping",
                "cache_implementation",
                "rope_local_base_freq",
                "use_bidirectional_attention",
            ),
            {
                "num_key_value_heads": 4,
                "head_dim": 256,
                "hidden_activation": "gelu_pytorch_tanh",
                "sliding_window": 4096,
                "sliding_window_pattern": 6,
                "intermediate_size": 9216,
                "vocab_size": 262208,
                "max_position_embeddings": 131072,
                "tie_word_embeddings": True,
                "attention_bias": False,
            },
            "Gemma3TextConfig",
            frozenset(_WRAPPER | {"mm_tokens_per_image"}),
        ),
        Family(
            "gpt_oss",
            ("gpt_oss",),
            ("GptOssForCausalLM",),
            _f(
                "head_dim",
                "hidden_act",
                "attention_bias",
                "sliding_window",
                "layer_types",
                "num_local_experts",
                "num_experts_per_tok",
                "experts_per_token",
                "swiglu_limit",
                "swiglu_alpha",
                "initial_context_length",  # YaRN's original length (RoPE values, not shapes)
                _MOE_SHAPE_NEUTRAL,
            ),
            {
                "num_key_value_heads": 8,
                "head_dim": 64,
                "sliding_window": 128,
                "intermediate_size": 2880,
                "vocab_size": 201088,
                "max_position_embeddings": 131072,
                "tie_word_embeddings": False,
                "num_local_experts": 128,
                "num_experts_per_tok": 4,
                "swiglu_limit": 7.0,
                "swiglu_alpha": 1.702,
                "attention_bias": True,
            },
            "GptOssConfig",
            aliases={"num_experts": "num_local_experts"},
        ),
        Family(
            "deepseek_v2",
            ("deepseek_v2",),
            ("DeepseekV2ForCausalLM",),
            frozenset(_DEEPSEEK),
            {
                "hidden_act": "silu",
                "intermediate_size": 11008,
                "vocab_size": 102400,
                "max_position_embeddings": 2048,
                "tie_word_embeddings": False,
                "n_routed_experts": 64,
                "n_shared_experts": 2,
                "moe_intermediate_size": 1407,
                "first_k_dense_replace": 0,
                "moe_layer_freq": 1,
            },
            "DeepseekV2Config",
            aliases={"num_experts": "n_routed_experts"},
        ),
        Family(
            "deepseek_v3",
            ("deepseek_v3",),
            ("DeepseekV3ForCausalLM",),
            frozenset(_DEEPSEEK | {"rope_interleave"}),
            {
                "num_key_value_heads": 128,
                "hidden_act": "silu",
                "intermediate_size": 18432,
                "vocab_size": 129280,
                "max_position_embeddings": 4096,
                "tie_word_embeddings": False,
                "n_routed_experts": 256,
                "n_shared_experts": 1,
                "num_experts_per_tok": 8,
                "moe_intermediate_size": 2048,
                "first_k_dense_replace": 3,
                "moe_layer_freq": 1,
            },
            "DeepseekV3Config",
            aliases={"num_local_experts": "n_routed_experts", "num_mtp_layers": "num_nextn_predict_layers"},
        ),
        Family(
            "llama4",
            ("llama4_text", "llama4"),
            ("Llama4ForCausalLM", "Llama4ForConditionalGeneration"),
            _f(
                "head_dim",
                "hidden_act",
                "attention_bias",
                "attention_chunk_size",
                "intermediate_size_mlp",
                "num_local_experts",
                "num_experts_per_tok",
                "interleave_moe_layer_step",
                "moe_layers",
                "no_rope_layers",
                "no_rope_layer_interval",
                "layer_types",
                "use_qk_norm",
                "attn_temperature_tuning",
                "floor_scale",
                "attn_scale",
                "router_jitter_noise",
                _MOE_SHAPE_NEUTRAL,
            ),
            {
                "num_key_value_heads": 8,
                "head_dim": 128,
                "hidden_act": "silu",
                "intermediate_size": 8192,
                "intermediate_size_mlp": 16384,
                "vocab_size": 202048,
                "max_position_embeddings": 131072,
                "tie_word_embeddings": False,
                "num_local_experts": 16,
                "num_experts_per_tok": 1,
                "interleave_moe_layer_step": 1,
                "attention_chunk_size": 8192,
                "no_rope_layer_interval": 4,
            },
            "Llama4TextConfig",
            frozenset(_WRAPPER),
        ),
        Family(
            "phi3",
            ("phi3",),
            ("Phi3ForCausalLM",),
            # Phi-4 publishes model_type phi3 too
            _f(
                "hidden_act",
                "sliding_window",
                "resid_pdrop",
                "embd_pdrop",
                "original_max_position_embeddings",
                # Phi-4-mini publishes it (RoPE over part of each head: values, not shapes)
                "partial_rotary_factor",
                "attention_bias",
            ),
            {
                "hidden_act": "silu",
                "intermediate_size": 8192,
                "vocab_size": 32064,
                "max_position_embeddings": 4096,
                "tie_word_embeddings": False,
                "sliding_window": None,
            },
            "Phi3Config",
        ),
        Family(
            "falcon",
            ("falcon", "RefinedWeb", "RefinedWebModel"),
            ("FalconForCausalLM", "RWForCausalLM"),
            _f(
                "multi_query",
                "new_decoder_architecture",
                "num_kv_heads",
                "parallel_attn",
                "bias",
                "ffn_hidden_size",
                "activation",
                "alibi",
                "apply_residual_connection_post_layernorm",
                "num_ln_in_parallel_attn",  # LayerNorms of a parallel block (new architecture: 2)
            ),
            {
                "activation": "gelu",
                "multi_query": True,
                "new_decoder_architecture": False,
                "parallel_attn": True,
                "bias": False,
                "vocab_size": 65024,
                "max_position_embeddings": 2048,
                "tie_word_embeddings": True,
            },
            "FalconConfig",
            # RefinedWeb's names for layers / heads / KV heads / width (FalconConfig reads them)
            aliases={
                "n_layer": "num_hidden_layers",
                "n_head": "num_attention_heads",
                "n_head_kv": "num_kv_heads",
                "n_embed": "hidden_size",
            },
        ),
    )
}

MODEL_TYPES: dict[str, str] = {mt: f.name for f in FAMILIES.values() for mt in f.model_types}
ARCHITECTURES: dict[str, str] = {a: f.name for f in FAMILIES.values() for a in f.architectures}
WRAPPER_TYPES = {"gemma3", "llama4"}  # model_types whose config keeps the LM config in text_config


def family_list() -> str:
    return ", ".join(f"{f.name} ({'/'.join(f.model_types)})" for f in FAMILIES.values())
