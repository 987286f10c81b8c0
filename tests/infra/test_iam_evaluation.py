"""The offline IAM evaluator against AWS's documented evaluation rules.

https://docs.aws.amazon.com/IAM/latest/UserGuide/reference_policies_evaluation-logic.html
"""

from __future__ import annotations

import pytest
from iam_evaluation import Principal, globs_intersect, wildcard_match

STACK = "arn:aws:cloudformation:us-east-1:123456789012:stack/TrainingStack-prod/abc"


def test_no_statement_is_an_implicit_deny() -> None:
    assert not Principal([]).allows("cloudformation:UpdateStack", STACK)


def test_an_explicit_deny_beats_any_allow() -> None:
    principal = Principal([
        {"Effect": "Allow", "Action": "cloudformation:*", "Resource": "*"},
        {"Effect": "Deny", "Action": "cloudformation:UpdateStack", "Resource": STACK},
    ])
    assert not principal.allows("cloudformation:UpdateStack", STACK)
    assert principal.allows("cloudformation:DescribeStacks", STACK)


def test_a_permissions_boundary_caps_what_the_policies_allow() -> None:
    boundary = [{"Effect": "Allow", "Action": "*", "Resource": "arn:aws:cloudformation:*:*:stack/TrainingStack-dev/*"}]
    principal = Principal([{"Effect": "Allow", "Action": "*", "Resource": "*"}], boundary=boundary)
    assert not principal.allows("cloudformation:UpdateStack", STACK)
    assert principal.allows("cloudformation:UpdateStack", STACK.replace("-prod", "-dev"))


def test_actions_match_case_insensitively_resources_case_sensitively() -> None:
    principal = Principal([{"Effect": "Allow", "Action": "CloudFormation:updatestack", "Resource": STACK}])
    assert principal.allows("cloudformation:UpdateStack", STACK)
    assert not principal.allows("cloudformation:UpdateStack", STACK.replace("prod", "PROD"))


def test_not_action_and_not_resource() -> None:
    principal = Principal([
        {"Effect": "Allow", "NotAction": "iam:*", "NotResource": "arn:aws:s3:::prod-*"},
    ])
    assert principal.allows("s3:GetObject", "arn:aws:s3:::dev-bucket/x")
    assert not principal.allows("s3:GetObject", "arn:aws:s3:::prod-bucket/x")
    assert not principal.allows("iam:PassRole", "arn:aws:iam::123456789012:role/x")


def test_conditions_need_their_key_unless_if_exists() -> None:
    statement = {"Effect": "Allow", "Action": "s3:GetObject", "Resource": "*",
                 "Condition": {"StringEquals": {"aws:ResourceTag/env": "dev"}}}
    assert not Principal([statement]).allows("s3:GetObject", "x")
    assert Principal([statement]).allows("s3:GetObject", "x", {"aws:resourcetag/env": "dev"})
    lenient = {**statement, "Condition": {"StringEqualsIfExists": {"aws:ResourceTag/env": "dev"}}}
    assert Principal([lenient]).allows("s3:GetObject", "x")
    unknown = {**statement, "Condition": {"NumericLessThan": {"s3:max-keys": "10"}}}
    with pytest.raises(ValueError, match="NumericLessThan"):
        Principal([unknown]).allows("s3:GetObject", "x", {"s3:max-keys": "5"})


@pytest.mark.parametrize(
    ("pattern", "value", "matches"),
    [("stack/TrainingStack-dev/*", "stack/TrainingStack-dev/1", True),
     ("stack/TrainingStack-dev*", "stack/TrainingStack-dev-eu/1", True),
     ("btk-dev-????????", "btk-dev-0123abcd", True),
     ("btk-dev-????????", "btk-dev-eu-0123abcd", False)],
)
def test_wildcards(pattern: str, value: str, matches: bool) -> None:
    assert wildcard_match(pattern, value) is matches
    assert globs_intersect(pattern, value) is matches
