"""Service Quotas against what the environment plans: SageMaker training and FSx for Lustre.

Quotas are found by name, not by code: AWS's names are stable and say what they limit, while a
new instance type gets a code nobody can guess. The names, as AWS lists them (AWS General
Reference, "Amazon SageMaker AI endpoints and quotas",
https://docs.aws.amazon.com/general/latest/gr/sagemaker.html, and the ``ResourceLimitExceeded``
message SageMaker writes, e.g. "The account-level service limit 'ml.p5.48xlarge for training
job usage' is 0 Instances"):

- ``<instance type> for training job usage`` and ``<instance type> for spot training job usage``:
  instances of that type running at once, on demand and on managed spot (0 by default for the
  largest GPU types);
- ``Maximum number of instances per training job`` (and ``... per spot training job``);
- ``Number of instances across all training jobs`` (and ``... all spot training jobs``);
- ``Longest run time for a training job`` (seconds).

FSx for Lustre (AWS General Reference, "Amazon FSx endpoints and quotas",
https://docs.aws.amazon.com/general/latest/gr/fsxn.html): ``Lustre Persistent_2 storage
capacity`` (GiB across the account's PERSISTENT_2 file systems), ``Lustre Persistent_2 file
systems``, and a Persistent_2 throughput quota where the region lists one.

A quota with no applied value is read from AWS's defaults (ListServiceQuotas returns applied
values only; ListAWSDefaultServiceQuotas the defaults).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from btk.doctor.aws import Answer, Caller
from btk.doctor.findings import FAIL, PASS, WARN, Check, Finding, Status
from btk.environment import EnvironmentConfig

SAGEMAKER = "sagemaker"
FSX = "fsx"
LISTING_PAGE = 100
GIB_PER_TIB = 1024


def instance_quota_name(instance_type: str, *, spot: bool) -> str:
    """``ml.p5.48xlarge for training job usage`` (``for spot training job usage`` with ``spot``)."""
    return f"{instance_type} for {'spot ' if spot else ''}training job usage"


PER_JOB = re.compile(r"maximum (number of )?instances per training job", re.IGNORECASE)
PER_SPOT_JOB = re.compile(r"maximum (number of )?instances per spot training job", re.IGNORECASE)
ALL_JOBS = re.compile(r"number of instances across all training jobs", re.IGNORECASE)
ALL_SPOT_JOBS = re.compile(r"number of instances across all spot training jobs", re.IGNORECASE)
LONGEST_RUN = re.compile(r"longest run time for a training job", re.IGNORECASE)
LUSTRE_STORAGE = re.compile(r"lustre persistent_2 storage capacity", re.IGNORECASE)
LUSTRE_FILE_SYSTEMS = re.compile(r"lustre persistent_2 file systems", re.IGNORECASE)
LUSTRE_THROUGHPUT = re.compile(r"lustre persistent_2 (ssd )?throughput capacity", re.IGNORECASE)


@dataclass(frozen=True)
class PlannedJob:
    """One profile's training job as the environment plans it."""

    profile: str
    instance_type: str
    instance_count: int


@dataclass(frozen=True)
class Quota:
    """One quota of the region, applied or AWS's default."""

    name: str
    code: str
    value: float
    adjustable: bool
    applied: bool

    @classmethod
    def from_api(cls, item: dict[str, Any], *, applied: bool) -> Quota:
        return cls(
            name=str(item.get("QuotaName", "")).strip(),
            code=str(item.get("QuotaCode", "")),
            value=float(item.get("Value", 0.0)),
            adjustable=bool(item.get("Adjustable", False)),
            applied=applied,
        )

    @property
    def source(self) -> str:
        return "applied" if self.applied else "AWS default, none applied"


class QuotaBook:
    """The quotas of one service in the caller's region: applied values first, AWS's defaults after."""

    def __init__(self, caller: Caller, service_code: str) -> None:
        self.service_code = service_code
        self._applied = Answer(lambda: self._list(caller, "list_service_quotas", applied=True))
        self._defaults = Answer(lambda: self._list(caller, "list_aws_default_service_quotas", applied=False))

    def _list(self, caller: Caller, operation: str, *, applied: bool) -> list[Quota]:
        items = caller.items(
            "service-quotas", operation, "Quotas", ServiceCode=self.service_code, MaxResults=LISTING_PAGE
        )
        return [Quota.from_api(item, applied=applied) for item in items]

    def find(self, pattern: re.Pattern[str]) -> Quota | None:
        """The quota whose whole name matches ``pattern``; AWS's defaults are read only when needed."""
        for listing in (self._applied, self._defaults):
            for quota in listing.get():
                if pattern.fullmatch(quota.name):
                    return quota
        return None


def _number(value: float) -> str:
    return f"{value:,.0f}" if float(value).is_integer() else f"{value:,.2f}"


def increase_request(quota: Quota, service_code: str, desired: float, region: str) -> str:
    """The Service Quotas request that raises ``quota`` to ``desired``, as a command."""
    return (
        f"request '{quota.name}' >= {_number(desired)}: aws service-quotas request-service-quota-increase "
        f"--service-code {service_code} --quota-code {quota.code} --desired-value {desired:g} --region {region}"
    )


@dataclass(frozen=True)
class Need:
    """What one quota must allow.

    label: the quota's name (for the line when it is not found).
    pattern: how its name is recognised.
    needed: the least value that lets one planned job start.
    at_once: the value every profile running at once needs (``None``: not a concurrent limit).
    unit: the quota's unit, in words (``instances``, ``s``, ``GiB``).
    why: what ``needed`` is made of, in words.
    binding: whether a shortfall stops the environment's jobs (fail) or only another kind of run (warn).
    otherwise: the step when the quota cannot be raised, or a config change avoids it.
    """

    label: str
    pattern: re.Pattern[str]
    needed: float
    unit: str
    why: str
    binding: bool = True
    at_once: float | None = None
    otherwise: str = ""


def quota_finding(book: QuotaBook, need: Need, region: str) -> Finding:
    """The finding of one quota against what the environment needs of it."""
    check = f"quota '{need.label}'"
    quota = book.find(need.pattern)
    if quota is None:
        return Finding(
            check,
            WARN,
            f"no quota of that name in {region}'s Service Quotas ({book.service_code}); {need.why}",
            "check in the Service Quotas console that the resource is offered in this region",
            {"needed": need.needed},
        )
    check = f"quota '{quota.name}'"
    found = f"{_number(quota.value)} {need.unit} ({quota.source}), {_number(need.needed)} needed"
    if need.at_once is not None and need.at_once > need.needed:
        found += f" ({_number(need.at_once)} for every profile at once)"
    found += f": {need.why}"
    data = {
        "quota_name": quota.name,
        "quota_code": quota.code,
        "value": quota.value,
        "applied": quota.applied,
        "needed": need.needed,
        "needed_at_once": need.at_once,
    }
    if quota.value >= need.needed and (need.at_once is None or quota.value >= need.at_once):
        return Finding(check, PASS, found, "", data)
    status: Status = FAIL if quota.value < need.needed and need.binding else WARN
    desired = need.needed if quota.value < need.needed else float(need.at_once or need.needed)
    steps = [increase_request(quota, book.service_code, desired, region)] if quota.adjustable else []
    if not quota.adjustable:
        steps.append(f"'{quota.name}' is not adjustable")
    if need.otherwise:
        steps.append(need.otherwise)
    return Finding(check, status, found, "; or ".join(steps), data)


def _jobs_text(jobs: Sequence[PlannedJob]) -> str:
    counts = {job.instance_count for job in jobs}
    names = ", ".join(job.profile for job in jobs)
    if len(counts) == 1:
        return f"{names}: {jobs[0].instance_count} each"
    return ", ".join(f"{job.profile} {job.instance_count}" for job in jobs)


def _by_instance_type(jobs: Iterable[PlannedJob]) -> dict[str, list[PlannedJob]]:
    grouped: dict[str, list[PlannedJob]] = {}
    for job in jobs:
        grouped.setdefault(job.instance_type, []).append(job)
    return grouped


def training_needs(env: EnvironmentConfig, jobs: Sequence[PlannedJob]) -> list[Need]:
    """What the environment's planned jobs need of SageMaker's training quotas, in the order printed.

    On-demand quotas bind (a shortfall fails) only where jobs run on demand: with managed spot
    the spot quotas bind instead, and jobs on a training plan run on its reserved capacity, so
    there an on-demand shortfall only stops a run started without the plan (a warning). The
    per-job limit and the longest run time bind every job.
    """
    on_demand = not env.managed_spot and env.capacity.mode == "on_demand"
    elsewhere = "jobs on managed spot do not use it" if env.managed_spot else "jobs on the training plan do not use it"
    needs: list[Need] = []
    for instance_type, of_type in _by_instance_type(jobs).items():
        largest = max(job.instance_count for job in of_type)
        at_once = sum(job.instance_count for job in of_type)
        for spot in (False, True) if env.managed_spot else (False,):
            name = instance_quota_name(instance_type, spot=spot)
            needs.append(
                Need(name, re.compile(re.escape(name), re.IGNORECASE), largest, "instances", _jobs_text(of_type),
                     binding=spot or on_demand, at_once=at_once,
                     otherwise="" if spot or on_demand else elsewhere)
            )  # fmt: skip
    largest = max(job.instance_count for job in jobs)
    at_once = sum(job.instance_count for job in jobs)
    why = _jobs_text(jobs)
    fewer = "lower instance_count in environments.py"
    needs.append(
        Need("Maximum number of instances per training job", PER_JOB, largest, "instances", why,
             binding=not env.managed_spot, otherwise=fewer)
    )  # fmt: skip
    needs.append(
        Need("Number of instances across all training jobs", ALL_JOBS, largest, "instances", why,
             binding=on_demand, at_once=at_once, otherwise="" if on_demand else elsewhere)
    )  # fmt: skip
    if env.managed_spot:
        needs.append(
            Need("Maximum number of instances per spot training job", PER_SPOT_JOB, largest, "instances", why,
                 otherwise=fewer)
        )  # fmt: skip
        needs.append(
            Need("Number of instances across all spot training jobs", ALL_SPOT_JOBS, largest, "instances", why,
                 at_once=at_once)
        )  # fmt: skip
    hours = env.max_runtime_hours
    needs.append(
        Need("Longest run time for a training job", LONGEST_RUN, env.max_runtime_seconds, "s",
             f"max_runtime_hours {hours} (the pipelines' MaxRuntimeSeconds)",
             otherwise="lower max_runtime_hours in environments.py")
    )  # fmt: skip
    return needs


def training_quota_checks(env: EnvironmentConfig, jobs: Sequence[PlannedJob], caller: Caller) -> list[Check]:
    """One check per SageMaker training quota the planned jobs depend on."""
    book = QuotaBook(caller, SAGEMAKER)
    needs = training_needs(env, jobs)
    return [(f"quota '{need.label}'", partial(quota_finding, book, need, env.region)) for need in needs]


# --------------------------------------------------------------------------- FSx for Lustre


@dataclass(frozen=True)
class LustreFileSystem:
    """A PERSISTENT_2 Lustre file system of the account, from DescribeFileSystems."""

    file_system_id: str
    storage_gib: int
    throughput_per_tib: int

    @property
    def throughput_mbps(self) -> float:
        return self.storage_gib / GIB_PER_TIB * self.throughput_per_tib


def persistent_2_file_systems(caller: Caller) -> list[LustreFileSystem]:
    """Every Lustre PERSISTENT_2 file system of the account in the region (all pages)."""
    found = []
    for item in caller.items("fsx", "describe_file_systems", "FileSystems"):
        lustre = item.get("LustreConfiguration") or {}
        if item.get("FileSystemType") != "LUSTRE" or lustre.get("DeploymentType") != "PERSISTENT_2":
            continue
        found.append(
            LustreFileSystem(
                file_system_id=str(item.get("FileSystemId", "")),
                storage_gib=int(item.get("StorageCapacity", 0)),
                throughput_per_tib=int(lustre.get("PerUnitStorageThroughput", 0)),
            )
        )
    return found


def fsx_quota_checks(env: EnvironmentConfig, caller: Caller, own_file_system: Callable[[], str | None]) -> list[Check]:
    """The FSx for Lustre quotas against the configured file system, beside the account's others.

    ``own_file_system`` gives the id of the environment's file system once deployed, which is
    left out of the others (its size may be what changes).
    """
    stage = env.data_stage
    book = QuotaBook(caller, FSX)
    everything = Answer(lambda: persistent_2_file_systems(caller))

    def others() -> list[LustreFileSystem]:
        own = own_file_system()
        return [fs for fs in everything.get() if fs.file_system_id != own]

    def storage() -> Finding:
        rest = others()
        used = sum(fs.storage_gib for fs in rest)
        why = f"{stage.fsx_storage_capacity_gib:,} GiB configured + {used:,} GiB already in the account"
        why += f" ({len(rest)} file systems)"
        need = Need("Lustre Persistent_2 storage capacity", LUSTRE_STORAGE, stage.fsx_storage_capacity_gib + used,
                    "GiB", why, otherwise="lower data_stage.fsx_storage_capacity_gib")  # fmt: skip
        return quota_finding(book, need, env.region)

    def file_systems() -> Finding:
        rest = others()
        need = Need("Lustre Persistent_2 file systems", LUSTRE_FILE_SYSTEMS, len(rest) + 1, "file systems",
                    f"this one + {len(rest)} already in the account")  # fmt: skip
        return quota_finding(book, need, env.region)

    def throughput() -> Finding:
        mine = stage.fsx_storage_capacity_gib / GIB_PER_TIB * stage.fsx_throughput_per_tib
        per_tib = f"{stage.fsx_storage_capacity_gib:,} GiB x {stage.fsx_throughput_per_tib} MB/s/TiB"
        if book.find(LUSTRE_THROUGHPUT) is None:
            return Finding(
                "quota 'Lustre Persistent_2 throughput capacity'",
                PASS,
                f"{env.region} lists no Persistent_2 throughput quota: {_number(mine)} MB/s ({per_tib}) is "
                "bounded by the size tier only",
                "",
                {"throughput_mbps": mine},
            )
        used = sum(fs.throughput_mbps for fs in others())
        need = Need("Lustre Persistent_2 throughput capacity", LUSTRE_THROUGHPUT, mine + used, "MB/s",
                    f"{_number(mine)} MB/s ({per_tib}) + {_number(used)} MB/s of the others",
                    otherwise="lower data_stage.fsx_throughput_per_tib")  # fmt: skip
        return quota_finding(book, need, env.region)

    return [
        ("quota 'Lustre Persistent_2 storage capacity'", storage),
        ("quota 'Lustre Persistent_2 file systems'", file_systems),
        ("quota 'Lustre Persistent_2 throughput capacity'", throughput),
    ]
