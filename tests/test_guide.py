"""`sglang-deploy docs`: the guide's pages as the tool carries them, listed with their titles, one printed as it is
written; a page that does not exist is refused naming the nearest, exit 2."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.cli import sglang_deploy

from deploy_cli.program import NAME
from deploy_lib import program_name
from deploy_lib.errors import ConfigError
from deploy_lib.guide import GUIDE_DIR, guide_page, guide_pages

DOCS = Path(__file__).resolve().parent.parent / "docs"


@pytest.fixture(autouse=True)
def installed(monkeypatch: pytest.MonkeyPatch) -> None:
    """Messages name the program as the installed command's entry point sets it."""
    monkeypatch.setattr(program_name, "_running", NAME)



def test_in_the_checkout_the_pages_are_docs_each_with_its_first_heading_the_first_page_first() -> None:
    assert GUIDE_DIR == DOCS
    pages = guide_pages()
    assert pages[0].name == "index"
    assert {page.name for page in pages} == {path.stem for path in DOCS.glob("*.md")}
    titles = {page.name: page.title for page in pages}
    assert titles["troubleshooting"] == "Troubleshooting: what each exit code means, and what to run next"


@pytest.mark.parametrize("given", ["profiles", "profiles.md", "docs/profiles.md", "Profiles"])
def test_a_page_is_found_by_its_name_as_the_list_or_a_link_spells_it(given: str) -> None:
    assert guide_page(given).path == DOCS / "profiles.md"


def test_a_page_that_does_not_exist_is_refused_naming_the_nearest() -> None:
    with pytest.raises(ConfigError, match=r"--page: no page 'troubleshoting' in the guide; did you mean "
                                          r"`troubleshooting`\?"):
        guide_page("troubleshoting")


def test_a_directory_without_pages_says_the_install_is_incomplete(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no pages of the guide here"):
        guide_pages(tmp_path)


def test_docs_lists_the_pages_then_prints_the_one_asked_for_as_written(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = sglang_deploy("docs", capsys)
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split() == ["index", "sglang-deploy"] and len(lines) == len(list(DOCS.glob("*.md"))) + 1
    assert lines[-1] == f"`sglang-deploy docs --page NAME` prints one; the files are in {DOCS}"
    code, out, _ = sglang_deploy("docs getting-started", capsys)
    assert code == 0 and out == (DOCS / "getting-started.md").read_text()
    code, out, _ = sglang_deploy("docs --page reference --path", capsys)
    assert code == 0 and out == f"{DOCS / 'reference.md'}\n"


def test_docs_refuses_a_page_it_does_not_have_with_exit_2_and_no_traceback(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = sglang_deploy("docs profile", capsys)
    assert (code, out) == (2, "")
    assert err == ("error: --page: no page 'profile' in the guide; did you mean `profiles`?\n"
                   "hint: `sglang-deploy docs` lists the pages\n")
