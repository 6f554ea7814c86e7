"""Triton autotuning done once per GPU model, not once per sequence length and process.

``triton.autotune`` benchmarks every candidate tile the first time it meets a new value of its
key, and forgets it all when the process ends. Keyed on exact sequence lengths, a varlen
training loop whose longest document changes every batch would re-tune every step (flash-attn's
own kernels never tune at run time), and every worker process of every run re-tunes the same
shapes. Here the kernels key on power-of-two length buckets (:func:`length_bucket`; any tile is
correct for any length, so a bucket only costs speed at its edges), and :class:`PersistentAutotuner`
keeps the tunings on disk per GPU model and Triton version, under
:func:`gpubench.measure.devicecache.cache_root`, so a second run tunes nothing.

It leaves the tuning itself to Triton (its benchmarking, pruning and the skipping of configs that
do not fit): it only seeds the autotuner's in-memory table (``Autotuner.cache``, key -> Config)
from the file before a launch, and writes the table back when a launch added to it.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import torch

from gpubench.measure.devicecache import cache_root, locked, read_cache_doc, slug
from gpubench.records import notices
from gpubench.records.atomic import atomic_write_json

SCHEMA = 1


def length_bucket(n: int) -> int:
    """The autotuning key of a sequence length: the next power of two, at least 16."""
    return max(16, 1 << (max(int(n), 1) - 1).bit_length())


def gpu_model(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def _describe(config: Any) -> dict[str, Any]:
    """What identifies a candidate: its meta-parameters and launch options."""
    return {
        "kwargs": dict(config.kwargs),
        "num_warps": config.num_warps,
        "num_stages": config.num_stages,
        "num_ctas": getattr(config, "num_ctas", 1),
        "maxnreg": getattr(config, "maxnreg", None),
    }


def _read(path: Path) -> list[dict[str, Any]]:
    """The entries of a tunings file; an unreadable or foreign one counts as empty (it is a cache:
    the worst it costs is a new tuning)."""
    doc = read_cache_doc(path, SCHEMA)
    if doc is None or not isinstance(doc.get("entries"), list):
        return []
    return [
        e
        for e in doc["entries"]
        if isinstance(e, dict) and isinstance(e.get("key"), list) and isinstance(e.get("config"), dict)
    ]


class PersistentAutotuner:
    """``tuner[grid](*args, **kwargs)`` as for the ``triton.autotune``-decorated kernel ``tuner``,
    with its tunings read from and written to ``<cache_root>/autotune/<GPU model>/triton-<version>/<name>.json``.

    ``tuned`` and ``reused`` count this process's keys that were benchmarked here and that came
    from the file. One process is one GPU model (a worker per device): the first launch on a
    model loads that model's file.
    """

    def __init__(self, tuner: Any, name: str):
        self.tuner = tuner
        self.name = name
        self.tuned = 0
        self.reused = 0
        self._paths: dict[torch.device, Path] = {}  # loaded already, by device (a launch stays cheap)

    def path(self, device: torch.device) -> Path:
        import triton

        return (
            cache_root() / "autotune" / slug(gpu_model(device)) / f"triton-{triton.__version__}" / f"{self.name}.json"
        )

    def __getitem__(self, grid: Any) -> Any:
        return functools.partial(self._launch, grid)

    def _launch(self, grid: Any, *args: Any, **kwargs: Any) -> Any:
        device = next(a.device for a in args if isinstance(a, torch.Tensor))
        path = self._paths.get(device)
        if path is None:
            path = self._paths[device] = self.path(device)
            self.reused += self.load(path)
        before = len(self.tuner.cache)  # Triton only ever adds to it
        result = self.tuner[grid](*args, **kwargs)
        if len(self.tuner.cache) != before:
            new = list(self.tuner.cache)[before:]
            self.tuned += len(new)
            try:
                self.save(path, new)
                kept = f"kept in {path} for later runs"
            except OSError as exc:  # a cache: a home that cannot be written costs the next run a tuning
                kept = f"not kept ({exc})"
            notices.notice(
                f"autotuned Triton kernel {self.name} for {len(new)} new shape(s) on {gpu_model(device)}; {kept}"
            )
        return result

    def load(self, path: Path) -> int:
        """Seed the autotuner's table from ``path`` (keys it has already stay); how many keys it took.
        An entry whose config is no longer among the kernel's candidates is ignored."""
        candidates = {json.dumps(_describe(c), sort_keys=True): c for c in self.tuner.configs}
        taken = 0
        for entry in _read(path):
            key = tuple(entry["key"])
            config = candidates.get(json.dumps(entry["config"], sort_keys=True))
            if config is not None and key not in self.tuner.cache:
                self.tuner.cache[key] = config
                taken += 1
        return taken

    def save(self, path: Path, keys: list[tuple]) -> None:
        """Add the tunings of ``keys`` to ``path`` (merged with what other processes wrote)."""
        import triton

        with locked(path):
            entries = {json.dumps(e["key"]): e for e in _read(path)}
            for key in keys:
                try:
                    text = json.dumps(list(key))
                except TypeError:  # a key value JSON cannot hold: tune it again next time
                    continue
                entries[text] = {"key": list(key), "config": _describe(self.tuner.cache[key])}
            atomic_write_json(
                path,
                {
                    "schema": SCHEMA,
                    "kernel": self.name,
                    "triton": triton.__version__,
                    "entries": list(entries.values()),
                },
            )
