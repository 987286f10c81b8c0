"""Where a job reads its dataset on FSx for Lustre, as plain values (CDK tokens are fine).

The data stage makes it, the pipeline construct passes it on, and the pure pipeline
definition turns it into SageMaker's ``FileSystemDataSource``: one type for all three.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class FileSystemLocation:
    """The ``train`` channel on FSx for Lustre (``fsx`` mode), mounted read-only.

    :param file_system_id: ``fs-…`` (a token is fine).
    :param mount_name: the file system's Lustre mount name (a token is fine).
    :param directory: directory inside the file system; the environment's ``fsx_directory``.
    """

    file_system_id: str
    mount_name: str
    directory: str

    @property
    def directory_path(self) -> str:
        """``/<mount name><directory>``, what ``FileSystemDataSource.DirectoryPath`` wants."""
        return f"/{self.mount_name}{self.directory}"
