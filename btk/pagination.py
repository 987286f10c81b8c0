"""Bounded pagination of AWS list calls: an answer that never ends stops with one line.

An AWS list call returns a page and, while more remain, a token for the next one. A service
(or a proxy, or a stub) that answers with a token it already gave, or with pages that never
run out, would keep a plain ``while token:`` loop going forever: ``btk`` would hang, a Lambda
would run to its timeout. :func:`paginate` follows the tokens but stops at the first token seen
before, a token that is not text, a page that is not an object, a page whose items are not a
list, or more than ``max_pages`` pages, and raises one line naming the operation and what went
wrong. Nothing is returned from a loop cut short: a partial list would read as the whole one.

Standard library only, importing no other ``btk`` module, so the training-plan Lambda can
bundle it beside ``btk/capacity.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

MAX_PAGES = 1000
"""Pages one listing may take. SageMaker's list calls return up to 100 items a page
(``MaxResults``, https://docs.aws.amazon.com/sagemaker/latest/APIReference/API_ListTrainingPlans.html),
so this is 100,000 items: far beyond what one environment's listings hold, while a looping
answer is stopped after at most this many calls."""


class PaginationError(Exception):
    """An AWS listing that did not end: a repeated or malformed token, or too many pages."""


def paginate(
    fetch: Callable[[str | None], Mapping[str, Any]],
    *,
    operation: str,
    result_key: str,
    token_key: str = "NextToken",
    max_pages: int = MAX_PAGES,
    error: Callable[[str], Exception] = PaginationError,
) -> Iterator[Any]:
    """Every item under ``result_key`` across the pages ``fetch`` returns, at most ``max_pages`` of them.

    Args:
        fetch: makes one call: given ``None`` for the first page, then each page's token.
        operation: the call's name in the error line (``sagemaker:ListTrainingPlans``).
        result_key: the key of each page's list of items; a page without it (or with null) has none.
        token_key: the key of the next page's token (``NextToken``; ``nextToken`` for ECR).
        max_pages: more pages than this is an error.
        error: builds the exception raised with the one-line message (the caller's own error
            type); :class:`PaginationError` by default.

    Raises:
        whatever ``error`` builds: a token seen before, a token that is not a string, a page
        that is not an object, items that are not a list, or more than ``max_pages`` pages.
    """
    if max_pages < 1:
        raise ValueError("max_pages must be at least 1")
    seen: set[str] = set()
    token: str | None = None
    for page_number in range(1, max_pages + 1):
        page = fetch(token)
        if not isinstance(page, Mapping):
            raise error(f"{operation} answered page {page_number} with {type(page).__name__}, not an object")
        items = page.get(result_key)
        if items is not None and not isinstance(items, list):
            raise error(f"{operation} answered page {page_number} with {result_key} of type {type(items).__name__}")
        yield from items or ()
        following = page.get(token_key)
        if following is None or following == "":
            return
        if not isinstance(following, str):
            raise error(f"{operation} answered page {page_number} with a {token_key} that is not text")
        if following in seen:
            raise error(
                f"{operation} repeated a page token after {page_number} pages (the listing would never end); "
                "retry later"
            )
        seen.add(following)
        token = following
    raise error(f"{operation} gave more than {max_pages} pages (the listing would never end); retry later")
