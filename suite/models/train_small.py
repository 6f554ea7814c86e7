"""A pair of small byte-level decoders trained briefly on a corpus that ships with Python, so that
a draft model and a target model *really* agree (or not) on what comes next.

Speculative decoding is only worth measuring with a real agreement between draft and target: a
configured acceptance rate would measure nothing. Two randomly initialized models agree on almost
nothing, so the default pair is trained, deterministically and in a few tens of seconds on a CPU:

- **corpus**: the source text of a few standard-library modules (read through ``inspect``, so it
  ships with every Python that keeps its sources), as bytes: a vocabulary of 256, no tokenizer.
  The last tenth of the text is held out: prompts come from there, so generation is measured on
  text neither model was trained on.
- **models**: Llama-shaped (:mod:`gpubench.models.llama`), a 6-layer target (~0.9M parameters)
  and a 1-layer draft (~0.2M), trained with AdamW on next-byte prediction from the same seed, one
  CPU thread, deterministic algorithms, fixed batch order.
- **cache**: the trained weights are stored under :func:`gpubench.measure.devicecache.cache_root` (``$GPUBENCH_CACHE_DIR``, default
  ``~/.cache/gpubench``), in ``spec_pair/<key>.pt`` where the key hashes the corpus, the configs
  and the training recipe; a later run loads them in milliseconds. A file that cannot be read, or
  whose contents do not match the key, is rebuilt, never trusted.
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import json
import math
import os
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from gpubench.models.llama import (
    LayerWeights,
    LlamaConfig,
    LlamaWeights,
    batched_causal_attention,
    forward,
    random_weights,
)
from gpubench.records.notices import notice

# Modules whose source makes the corpus (~300 KB of Python); any that cannot be read is skipped.
CORPUS_MODULES = (
    "textwrap",
    "string",
    "difflib",
    "argparse",
    "json.decoder",
    "json.encoder",
    "shlex",
    "heapq",
    "fnmatch",
    "glob",
    "calendar",
    "pprint",
)
HELD_OUT_FRACTION = 0.1
MIN_CORPUS_BYTES = 50_000
FORMAT_VERSION = 1

TARGET_CONFIG = LlamaConfig(
    vocab_size=256, hidden_size=128, num_layers=6, num_heads=4, num_kv_heads=2, head_dim=32, intermediate_size=256
)
# One layer as wide as the target's: on a CPU and on a GPU alike a model this small costs per layer
# (kernel launches, Python), not per weight, so width is almost free and depth is what c counts.
DRAFT_CONFIG = LlamaConfig(
    vocab_size=256, hidden_size=128, num_layers=1, num_heads=4, num_kv_heads=2, head_dim=32, intermediate_size=256
)


@dataclass(frozen=True)
class Recipe:
    """How one model of the pair is trained."""

    steps: int
    batch: int = 16
    seq_len: int = 64
    lr: float = 3e-3
    warmup: int = 10
    weight_decay: float = 0.01
    seed: int = 0


TARGET_RECIPE = Recipe(steps=150, seed=1)
DRAFT_RECIPE = Recipe(steps=300, seed=2)  # the draft is cheap to train: twice the steps


# -- corpus -------------------------------------------------------------------------------------


def corpus_bytes(modules: tuple[str, ...] = CORPUS_MODULES) -> bytes:
    """The corpus: the named standard-library modules' source, concatenated in order."""
    parts = []
    for name in modules:
        try:
            parts.append(inspect.getsource(importlib.import_module(name)))
        except (ImportError, OSError, TypeError):
            continue  # a Python without this module's source: the rest still makes a corpus
    data = "\n\n".join(parts).encode("utf-8")
    if len(data) < MIN_CORPUS_BYTES:
        raise RuntimeError(
            f"the standard library's sources are not available here (found {len(data)} bytes "
            f"of {', '.join(modules)}); the default speculative-decoding model pair is trained on them"
        )
    return data


def split_corpus(data: bytes) -> tuple[torch.Tensor, torch.Tensor]:
    """(train, held_out) byte tensors (int64): the last HELD_OUT_FRACTION is held out."""
    tokens = torch.frombuffer(bytearray(data), dtype=torch.uint8).to(torch.int64)
    cut = int(len(tokens) * (1 - HELD_OUT_FRACTION))
    return tokens[:cut], tokens[cut:]


# -- training -----------------------------------------------------------------------------------


def _train_attend(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return batched_causal_attention(q, k, v)


def init_weights(config: LlamaConfig, seed: int) -> LlamaWeights:
    """Seeded initial weights for training: :func:`random_weights` with the output head scaled to a
    gain of 1 (random_weights' wide logits suit untrained decoding, not a first loss near ln 256)."""
    w = random_weights(config, seed)
    w.lm_head = w.lm_head / 4.0
    return w


def train(config: LlamaConfig, recipe: Recipe, train_tokens: torch.Tensor) -> tuple[LlamaWeights, list[float]]:
    """Train one model on next-byte prediction; returns the weights and the loss per step.

    Deterministic: seeded initialization and batch offsets, one thread, deterministic algorithms.
    """
    threads = torch.get_num_threads()
    deterministic = torch.are_deterministic_algorithms_enabled()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    try:
        weights = init_weights(config, recipe.seed)
        params = weights.parameters()
        for p in params:
            p.requires_grad_(True)
        decay = [p for p in params if p.dim() == 2]
        no_decay = [p for p in params if p.dim() < 2]
        opt = torch.optim.AdamW(
            [{"params": decay, "weight_decay": recipe.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
            lr=recipe.lr,
            betas=(0.9, 0.95),
            foreach=False,
        )
        g = torch.Generator().manual_seed(recipe.seed + 1000)
        positions = torch.arange(recipe.seq_len).expand(recipe.batch, -1)
        window = torch.arange(recipe.seq_len + 1)
        losses = []
        for step in range(recipe.steps):
            scale = min(1.0, (step + 1) / recipe.warmup) * 0.5 * (1 + math.cos(math.pi * step / recipe.steps))
            for group in opt.param_groups:
                group["lr"] = recipe.lr * max(scale, 0.05)
            starts = torch.randint(0, len(train_tokens) - recipe.seq_len - 1, (recipe.batch, 1), generator=g)
            chunk = train_tokens[starts + window]
            logits = forward(weights, chunk[:, :-1], positions, _train_attend)
            loss = F.cross_entropy(logits.reshape(-1, config.vocab_size), chunk[:, 1:].reshape(-1))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0, foreach=False)
            opt.step()
            losses.append(float(loss.detach()))
        for p in params:
            p.requires_grad_(False)
        return weights, losses
    finally:
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(deterministic)


def evaluate(weights: LlamaWeights, tokens: torch.Tensor, seq_len: int = 128, windows: int = 8) -> float:
    """Mean next-byte cross-entropy (nats) over ``windows`` evenly spaced windows of ``tokens``."""
    stride = max(1, (len(tokens) - seq_len - 1) // windows)
    starts = torch.arange(windows) * stride
    chunk = tokens[starts[:, None] + torch.arange(seq_len + 1)]
    with torch.inference_mode():
        logits = forward(weights, chunk[:, :-1], torch.arange(seq_len).expand(windows, -1), _train_attend)
        return float(F.cross_entropy(logits.reshape(-1, weights.config.vocab_size), chunk[:, 1:].reshape(-1)))


# -- the cached pair ----------------------------------------------------------------------------


@dataclass
class TrainedPair:
    target: LlamaWeights
    draft: LlamaWeights
    held_out: torch.Tensor  # int64 bytes the models were not trained on: where prompts come from
    info: dict[str, Any]  # key, corpus digest, losses, build seconds, whether it came from the cache


def cache_dir() -> Path:
    from gpubench.measure.devicecache import cache_root

    return cache_root()


def pair_key(
    corpus_digest: str,
    target: LlamaConfig = TARGET_CONFIG,
    draft: LlamaConfig = DRAFT_CONFIG,
    target_recipe: Recipe = TARGET_RECIPE,
    draft_recipe: Recipe = DRAFT_RECIPE,
) -> str:
    """What the cached weights depend on, hashed: a change to any of it trains a new pair."""
    spec = {
        "format": FORMAT_VERSION,
        "corpus": corpus_digest,
        "modules": CORPUS_MODULES,
        "held_out": HELD_OUT_FRACTION,
        "target": target.to_dict(),
        "draft": draft.to_dict(),
        "target_recipe": asdict(target_recipe),
        "draft_recipe": asdict(draft_recipe),
        "torch": torch.__version__.split("+")[0],
    }
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]


def _state(weights: LlamaWeights) -> dict[str, torch.Tensor]:
    out = {"embed": weights.embed, "final_norm": weights.final_norm, "lm_head": weights.lm_head}
    for i, layer in enumerate(weights.layers):
        for name in LayerWeights.__dataclass_fields__:
            out[f"layers.{i}.{name}"] = getattr(layer, name)
    return {k: v.detach().contiguous().clone() for k, v in out.items()}


def _from_state(config: LlamaConfig, state: dict[str, torch.Tensor], source: str) -> LlamaWeights:
    """Weights from a state dict, checking every tensor's shape against ``config`` (ValueError)."""
    like = _state(random_weights(config, 0))
    if set(state) != set(like):
        raise ValueError(f"tensor names differ: {sorted(set(state) ^ set(like))[:4]}")
    for name, ref in like.items():
        t = state[name]
        if not isinstance(t, torch.Tensor) or t.shape != ref.shape or t.dtype != torch.float32:
            raise ValueError(f"{name}: {getattr(t, 'shape', type(t))} does not match {tuple(ref.shape)} float32")
        if not torch.isfinite(t).all():
            raise ValueError(f"{name}: non-finite values")
    layers = [
        LayerWeights(**{n: state[f"layers.{i}.{n}"] for n in LayerWeights.__dataclass_fields__})
        for i in range(config.num_layers)
    ]
    return LlamaWeights(config, state["embed"], layers, state["final_norm"], state["lm_head"], source=source)


def _load(
    path: Path, key: str, target_config: LlamaConfig, draft_config: LlamaConfig
) -> tuple[LlamaWeights, LlamaWeights, dict[str, Any]]:
    blob = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(blob, dict) or blob.get("key") != key:
        raise ValueError("not a model pair of this key")
    info = json.loads(blob["info"])
    target = _from_state(target_config, blob["target"], f"trained target ({path})")
    draft = _from_state(draft_config, blob["draft"], f"trained draft ({path})")
    return target, draft, info


def _save(path: Path, key: str, target: LlamaWeights, draft: LlamaWeights, info: dict[str, Any]) -> None:
    """Write atomically: a reader sees the old file, no file, or the whole new one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save({"key": key, "info": json.dumps(info), "target": _state(target), "draft": _state(draft)}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


_MEMO: dict[tuple[str, str], TrainedPair] = {}


def trained_pair(
    directory: Path | str | None = None,
    *,
    target_config: LlamaConfig = TARGET_CONFIG,
    draft_config: LlamaConfig = DRAFT_CONFIG,
    target_recipe: Recipe = TARGET_RECIPE,
    draft_recipe: Recipe = DRAFT_RECIPE,
) -> TrainedPair:
    """The (target, draft) pair: from the in-process memo, else the disk cache (``directory``,
    default :func:`cache_dir`), else trained now and cached. A cache file that cannot be read or
    does not match is rebuilt (``info["rebuilt_because"]`` says why). The defaults are the pair the
    benchmark uses; tests pass smaller configs and recipes."""
    data = corpus_bytes()
    digest = hashlib.sha256(data).hexdigest()
    key = pair_key(digest, target_config, draft_config, target_recipe, draft_recipe)
    root = Path(directory) if directory is not None else cache_dir()
    path = root / "spec_pair" / f"{key}.pt"
    memo = _MEMO.get((str(path), key))
    if memo is not None:
        return memo
    train_tokens, held_out = split_corpus(data)
    target = draft = None
    problem = None
    if path.is_file():
        try:
            target, draft, info = _load(path, key, target_config, draft_config)
            info = {**info, "from_cache": True, "cache_path": str(path)}
        except Exception as exc:  # noqa: BLE001 - any unreadable cache is rebuilt, never trusted
            problem = f"{type(exc).__name__}: {exc}"
            target = draft = None
    if target is None or draft is None:
        # ~25 s on a 2-core CPU (this project's machine; build_s in the cached info) with nothing said
        # would look like a hang.
        notice(
            f"speculative_decoding: training the draft and target models once (25-45 s on a 2-core CPU; `gpubench prepare` does it ahead); "
            f"cached in {path}" + (f" (the cached file was unusable: {problem})" if problem else "")
        )
        t0 = time.perf_counter()
        target, target_losses = train(target_config, target_recipe, train_tokens)
        draft, draft_losses = train(draft_config, draft_recipe, train_tokens)
        info = {
            "key": key,
            "corpus_sha256": digest,
            "corpus_bytes": len(data),
            "modules": list(CORPUS_MODULES),
            "build_s": time.perf_counter() - t0,
            "target_params": target_config.num_params(),
            "draft_params": draft_config.num_params(),
            "target_train_loss": target_losses[-1],
            "draft_train_loss": draft_losses[-1],
            "target_held_out_loss": evaluate(target, held_out),
            "draft_held_out_loss": evaluate(draft, held_out),
        }
        _save(path, key, target, draft, info)
        info = {**info, "from_cache": False, "cache_path": str(path), "rebuilt_because": problem}
    pair = TrainedPair(target, draft, held_out, info)
    _MEMO[(str(path), key)] = pair
    return pair
