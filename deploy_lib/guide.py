"""The user guide's pages (docs/*.md), as the installed tool carries them: `sglang-deploy docs` lists them and prints
the one asked for, as `kamal docs` prints its configuration docs. In a checkout they are docs/; a wheel carries the
same files as deploy_lib/guide/ (pyproject.toml maps them)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from deploy_lib.bundled import bundled_dir
from deploy_lib.errors import ConfigError, did_you_mean

GUIDE_DIR = bundled_dir("guide", "docs")
FIRST_PAGE = "index"


@dataclass(frozen=True)
class GuidePage:
    name: str  # the file's name without .md: `profiles`
    title: str  # its first heading
    path: Path

    def text(self) -> str:
        return self.path.read_text(encoding="utf-8")


def _page(path: Path) -> GuidePage:
    heading = re.search(r"^# (.+)$", path.read_text(encoding="utf-8"), re.MULTILINE)
    return GuidePage(path.stem, heading.group(1).strip() if heading else path.stem, path)


def guide_pages(directory: Path = GUIDE_DIR) -> list[GuidePage]:
    """Every page, the guide's first page first, then by name."""
    paths = sorted(directory.glob("*.md"), key=lambda path: (path.stem != FIRST_PAGE, path.stem))
    if not paths:
        raise ConfigError(f"{directory}: no pages of the guide here; this install of sglang-deploy is incomplete",
                          hint="install it again: pip install --force-reinstall sglang-deploy")
    return [_page(path) for path in paths]


def guide_page(name: str, directory: Path = GUIDE_DIR) -> GuidePage:
    """The page NAME (`profiles`, `profiles.md` or `docs/profiles.md`); an unknown name is refused naming the
    nearest."""
    pages = {page.name: page for page in guide_pages(directory)}
    wanted = Path(name.strip()).name.removesuffix(".md").lower()
    if wanted not in pages:
        raise ConfigError(f"--page: no page {name!r} in the guide{did_you_mean(wanted, pages)}",
                          hint="`invoke docs` lists the pages")
    return pages[wanted]


__all__ = ["GUIDE_DIR", "GuidePage", "guide_page", "guide_pages"]
