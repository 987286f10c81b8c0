"""Hostile ``resourceconfig.json``: each node gets a node rank of its own, or the job ends with one line.

SageMaker writes the file (https://docs.aws.amazon.com/sagemaker/latest/dg/your-algorithms-training-algo-running-container.html#your-algorithms-training-algo-running-container-dist-training);
a file naming one host twice would give two nodes one node rank and leave another rank empty,
so torchrun would wait for a node that never comes.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from btk_trainer.entrypoint import main as entrypoint_main
from btk_trainer.launch import read_cluster
from example_budget import capped
from hypothesis import given, settings
from hypothesis import strategies as st

from btk.errors import BtkError

FIXTURES = Path(__file__).parents[1] / "trainer" / "fixtures"
HOSTS = st.lists(st.sampled_from([f"algo-{index}" for index in range(1, 6)]), min_size=1, max_size=6)


def _write(directory: Path, hosts: list[str], current: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "resourceconfig.json").write_text(json.dumps({"current_host": current, "hosts": hosts}))
    return directory


def test_a_host_named_twice_is_one_line(tmp_path: Path) -> None:
    config = _write(tmp_path, ["algo-1", "algo-2", "algo-1"], "algo-1")
    with pytest.raises(BtkError) as raised:
        read_cluster(config)
    assert str(raised.value) == ("resourceconfig.json: hosts names 'algo-1' more than once: each node must appear once")


def test_the_entrypoint_ends_the_job_with_it_in_the_failure_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "config"
    shutil.copytree(FIXTURES / "one_node", config)
    _write(config, ["algo-2", "algo-2"], "algo-2")
    failure = tmp_path / "failure"
    assert (
        entrypoint_main(["--config-dir", str(config), "--failure-file", str(failure)], env={"BTK_NUM_GPUS": "8"}) == 2
    )
    err = capsys.readouterr().err
    assert (
        err
        == failure.read_text()
        == ("btk: error: resourceconfig.json: hosts names 'algo-2' more than once: each node must appear once\n")
    )


@settings(max_examples=capped(200), deadline=None)
@given(hosts=HOSTS, current=st.integers(min_value=0, max_value=5))
def test_every_node_of_a_readable_cluster_has_its_own_rank(
    hosts: list[str], current: int, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Generated host lists (repeats included): refused in one line, or each host's node rank differs."""
    config = tmp_path_factory.mktemp("config")
    views = []
    for host in [*hosts, f"algo-{current}"]:
        try:
            views.append(read_cluster(_write(config, hosts, host)))
        except BtkError as error:
            assert "\n" not in str(error)
            assert len(set(hosts)) < len(hosts) or host not in hosts
    if len(set(hosts)) == len(hosts):
        ranks = {view.current_host: view.node_rank for view in views}
        assert sorted(ranks.values()) == list(range(len(hosts))) and set(ranks) == set(hosts)
    else:
        assert views == []
