"""Bounded pagination: every listing ends, with its items or one line saying why it was cut short."""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from typing import Any

import pytest
from example_budget import capped
from hypothesis import given, settings
from hypothesis import strategies as st

from btk.pagination import MAX_PAGES, PaginationError, paginate


class Pages:
    """A listing that answers from a script of pages (the last one repeats) and counts the calls."""

    def __init__(self, pages: list[Any]) -> None:
        self.pages = pages
        self.tokens: list[str | None] = []

    def __call__(self, token: str | None) -> Any:
        self.tokens.append(token)
        return self.pages[min(len(self.tokens), len(self.pages)) - 1]


def listing(fetch: Any, **options: Any) -> list[Any]:
    return list(paginate(fetch, operation="sagemaker:ListThings", result_key="Things", **options))


def test_follows_each_token_once_and_returns_every_item() -> None:
    fetch = Pages([{"Things": [1, 2], "NextToken": "a"}, {"Things": [3], "NextToken": "b"}, {"Things": [4]}])
    assert listing(fetch) == [1, 2, 3, 4]
    assert fetch.tokens == [None, "a", "b"]


@pytest.mark.parametrize("last", [{}, {"NextToken": None}, {"NextToken": ""}, {"Things": None}, {"Things": []}])
def test_a_page_without_items_or_token_ends_the_listing(last: dict[str, Any]) -> None:
    assert listing(Pages([{"Things": [1], "NextToken": "a"}, last])) == [1]


def test_a_token_given_again_stops_the_listing_with_one_line() -> None:
    """The answer that made ``btk capacity show`` hang: the same NextToken on every page."""
    fetch = Pages([{"Things": [1], "NextToken": "same"}])
    with pytest.raises(PaginationError) as raised:
        listing(fetch)
    assert str(raised.value) == (
        "sagemaker:ListThings repeated a page token after 2 pages (the listing would never end); retry later"
    )
    assert fetch.tokens == [None, "same"]


def test_a_cycle_of_tokens_is_caught_too() -> None:
    fetch = Pages([{"NextToken": "a"}, {"NextToken": "b"}, {"NextToken": "a"}])
    with pytest.raises(PaginationError, match="repeated a page token after 3 pages"):
        listing(fetch)
    assert len(fetch.tokens) == 3


def test_pages_that_never_run_out_stop_at_the_limit() -> None:
    counter = itertools.count()
    calls: list[str | None] = []

    def endless(token: str | None) -> Mapping[str, Any]:
        calls.append(token)
        return {"Things": [0], "NextToken": f"t{next(counter)}"}

    with pytest.raises(PaginationError, match=r"^sagemaker:ListThings gave more than 5 pages"):
        listing(endless, max_pages=5)
    assert len(calls) == 5
    assert MAX_PAGES * 100 >= 100_000  # 100 items a page (MaxResults) reach this far before the limit


@pytest.mark.parametrize(
    ("page", "words"),
    [
        (None, "answered page 1 with NoneType, not an object"),
        ([1], "answered page 1 with list, not an object"),
        ({"Things": "abc"}, "with Things of type str"),
        ({"Things": {"a": 1}}, "with Things of type dict"),
        ({"Things": [], "NextToken": 7}, "a NextToken that is not text"),
        ({"Things": [], "NextToken": ["a"]}, "a NextToken that is not text"),
    ],
)
def test_answers_outside_the_documented_shape_are_one_line(page: Any, words: str) -> None:
    with pytest.raises(PaginationError, match=words):
        listing(Pages([page]))


def test_the_callers_error_type_carries_the_line() -> None:
    class MineError(Exception):
        pass

    with pytest.raises(MineError, match="repeated a page token"):
        listing(Pages([{"NextToken": "x"}]), error=MineError)
    with pytest.raises(ValueError, match="max_pages"):
        listing(Pages([{}]), max_pages=0)


def test_another_token_key_is_followed() -> None:
    fetch = Pages([{"Things": [1], "nextToken": "a"}, {"Things": [2]}])
    assert listing(fetch, token_key="nextToken") == [1, 2]


TOKENS = st.one_of(st.none(), st.sampled_from(["", "a", "b", "c"]), st.integers(), st.lists(st.text(max_size=1)))
ITEMS = st.one_of(st.none(), st.lists(st.integers(), max_size=3), st.text(max_size=2))
PAGE = st.one_of(
    st.fixed_dictionaries({}, optional={"Things": ITEMS, "NextToken": TOKENS}),
    st.none(),
    st.integers(),
)


@settings(max_examples=capped(500), deadline=None)
@given(pages=st.lists(PAGE, min_size=1, max_size=8), limit=st.integers(min_value=1, max_value=6))
def test_any_answer_ends_with_its_items_or_one_line(pages: list[Any], limit: int) -> None:
    """Generated answers (repeated, missing, null and non-text tokens; null and non-list items): never a hang,
    never another exception; a listing that completes has followed distinct tokens and returns every item."""
    fetch = Pages(pages)
    try:
        items = listing(fetch, max_pages=limit)
    except PaginationError as error:
        assert "\n" not in str(error) and str(error).startswith("sagemaker:ListThings ")
        assert len(fetch.tokens) <= limit
        return
    followed = fetch.tokens[1:]
    assert len(set(followed)) == len(followed) and len(fetch.tokens) <= limit
    answered = [pages[min(index, len(pages) - 1)] for index in range(len(fetch.tokens))]
    assert items == [item for page in answered for item in page.get("Things") or []]
