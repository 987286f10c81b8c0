"""An environment on P6e-GB200 UltraServers synthesizes as app.py would (cdk-nag on): an arm64 image for the
Grace CPUs and a training plan booked by UltraServer."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import fixture_catalog
from reserve_variant import synthesize_environment

from btk.environment import EnvironmentConfig, ReservePlanCapacity


def test_a_gb200_environment_builds_an_arm64_image_and_books_an_ultraserver(tmp_path: Path) -> None:
    env = EnvironmentConfig(
        name="ultra",
        availability_zone="us-east-1a",
        profiles=(fixture_catalog.LLAMA_8B.name,),
        instance_type="ml.p6e-gb200.36xlarge",
        instance_count=16,
        capacity=ReservePlanCapacity(start_after=datetime(2027, 1, 4, tzinfo=UTC), duration_hours=168,
                                     instance_count=16, max_upfront_fee=900_000, purchase_approved=True),
    )
    with fixture_catalog.installed(env):
        template = synthesize_environment(env, tmp_path)
    (manifest,) = [json.loads(path.read_text()) for path in tmp_path.glob("*.assets.json")
                   if json.loads(path.read_text()).get("dockerImages")]
    assert [image["source"]["platform"] for image in manifest["dockerImages"].values()] == ["linux/arm64"]
    plans: list[dict[str, Any]] = [resource["Properties"] for resource in template["Resources"].values()
                                   if "UltraServerType" in resource.get("Properties", {})]
    assert [(plan["InstanceType"], plan["InstanceCount"], plan["UltraServerType"], plan["UltraServerCount"])
            for plan in plans] == [("ml.p6e-gb200.36xlarge", "16", "ml.u-p6e-gb200x72", "1")]
