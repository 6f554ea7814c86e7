"""gpubench.lazy.LazyModule: a module imported at the first attribute read, not before; a module
that is not there fails there as `import` would."""

from __future__ import annotations

import subprocess
import sys

import pytest

from gpubench.lazy import LazyModule


def _printed(code: str) -> list[str]:
    """What ``code`` prints in a fresh interpreter, word by word."""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


def test_the_module_is_imported_at_the_first_attribute_read():
    code = (
        "import sys\nfrom gpubench.lazy import LazyModule\nm = LazyModule('colorsys')\n"
        "before = 'colorsys' in sys.modules\nvalue = m.rgb_to_hsv(1.0, 0.0, 0.0)\n"
        "import colorsys\nprint(before, 'colorsys' in sys.modules, value == colorsys.rgb_to_hsv(1.0, 0.0, 0.0), "
        "m.rgb_to_hsv is colorsys.rgb_to_hsv)"
    )
    assert _printed(code) == ["False", "True", "True", "True"]


def test_statistics_import_numpy_only_when_they_compute():
    """records.stats (which every command imports, through the records) leaves numpy unimported
    (0.1 s of a command's start) until a figure is computed, and then computes it as before."""
    code = (
        "import sys\nfrom gpubench.records import stats\nbefore = 'numpy' in sys.modules\n"
        "print(before, stats.median([3.0, 1.0, 2.0]), 'numpy' in sys.modules)"
    )
    assert _printed(code) == ["False", "2.0", "True"]


def test_a_missing_module_fails_at_its_first_use_as_import_would():
    missing = LazyModule("gpubench_no_such_module")
    assert "gpubench_no_such_module" in repr(missing)
    with pytest.raises(ModuleNotFoundError, match="gpubench_no_such_module"):
        missing.anything  # noqa: B018 - the read is the test
    with pytest.raises(AttributeError):
        LazyModule("colorsys").no_such_function  # noqa: B018


def test_a_lazy_module_copies_and_pickles_without_importing():
    """copy and pickle look for special methods before the object is whole: they get none, not a
    loop (a RecursionError) and not an import."""
    import copy
    import pickle

    lazy = LazyModule("gpubench_no_such_module")
    for again in (copy.deepcopy(lazy), pickle.loads(pickle.dumps(lazy))):
        assert repr(again) == repr(lazy)
    assert LazyModule("colorsys").__name__ == "colorsys"  # a module's own names still read through
