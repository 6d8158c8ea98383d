"""Bearer tokens: how QUIRE_API_TOKENS is read, and which Authorization values pass."""

from pathlib import Path

import pytest

from services.gateway.auth import TokenAuth, TokenError, load_tokens


@pytest.mark.parametrize(
    ("spec", "tokens"),
    [
        ("", set()),
        ("  ", set()),
        ("abc", {"abc"}),
        ("abc, def ,", {"abc", "def"}),
    ],
)
def test_load_tokens_from_a_list(spec: str, tokens: set[str]) -> None:
    assert load_tokens(spec) == tokens


def test_load_tokens_from_a_file(tmp_path: Path) -> None:
    path = tmp_path / "tokens"
    path.write_text("# operators\nt1\n\n  t2  \n")
    assert load_tokens(f"@{path}") == {"t1", "t2"}


@pytest.mark.parametrize("spec", ["@/nonexistent/tokens", ",,", "@EMPTY"])
def test_unreadable_or_empty_token_specs_are_errors(spec: str, tmp_path: Path) -> None:
    if spec == "@EMPTY":
        (tmp_path / "empty").write_text("# nothing\n")
        spec = f"@{tmp_path / 'empty'}"
    with pytest.raises(TokenError):
        load_tokens(spec)


@pytest.mark.parametrize(
    ("header", "allowed"),
    [
        ("Bearer t1", True),
        ("bearer t2", True),
        ("Bearer  t1 ", True),
        ("Bearer t3", False),
        ("Bearer ", False),
        ("Basic t1", False),
        ("t1", False),
        ("", False),
        (None, False),
    ],
)
def test_allows(header: str | None, allowed: bool) -> None:
    assert TokenAuth(frozenset({"t1", "t2"})).allows(header) is allowed


def test_no_tokens_means_no_authentication() -> None:
    auth = TokenAuth(frozenset())
    assert not auth.enabled and auth.allows(None)
