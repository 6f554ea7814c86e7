"""gpubench: what LLM training and inference optimizations are worth on your hardware."""

from importlib import metadata as _metadata

try:
    __version__ = _metadata.version("gpubench")
except _metadata.PackageNotFoundError:  # running from a source tree without an install
    __version__ = "0.0.0+source"
