"""A deployed pipeline's definition against the one in a CloudFormation template.

In the template a pipeline's ``PipelineDefinitionBody`` is an ``Fn::Join`` of JSON text and
CloudFormation tokens (the image URI as an ``Fn::Sub``, bucket names as ``Ref``, the role as
``Fn::GetAtt``). What SageMaker returns is the joined text after CloudFormation resolved them.
The two are compared as JSON values, not as text, so neither key order nor whitespace counts:
every token stands for what it can resolve to (an ``Fn::Sub`` keeps its literal text, so an
image tag that differs is found; a ``Ref`` or ``Fn::GetAtt`` matches any value), and every
other value must be equal. The answer is the first place they differ, as a path like
``Steps[0].Arguments.ResourceConfig.InstanceCount``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

#: What a token becomes inside the joined text while it is parsed as JSON (no JSON text holds a NUL).
_MARK = "\x00{}\x00"
_MARKS = re.compile("\x00([0-9]+)\x00")
#: ``${Name}`` of an ``Fn::Sub`` (``${!Literal}`` is the literal ``${Literal}``).
_SUB_VARIABLE = re.compile(r"\$\{(!?)([^}]*)\}")
_ANY = ".*?"
SHOWN_CHARS = 60


class UncomparableError(Exception):
    """The template's definition cannot be compared (S3-hosted, or a token outside a JSON string)."""


@dataclass(frozen=True)
class TemplateDefinition:
    """A pipeline definition as a template has it: JSON with a pattern for each token."""

    value: Any
    patterns: tuple[str, ...]


def _sub_pattern(text: str) -> str:
    parts: list[str] = []
    last = 0
    for match in _SUB_VARIABLE.finditer(text):
        parts.append(re.escape(text[last : match.start()]))
        parts.append(re.escape("${" + match[2] + "}") if match[1] else _ANY)
        last = match.end()
    parts.append(re.escape(text[last:]))
    return "".join(parts)


def _token_pattern(token: Any) -> str:
    """The text a CloudFormation token can resolve to, as a regular expression."""
    if isinstance(token, str):
        return re.escape(token)
    if isinstance(token, dict) and len(token) == 1:
        (function, argument), *_ = token.items()
        if function == "Fn::Sub":
            text = argument[0] if isinstance(argument, list) and argument else argument
            if isinstance(text, str):
                return _sub_pattern(text)
        if function == "Fn::Join" and isinstance(argument, list) and len(argument) == 2:
            separator, parts = argument
            if isinstance(separator, str) and isinstance(parts, list):
                return re.escape(separator).join(_token_pattern(part) for part in parts)
    return _ANY


def _is_plain_join(body: Any) -> bool:
    """``{"Fn::Join": ["", [parts...]]}``: text and tokens joined with nothing between them."""
    join = body.get("Fn::Join") if isinstance(body, dict) else None
    return isinstance(join, list) and len(join) == 2 and join[0] == "" and isinstance(join[1], list)


def template_definition(body: Any) -> TemplateDefinition:
    """The ``PipelineDefinitionBody`` of a template as JSON with token patterns in its strings."""
    if isinstance(body, str):
        parts: list[Any] = [body]
    elif _is_plain_join(body):
        parts = list(body["Fn::Join"][1])
    else:
        raise UncomparableError("the definition is not text or an Fn::Join of text and tokens")
    text: list[str] = []
    patterns: list[str] = []
    for part in parts:
        if isinstance(part, str):
            text.append(part)
        else:
            text.append(_MARK.format(len(patterns)))
            patterns.append(_token_pattern(part))
    try:
        value = json.loads("".join(text), strict=False)
    except (json.JSONDecodeError, RecursionError, ValueError):
        raise UncomparableError("a token stands outside a JSON string") from None
    return TemplateDefinition(value=value, patterns=tuple(patterns))


def pipeline_bodies(template: Any) -> dict[str, Any]:
    """The ``PipelineDefinition`` of every ``AWS::SageMaker::Pipeline`` with a literal name, by that name."""
    resources = template.get("Resources") if isinstance(template, dict) else None
    found: dict[str, Any] = {}
    for resource in (resources or {}).values() if isinstance(resources, dict) else ():
        if not isinstance(resource, dict) or resource.get("Type") != "AWS::SageMaker::Pipeline":
            continue
        properties = resource.get("Properties") or {}
        name = properties.get("PipelineName") if isinstance(properties, dict) else None
        if isinstance(name, str):
            found[name] = properties.get("PipelineDefinition")
    return found


def definition_of(pipeline_definition: Any) -> TemplateDefinition:
    """The comparable definition of a pipeline resource's ``PipelineDefinition`` property."""
    if isinstance(pipeline_definition, dict) and "PipelineDefinitionBody" in pipeline_definition:
        return template_definition(pipeline_definition["PipelineDefinitionBody"])
    raise UncomparableError("the definition is stored in S3 (PipelineDefinitionS3Location), not in the template")


def _shown(value: Any) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= SHOWN_CHARS else text[: SHOWN_CHARS - 3] + "..."


def _string_matches(expected: str, live: Any, patterns: tuple[str, ...]) -> bool:
    if not isinstance(live, str):
        return False
    if "\x00" not in expected:
        return expected == live
    pieces = _MARKS.split(expected)  # text, index, text, index, ..., text
    regex = "".join(patterns[int(piece)] if i % 2 else re.escape(piece) for i, piece in enumerate(pieces))
    return re.fullmatch(regex, live, re.DOTALL) is not None


def _same_scalar(expected: Any, live: Any) -> bool:
    # JSON has one number type, Python two; a boolean is never a number here (True == 1 in Python).
    if isinstance(expected, bool) or isinstance(live, bool):
        return expected is live
    if isinstance(expected, int | float) and isinstance(live, int | float):
        return float(expected) == float(live)
    return bool(type(expected) is type(live) and expected == live)


def first_difference(expected: TemplateDefinition, live: Any) -> str | None:
    """Where ``live`` (the parsed deployed definition) first differs from ``expected``; ``None`` when nowhere."""
    stack: list[tuple[str, Any, Any]] = [("", expected.value, live)]
    while stack:
        path, want, have = stack.pop()
        where = path or "the definition"
        if isinstance(want, dict):
            if not isinstance(have, dict):
                return f"{where}: an object in the template, {_shown(have)} deployed"
            missing = [key for key in want if key not in have]
            if missing:
                return f"{_join(path, missing[0])}: in the template, not deployed"
            extra = [key for key in have if key not in want]
            if extra:
                return f"{_join(path, extra[0])}: deployed, not in the template"
            stack.extend((_join(path, key), want[key], have[key]) for key in reversed(list(want)))
        elif isinstance(want, list):
            if not isinstance(have, list) or len(have) != len(want):
                return f"{where}: {len(want)} items in the template, {_shown(have)} deployed"
            stack.extend((f"{path}[{i}]", want[i], have[i]) for i in reversed(range(len(want))))
        elif isinstance(want, str):
            if not _string_matches(want, have, expected.patterns):
                return f"{where}: template {_shown(_MARKS.sub('<token>', want))}, deployed {_shown(have)}"
        elif not _same_scalar(want, have):
            return f"{where}: template {_shown(want)}, deployed {_shown(have)}"
    return None


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key
