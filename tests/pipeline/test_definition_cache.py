"""The pipeline definition cache: keys that change with every input, reads that never fail a synth."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from test_pipeline_definition import _spec

from btk.bootstrap import BOUNDARY_CONTEXT
from btk.knobs import TrainingKnobs
from training_constructs import definition_cache
from training_constructs.definition_cache import CACHE_ENV, cache_key, cached_definition, default_directory
from training_constructs.pipeline_definition import PipelineSpec, S3TrainingData, build_pipeline_definition


class CountingBuild:
    """Stands in for the SDK build: a definition naming the spec's profile, and a call count."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, spec: PipelineSpec) -> str:
        self.calls += 1
        return json.dumps({"profile": spec.profile.name, "call": self.calls})


@pytest.fixture
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    directory = tmp_path / "definitions"
    monkeypatch.setenv(CACHE_ENV, str(directory))
    return directory


def test_off_builds_every_time(monkeypatch: pytest.MonkeyPatch) -> None:
    build = CountingBuild()
    for value in ("off", ""):
        monkeypatch.setenv(CACHE_ENV, value)
        cached_definition(_spec(), build)
    monkeypatch.delenv(CACHE_ENV)
    cached_definition(_spec(), build)
    assert build.calls == 3


def test_an_equal_spec_is_read_back(cache_dir: Path) -> None:
    build = CountingBuild()
    first = cached_definition(_spec(), build)
    again = cached_definition(_spec(), build)
    assert build.calls == 1 and again == first
    assert [path.name for path in cache_dir.iterdir()] == [f"{cache_key(_spec())}.json"]


@pytest.mark.parametrize(
    "change",
    [
        {"knobs": TrainingKnobs(micro_batch_size=4, seq_len=2048)},
        {"image_uri": "123456789012.dkr.ecr.us-east-1.amazonaws.com/btk:2"},
        {"subnet_ids": ["subnet-0a1b2c3d4e5f60719"]},
        {"train_data": S3TrainingData("s3://datasets/shards")},
        {"training_plan_arn": "arn:aws:sagemaker:us-east-1:123456789012:training-plan/p"},
        {"extra_tags": {"team": "ml"}},
        {"volume_size_gb": 501},
    ],
    ids=lambda change: next(iter(change)),
)
def test_any_changed_field_is_a_new_key(cache_dir: Path, change: dict[str, Any]) -> None:
    build = CountingBuild()
    cached_definition(_spec(), build)
    cached_definition(replace(_spec(), **change), build)
    assert build.calls == 2
    assert cache_key(_spec()) != cache_key(replace(_spec(), **change))


def test_environment_and_profile_fields_are_in_the_key() -> None:
    spec = _spec()
    other_env = replace(spec, environment=spec.environment.model_copy(update={"tags": {"cost": "x"}}))
    arch = spec.profile.architecture.model_copy(update={"vocab_size": spec.profile.architecture.vocab_size + 1})
    other_profile = replace(spec, profile=spec.profile.model_copy(update={"architecture": arch}))
    keys = {cache_key(spec), cache_key(other_env), cache_key(other_profile)}
    assert len(keys) == 3


def test_the_code_and_the_sdk_are_in_the_key(monkeypatch: pytest.MonkeyPatch) -> None:
    before = cache_key(_spec())
    definition_cache.code_fingerprint.cache_clear()
    monkeypatch.setattr("importlib.metadata.version", lambda name: "0.0.0")
    assert cache_key(_spec()) != before  # another SDK or boto version: another key
    monkeypatch.undo()
    definition_cache.code_fingerprint.cache_clear()
    assert cache_key(_spec()) == before
    sources = list(definition_cache._source_files())
    assert any(path.name == "pipeline_definition.py" for path in sources)
    assert any(path.name == "hyperparameters.py" for path in sources)


def test_a_value_it_cannot_key_is_an_error() -> None:
    with pytest.raises(TypeError, match="cannot key a pipeline definition on a object"):
        cache_key(replace(_spec(), extra_tags={"x": object()}))  # type: ignore[dict-item]  # the bad value under test


def test_a_damaged_entry_is_rebuilt(cache_dir: Path) -> None:
    build = CountingBuild()
    cached_definition(_spec(), build)
    (cache_dir / f"{cache_key(_spec())}.json").write_text('{"truncat')
    assert json.loads(cached_definition(_spec(), build))["call"] == 2


def test_an_unwritable_directory_still_builds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    monkeypatch.setenv(CACHE_ENV, str(blocker / "definitions"))
    build = CountingBuild()
    assert json.loads(cached_definition(_spec(), build))["call"] == 1
    assert json.loads(cached_definition(_spec(), build))["call"] == 2


def test_a_failed_write_leaves_nothing_behind(cache_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(source: object, target: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("os.replace", refuse)
    build = CountingBuild()
    assert json.loads(cached_definition(_spec(), build))["call"] == 1
    assert list(cache_dir.iterdir()) == []


def test_only_the_newest_entries_are_kept(cache_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(definition_cache, "KEEP", 3)
    build = CountingBuild()
    keys = []
    for size in range(501, 506):
        spec = _spec(volume_size_gb=size)
        cached_definition(spec, build)
        keys.append(cache_key(spec))
        path = cache_dir / f"{keys[-1]}.json"
        os.utime(path, (size, size))  # distinct modification times, oldest first
    assert sorted(path.stem for path in cache_dir.glob("*.json")) == sorted(keys[-3:])
    assert not list(cache_dir.glob("*.tmp"))


def test_a_definition_read_back_is_kept_before_one_built_later_and_not_read(cache_dir: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Pruning keeps the most recently used: the oldest entry, read again, outlives a newer one nobody read."""
    monkeypatch.setattr(definition_cache, "KEEP", 2)
    build = CountingBuild()
    used, unused, latest = (_spec(volume_size_gb=size) for size in (501, 502, 503))
    for age, spec in ((100, used), (200, unused)):
        cached_definition(spec, build)
        os.utime(cache_dir / f"{cache_key(spec)}.json", (age, age))  # built long ago, the used one first
    assert cached_definition(used, build) == json.dumps({"profile": used.profile.name, "call": 1})
    cached_definition(latest, build)
    assert sorted(path.stem for path in cache_dir.glob("*.json")) == sorted((cache_key(used), cache_key(latest)))
    assert build.calls == 3


def test_the_sdk_definition_is_stored_and_read_back_unchanged(cache_dir: Path) -> None:
    built = build_pipeline_definition(_spec())
    assert json.loads((cache_dir / f"{cache_key(_spec())}.json").read_text()) == json.loads(built)
    assert build_pipeline_definition(_spec()) == built


def test_default_directory_follows_xdg() -> None:
    assert default_directory({"XDG_CACHE_HOME": "/c"}) == Path("/c/btk/pipeline-definitions")
    assert default_directory({}).parts[-3:] == (".cache", "btk", "pipeline-definitions")


@pytest.fixture
def fresh_lookups(monkeypatch: pytest.MonkeyPatch) -> None:
    """This process's lookups start empty (as a new app process's do)."""
    monkeypatch.setattr(definition_cache, "_looked_up", [])


def test_a_run_is_stored_while_every_definition_it_looked_up_is(cache_dir: Path, fresh_lookups: None) -> None:
    build = CountingBuild()
    cached_definition(_spec(), build)
    cached_definition(_spec(volume_size_gb=600), build)
    run = definition_cache.run_key({"env": "dev"}, [])
    assert not definition_cache.run_stored(run)  # never recorded
    definition_cache.record_run(run)
    assert json.loads((cache_dir / definition_cache.RUNS / f"{run}.json").read_text()) == [
        cache_key(_spec()), cache_key(_spec(volume_size_gb=600))]
    assert definition_cache.run_stored(run)
    (cache_dir / f"{cache_key(_spec(volume_size_gb=600))}.json").unlink()  # pruned, say
    assert not definition_cache.run_stored(run)


def test_a_run_that_looked_up_nothing_is_stored(cache_dir: Path, fresh_lookups: None) -> None:
    """An app run without pipelines (the boundary's, say) needs no SDK either."""
    run = definition_cache.run_key({"boundary": "dev"}, [])
    definition_cache.record_run(run)
    assert definition_cache.run_stored(run)


@pytest.mark.parametrize("record", ["not json", '{"a": 1}', '["../../etc/passwd"]', "[1]"])
def test_a_damaged_or_foreign_run_record_is_not_stored(cache_dir: Path, record: str) -> None:
    run = definition_cache.run_key({}, [])
    (cache_dir / definition_cache.RUNS).mkdir(parents=True)
    (cache_dir / definition_cache.RUNS / f"{run}.json").write_text(record)
    assert not definition_cache.run_stored(run)


def test_with_the_cache_off_no_run_is_stored_or_recorded(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                          fresh_lookups: None) -> None:
    monkeypatch.setenv(CACHE_ENV, "off")
    monkeypatch.chdir(tmp_path)
    run = definition_cache.run_key({}, [])
    definition_cache.record_run(run)
    assert not definition_cache.run_stored(run) and list(tmp_path.iterdir()) == []


def test_the_run_key_changes_with_the_context_the_user_config_and_the_code(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    environments, profiles = tmp_path / "environments.py", tmp_path / "profiles"
    environments.write_text("ENVIRONMENTS = ()\n")
    profiles.mkdir()
    (profiles / "llama.py").write_text("PROFILES = ()\n")
    inputs = [environments, profiles]
    base = definition_cache.run_key({"env": "dev"}, inputs)
    assert definition_cache.run_key({"env": "dev"}, inputs) == base
    keys = {definition_cache.run_key({"env": "staging"}, inputs), definition_cache.run_key({}, inputs)}
    environments.write_text("ENVIRONMENTS = ()  # edited\n")
    keys.add(definition_cache.run_key({"env": "dev"}, inputs))
    (profiles / "qwen.py").write_text("PROFILES = ()\n")
    keys.add(definition_cache.run_key({"env": "dev"}, inputs))
    environments.unlink()
    keys.add(definition_cache.run_key({"env": "dev"}, inputs))
    monkeypatch.setattr(definition_cache, "code_fingerprint", lambda: "other code")
    keys.add(definition_cache.run_key({"env": "dev"}, inputs))
    assert len(keys) == 6 and base not in keys

    def unlistable(self: Path, pattern: str) -> Any:
        raise OSError(40, "Too many levels of symbolic links")

    monkeypatch.setattr(Path, "rglob", unlistable)  # a folder that cannot be listed still gives a key
    assert definition_cache.run_key({"env": "dev"}, inputs) not in keys


def test_the_app_starts_the_definition_worker_only_for_a_run_not_stored(
        cache_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fresh_lookups: None) -> None:
    """``app.py``'s main: the first run and a run after the user's config changed start the worker; a run of the
    same inputs whose definitions are all stored does not (the worker would import the SDK for nothing)."""
    import app
    from training_constructs import definition_worker

    profile = tmp_path / "profiles.py"
    profile.write_text("PROFILES = ()\n")
    started: list[bool] = []
    built: list[int] = []
    build = CountingBuild()

    class FakeApp:
        def synth(self) -> None:
            built.append(build.calls)

    def build_app() -> FakeApp:
        cached_definition(_spec(), build)
        return FakeApp()

    monkeypatch.setattr(app, "build_app", build_app)
    monkeypatch.setattr(app, "user_config_paths", lambda: (profile,))
    monkeypatch.setattr(definition_worker, "start", lambda: started.append(True))
    monkeypatch.setenv("CDK_CONTEXT_JSON", json.dumps({"env": "dev"}))
    runs = []
    for edit in (None, None, "PROFILES = ()  # edited\n", None):
        if edit:
            profile.write_text(edit)
        started.clear()
        assert app.main() == 0
        runs.append(bool(started))
    assert runs == [True, False, True, False]
    assert built == [1, 1, 1, 1]  # every definition after the first read back from the cache
    # The boundary's app builds no pipeline: no worker, even for a run never recorded and with the cache off.
    monkeypatch.setattr(app, "build_app", FakeApp)
    for cache in (str(cache_dir), "off"):
        monkeypatch.setenv(CACHE_ENV, cache)
        monkeypatch.setenv("CDK_CONTEXT_JSON", json.dumps({"env": "dev", BOUNDARY_CONTEXT: "dev"}))
        started.clear()
        assert app.main() == 0 and not started
