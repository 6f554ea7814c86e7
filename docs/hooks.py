"""MkDocs hook (mkdocs.yml `hooks:`): a table cell's code span keeps its pipes escaped (`a\\|b`) so
GitHub's renderer does not split the cell there; Python-Markdown never splits inside a code span
and would print the backslash, so the site's build drops it."""

import re

_CODE = re.compile(r"`[^`\n]*`")


def on_page_markdown(markdown: str, **_: object) -> str:
    return "\n".join(
        _CODE.sub(lambda m: m.group(0).replace("\\|", "|"), line) if line.startswith("|") else line
        for line in markdown.split("\n")
    )
