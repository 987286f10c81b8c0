"""The definition worker: the SDK's definitions from another process, or none and the app builds itself."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from test_pipeline_definition import _spec

from training_constructs import definition_worker
from training_constructs.definition_worker import DefinitionWorker, build_with_worker
from training_constructs.pipeline_definition import build_with_sdk


@pytest.fixture
def worker() -> Iterator[DefinitionWorker]:
    started = definition_worker.start()
    assert started is not None
    yield started
    definition_worker.stop()


def test_the_worker_builds_what_the_sdk_builds_here(worker: DefinitionWorker) -> None:
    in_process = build_with_sdk(_spec())
    assert worker.build(_spec()) == in_process
    assert worker.build(_spec(volume_size_gb=600)) == build_with_sdk(_spec(volume_size_gb=600))


def test_a_failed_build_there_is_built_here_and_fails_with_its_own_error(worker: DefinitionWorker) -> None:
    assert worker.build(object()) is None  # the worker reports the error, and keeps serving
    assert worker.build(_spec()) == build_with_sdk(_spec())
    with pytest.raises(AttributeError):
        build_with_worker(object(), build_with_sdk)


def test_a_dead_worker_falls_back_to_this_process(worker: DefinitionWorker) -> None:
    process = worker._process
    assert process is not None
    process.kill()
    process.wait()
    built: list[object] = []
    definition = build_with_worker(_spec(), lambda spec: built.append(spec) or "here")
    assert definition == "here" and len(built) == 1
    assert worker._process is None  # given up: later specs go straight to this process


def test_without_a_worker_the_build_runs_here() -> None:
    definition_worker.stop()
    assert build_with_worker(_spec(), lambda spec: "here") == "here"


def test_stop_ends_the_process_at_once(worker: DefinitionWorker) -> None:
    process = worker._process
    assert process is not None
    definition_worker.stop()  # even while it is still importing the SDK
    assert process.poll() is not None


def test_no_interpreter_to_start_means_no_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(definition_worker.sys, "executable", "/nonexistent/python")
    assert definition_worker.start() is None
    assert build_with_worker(_spec(), lambda spec: "here") == "here"


def test_the_worker_imports_every_sdk_module_the_builder_uses() -> None:
    """SDK_MODULES is what the worker imports ahead: every `from sagemaker… import` of the builder."""
    import ast
    import inspect

    from training_constructs import pipeline_definition

    tree = ast.parse(inspect.getsource(pipeline_definition))
    used = {node.module for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("sagemaker")}
    assert used == set(pipeline_definition.SDK_MODULES)


def test_a_prepared_region_changes_nothing_the_worker_builds(worker: DefinitionWorker) -> None:
    worker.prepare(_spec().environment.region)
    worker.prepare("not-a-region")  # fails there, unreported: the worker keeps serving
    assert worker.build(_spec()) == build_with_sdk(_spec())


def test_preparing_a_dead_worker_gives_it_up(worker: DefinitionWorker) -> None:
    process = worker._process
    assert process is not None
    process.kill()
    process.wait()
    definition_worker.prepare("us-east-1")
    assert worker._process is None  # given up: specs go straight to this process


def test_without_a_worker_prepare_does_nothing() -> None:
    definition_worker.stop()
    definition_worker.prepare("us-east-1")
    assert build_with_worker(_spec(), lambda spec: "here") == "here"


def test_a_prepared_session_validated_the_sdk_config_once(monkeypatch: pytest.MonkeyPatch) -> None:
    import jsonschema

    from training_constructs import pipeline_definition

    validated: list[object] = []
    validate = jsonschema.validate

    def recording_validate(instance: Any, *args: Any, **kwargs: Any) -> None:
        validated.append(instance)
        validate(instance, *args, **kwargs)

    monkeypatch.setattr(jsonschema, "validate", recording_validate)
    pipeline_definition.prepare_offline_session("eu-north-1")  # a region no other test prepares
    assert [config is pipeline_definition._SDK_CONFIG for config in validated] == [True]


def test_imports_run_one_way_from_the_builder_to_the_worker() -> None:
    """pipeline_definition imports definition_worker; the worker imports no builder (it names its
    entry point as text and is handed the builder in the worker process)."""
    import ast
    from pathlib import Path
    from types import ModuleType

    def imported(module: ModuleType) -> set[str]:
        tree = ast.parse(Path(str(module.__file__)).read_text())
        names: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                names.add(node.module)
            elif isinstance(node, ast.Import):
                names.update(alias.name for alias in node.names)
        return names

    from training_constructs import pipeline_definition

    assert "training_constructs.definition_worker" in imported(pipeline_definition)
    assert not {name for name in imported(definition_worker) if name.startswith("training_constructs")}
    assert definition_worker.ENTRY == "training_constructs.pipeline_definition:serve_definitions"
