"""The target and draft models of a speculative decoding case, named as a scenario names them:
``trained`` (the default pair, :mod:`gpubench.models.train_small`), a local Hugging Face
checkpoint directory, or (draft only) ``early:N``, the target's first N layers. Their rules, their
loading onto a device, and the held-out text prompts are drawn from (in the target's tokens).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from gpubench.errors import BadInput
from gpubench.lib.optional import optional_import
from gpubench.models import stand_in, train_small
from gpubench.models.decode_cache import KVCache
from gpubench.models.llama import LlamaWeights, load_hf

TRAINED = "trained"


def _early_layers(spec: str) -> int | None:
    """N of ``early:N`` (-1 when N is not a whole number), None for any other spec."""
    if not spec.startswith("early:"):
        return None
    try:
        return int(spec.split(":", 1)[1])
    except ValueError:
        return -1


def _hf_layers(path: str) -> int | None:
    """A checkpoint's layer count, None when its config cannot say."""
    try:
        return int(json.loads((Path(path) / "config.json").read_text())["num_hidden_layers"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def pair_problems(target: str, draft: str | None) -> list[str]:
    """What is wrong with a target and a draft (None: no draft model) as named."""
    problems = []
    if target != TRAINED and not (Path(target) / "config.json").is_file():
        problems.append(f"target {target!r} is neither 'trained' nor a checkpoint directory holding config.json")
    if draft is None:
        return problems
    if draft.startswith("early:"):
        layers = train_small.TARGET_CONFIG.num_layers if target == TRAINED else _hf_layers(target)
        if problem := stand_in.early_draft_problem(draft, layers):
            problems.append(problem)
    elif draft == TRAINED:
        if target != TRAINED:
            problems.append(
                "draft 'trained' pairs only with target 'trained' (they share the byte "
                "vocabulary); give a draft checkpoint or early:N for a checkpoint target"
            )
    elif not (Path(draft) / "config.json").is_file():
        problems.append(
            f"draft {draft!r} is neither 'trained', 'early:N' nor a checkpoint directory holding config.json"
        )
    return problems


def _moved(weights: LlamaWeights, device: torch.device, dtype: torch.dtype) -> LlamaWeights:
    """A copy of ``weights`` on ``device`` in ``dtype`` (a fresh RoPE cache)."""
    move = lambda t: t.to(device=device, dtype=dtype)
    layers = [
        replace(layer, **{n: move(getattr(layer, n)) for n in layer.__dataclass_fields__}) for layer in weights.layers
    ]
    embed = move(weights.embed)
    lm_head = embed if weights.lm_head is weights.embed else move(weights.lm_head)
    return LlamaWeights(weights.config, embed, layers, move(weights.final_norm), lm_head, source=weights.source)


def early_layers(weights: LlamaWeights, n: int) -> LlamaWeights:
    """The target's first ``n`` layers with its embedding, final norm and head: a draft that costs
    n / layers of the target per token and needs no training (and agrees with it far less)."""
    return LlamaWeights(
        replace(weights.config, num_layers=n),
        weights.embed,
        weights.layers[:n],
        weights.final_norm,
        weights.lm_head,
        source=f"first {n} layers of {weights.source}",
    )


def _checkpoint_tokens(path: str, vocab: int) -> torch.Tensor:
    """The held-out corpus text in a checkpoint's own tokens (its tokenizer, read locally), or as
    bytes when it has no tokenizer and a vocabulary of at least 256."""
    text = bytes(train_small.split_corpus(train_small.corpus_bytes())[1].tolist()).decode("utf-8", "ignore")
    auto_tokenizer, tokenizer = optional_import("transformers", "AutoTokenizer"), None
    if not isinstance(auto_tokenizer, str):  # a str: why transformers cannot be imported
        try:
            tokenizer = auto_tokenizer.from_pretrained(path, local_files_only=True)
        except Exception:  # noqa: BLE001 - no tokenizer files there: bytes, if the vocabulary holds them
            pass
    if tokenizer is not None:
        return torch.tensor(tokenizer(text, add_special_tokens=False)["input_ids"], dtype=torch.long)
    if vocab < 256:
        raise BadInput(
            f"{path}: no tokenizer could be read there and the vocabulary ({vocab}) is too small "
            "for byte tokens; add the tokenizer files to the checkpoint directory"
        )
    return torch.tensor(list(text.encode("utf-8")), dtype=torch.long)


def _warm_up(weights: LlamaWeights) -> None:
    """One small forward pass, so lazy initialization is not charged to the first checked call."""
    with torch.inference_mode():
        KVCache(weights, 8).forward(list(range(4)))


@dataclass
class DecodePair:
    target: LlamaWeights
    draft: LlamaWeights | None  # None: no draft model (prompt lookup drafts)
    held_out: torch.Tensor  # text no model was trained on, in the target's tokens


def load_pair(target_spec: str, draft_spec: str | None, device: torch.device, dtype: torch.dtype) -> DecodePair:
    """The models named, on ``device`` in ``dtype``, each warmed up by one small forward pass."""
    if target_spec == TRAINED or draft_spec == TRAINED:
        pair = train_small.trained_pair()
    if target_spec == TRAINED:
        target, held_out = _moved(pair.target, device, dtype), pair.held_out
    else:
        target = load_hf(target_spec, dtype, device)
        held_out = _checkpoint_tokens(target_spec, target.config.vocab_size)
    draft = None
    if draft_spec == TRAINED:
        draft = _moved(pair.draft, device, dtype)
    elif draft_spec is not None and (layers := _early_layers(draft_spec)) is not None:
        draft = early_layers(target, layers)
    elif draft_spec is not None:
        draft = load_hf(draft_spec, dtype, device)
        if draft.config.vocab_size != target.config.vocab_size:
            raise BadInput(
                f"draft {draft_spec}: vocabulary of {draft.config.vocab_size} tokens differs from the "
                f"target's {target.config.vocab_size}; a draft must share the target's tokenizer"
            )
    for model in (draft, target):
        if model is not None:
            _warm_up(model)
    return DecodePair(target, draft, held_out)
