"""The site's home page is the README, so that the front page is written once: `on_files` (a MkDocs hook,
named in mkdocs.yml) adds index.md, made from README.md with its links rewritten from the repository's
root to the docs folder's (`docs/running.md` -> `running.md`). A link to a file outside docs/ keeps its
text and shows its path as code, since the site has no such page; --strict checks every other link and
anchor of the README as it checks the pages'."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"
LINK = re.compile(r"(!?)\[([^\]]*)\]\(([^)\s]+)\)")


def _rewritten(match: re.Match) -> str:
    image, label, target = match.groups()
    if target.startswith(("http://", "https://", "#")):
        return match.group(0)
    if target.startswith("docs/"):
        return f"{image}[{label}]({target.removeprefix('docs/')})"
    shown = f"`{target}`"
    return label if label == shown else f"{label} ({shown})"


def front_page(readme: str) -> str:
    return LINK.sub(_rewritten, readme)


def on_files(files, config):
    from mkdocs.structure.files import File

    files.append(File.generated(config, "index.md", content=front_page(README.read_text())))
    return files
