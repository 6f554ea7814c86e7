"""The report's templates are compiled once per user (reports/html.py's bytecode cache): a cache
file cut short, or a folder that cannot be written, costs only the compile it would have saved,
and the compile options and jinja2's version are part of the cache's key."""

from __future__ import annotations

import jinja2

from gpubench.reports import html


def environment(cache_dir, **options) -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.DictLoader({"t.j2": "{% if x %}\n<b>{{ x }}</b>\n{% endif %}"}),
        bytecode_cache=html._TemplateCache(str(cache_dir)),
        **options,
    )


def test_a_damaged_cache_file_is_compiled_again_not_a_failed_report(tmp_path):
    first = environment(tmp_path, autoescape=True)
    assert first.get_template("t.j2").render(x="<i>") == "\n<b>&lt;i&gt;</b>\n"
    files = list(tmp_path.iterdir())
    assert files, "the compiled template was not cached"
    for f in files:
        f.write_bytes(f.read_bytes()[:40])  # cut short: the pickle inside is truncated
    again = environment(tmp_path, autoescape=True)
    assert again.get_template("t.j2").render(x="<i>") == "\n<b>&lt;i&gt;</b>\n"


def test_a_cache_folder_that_cannot_be_written_costs_nothing_but_the_compile(tmp_path):
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("a file where the cache folder would be")
    env = environment(blocked, autoescape=True)
    assert env.get_template("t.j2").render(x="y") == "\n<b>y</b>\n"


def test_the_cache_key_names_the_compile_options_and_jinja2s_version(monkeypatch):
    """jinja2 keys its cache on a template's name and source only: a changed option or an upgrade
    must not be served code compiled the old way."""
    pattern = html._template_cache().pattern
    monkeypatch.setitem(html._TEMPLATE_OPTIONS, "trim_blocks", False)
    assert html._template_cache().pattern != pattern
    monkeypatch.undo()
    monkeypatch.setattr(jinja2, "__version__", "99.0")
    assert html._template_cache().pattern != pattern
