"""btk_trainer: the SageMaker entrypoint and FSDP2 trainer of the Blackwell Training Kit."""
