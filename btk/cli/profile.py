"""``btk profile import``: a model profile from a Hugging Face ``config.json``.

Reads a local file (nothing is downloaded) with :mod:`btk.hf_import` and prints the profile as
a Python module to save in ``profiles/`` (``--format python``, the default) or as JSON with its
``parameter_count`` (``--format json``, the shape ``btk profiles --format json`` lists);
``--output FILE`` writes it to a new file instead. A config the trainer cannot train is one
line naming the field, exit 2; so is a ``--name`` a profile of ``profiles/`` already has.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from btk.cli.arguments import non_empty, non_empty_path
from btk.cli.output import JSON, PYTHON, add_format_argument
from btk.errors import BtkError, printable

CONFIG_FILE = "config.json"


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "profile", help="add a model profile: import a Hugging Face config.json"
    )
    commands = parser.add_subparsers(dest="profile_command", required=True, parser_class=type(parser))
    importer = commands.add_parser(
        "import",
        help="a profile from a local Hugging Face config.json",
        description="Read a Hugging Face config.json (a local file, or the model directory holding one) and print "
        "a profile module to save in profiles/: the architecture and its parameter count from the config, a "
        "training intent to edit. Llama 3.x, Mistral, Qwen2.5, Qwen3, OLMo 2, Granite 3.x, SmolLM3, "
        "Phi-3/Phi-4 and Gemma 2/3 dense models; anything the "
        "trainer does not implement (mixture-of-experts, sliding-window attention outside Gemma, vision, dropout "
        "unless --without-dropout) is refused naming the field.",
    )
    importer.add_argument("config", type=non_empty_path, metavar="PATH",
                          help="config.json, or the directory holding it")
    importer.add_argument("--name", type=non_empty, required=True,
                          help="the profile's name: a lower-case slug, e.g. qwen3-8b")
    importer.add_argument("--output", type=non_empty_path, metavar="FILE",
                          help="write the module (or JSON) to FILE, a new file, instead of printing it")
    importer.add_argument("--language-model", action="store_true",
                          help="import the language model of a multimodal model's config.json (its text_config, "
                          "e.g. Gemma 3 4B-27B), leaving the vision tower out")
    importer.add_argument("--without-dropout", action="store_true",
                          help="import a config that asks for dropout (attention_dropout, resid_pdrop, embd_pdrop) "
                          "to train without it, as the trainer trains; the module says what was left out")
    add_format_argument(importer, (PYTHON, JSON), default=PYTHON)
    importer.set_defaults(handler=cmd_import)


def config_path(path: Path) -> Path:
    """The ``config.json`` a PATH argument means: the file itself, or the one in the directory."""
    return path / CONFIG_FILE if path.is_dir() else path


def cmd_import(args: argparse.Namespace) -> int:
    from btk.hf_import import (
        SAFETENSORS_INDEX,
        dropout_left_out,
        language_model_config,
        profile_from_config,
        profile_module,
        published_count_from_index,
    )
    from btk.hf_proof import prove_import
    from btk.jsonfile import read_json_file

    path = config_path(args.config)
    where = printable(str(path))
    _check_name_is_free(args.name)
    target: Path | None = args.output
    if target is not None:
        _check_target(target)
    if path.exists() and not path.is_file():  # a device (/dev/zero) would be read without end
        raise BtkError(f"{where}: not a regular file; give a config.json")
    index_path = path.parent / SAFETENSORS_INDEX
    try:
        config = read_json_file(path, where)
        published = None
        if args.language_model:  # the checkpoint's index counts the vision tower too: not read
            config = language_model_config(config)
        elif index_path.is_file():
            index = read_json_file(index_path, printable(str(index_path)))
            published = published_count_from_index(index, config) if isinstance(config, dict) else None
        profile = profile_from_config(config, args.name, published, without_dropout=args.without_dropout)
        proof = prove_import(config, profile.architecture)
        left_out = dropout_left_out(config) if args.without_dropout else []
    except BtkError as error:  # name the files the user gave, not a generic config.json
        message = str(error)
        for generic, given in ((CONFIG_FILE, where), (SAFETENSORS_INDEX, printable(str(index_path)))):
            if message.startswith(f"{generic}: "):
                message = given + message.removeprefix(generic)
        raise BtkError(message) from None
    if args.output_format == JSON:
        extra = {"parameter_count": profile.parameter_count, "proof": proof.as_json()}
        if left_out:
            extra["left_out"] = left_out
        text = json.dumps(profile.model_dump(mode="json") | extra, indent=2) + "\n"
    else:
        text = profile_module(profile, proof=proof.summary(), left_out=left_out, language_model=args.language_model)
    if target is None:
        print(text, end="")
        return 0
    with target.open("x", encoding="utf-8") as file:
        file.write(text)
    print(f"wrote {printable(str(target))}: profile {profile.name} ({profile.parameter_count:,} parameters)")
    return 0


def _check_name_is_free(name: str) -> None:
    """A profile name is one profile: the catalog refuses a second, so the import refuses to write it."""
    from btk.catalog import profile_defined_in

    taken = profile_defined_in(name)
    if taken is not None:
        raise BtkError(f"--name {printable(name)}: profile {printable(name)!r} is already defined in {taken}; "
                       "give the import another name")


def _check_target(target: Path) -> None:
    """``--output`` must name a new file in an existing directory: an existing module is never overwritten."""
    shown = printable(str(target))
    if target.exists() or target.is_symlink():
        raise BtkError(f"--output {shown}: already exists; give a new file (a profile module is never overwritten)")
    if not target.parent.is_dir():
        raise BtkError(f"--output {shown}: directory {printable(str(target.parent))!r} does not exist")
