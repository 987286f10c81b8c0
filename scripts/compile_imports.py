"""Import everything the toolkit's own commands import, once, at set-up, so Python writes its bytecode then.

    python scripts/compile_imports.py infra   # the CDK app, btk, the pipeline definitions' SageMaker SDK
    python scripts/compile_imports.py all     # and the trainer (torch, torchao)

Set-up installs without byte-compiling (most of the environment's modules are never imported); Python
compiles a module the first time it is imported and keeps the .pyc. This script makes that first time the
set-up's: the stages of ``make test`` that start together then find the modules they share compiled, and no
first command prints the compiler's warnings about third-party source (Python 3.12 and later print a
``SyntaxWarning`` for each invalid escape sequence in a docstring: the SageMaker SDK's shapes and resources,
torchao's quantization API), which nobody using the toolkit can act on. They are ignored here.

Nothing is printed: the libraries' import-time logging is off here. A module that cannot be imported in this
environment (the trainer's torchtitan baseline needs torchtitan, which only the GPU benchmark's environment
holds) is skipped: this only moves compilation earlier, and the command that imports it reports its own error.
"""

from __future__ import annotations

import importlib
import logging
import pkgutil
import sys
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
INFRA_PACKAGES = ("btk", "profiles", "stacks", "training_constructs")
INFRA_MODULES = ("app", "environments")
TRAINER_PACKAGES = ("btk_trainer",)
TRAINER_MODULES = ("torchao.quantization",)


def modules_of(packages: Sequence[str]) -> Iterator[str]:
    """Every module of ``packages`` (their ``__main__`` modules aside: importing one runs it)."""
    for package in packages:
        yield package
        module = importlib.import_module(package)
        for info in pkgutil.walk_packages(module.__path__, prefix=f"{package}."):
            if not info.name.endswith(".__main__"):
                yield info.name


def sdk_modules() -> tuple[str, ...]:
    """The SageMaker SDK modules the pipeline definitions are built with, in the definition worker's offline
    environment (some create a boto3 client at import and need a region)."""
    from training_constructs.pipeline_definition import SDK_MODULES, offline_sdk_environment

    offline_sdk_environment("us-east-1")
    return tuple(SDK_MODULES)


def import_all(names: Sequence[str]) -> None:
    for name in names:
        try:
            importlib.import_module(name)
        except Exception:  # skipped (the module docstring): its own command reports it
            continue


def main(argv: Sequence[str]) -> int:
    if len(argv) != 1 or argv[0] not in ("infra", "all"):
        print("usage: compile_imports.py infra|all", file=sys.stderr)
        return 2
    sys.path[:0] = [str(ROOT), str(ROOT / "containers")]
    warnings.simplefilter("ignore")
    logging.disable(logging.WARNING)
    import_all([*INFRA_MODULES, *modules_of(INFRA_PACKAGES), *sdk_modules()])
    if argv[0] == "all":
        import_all([*modules_of(TRAINER_PACKAGES), *TRAINER_MODULES])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
