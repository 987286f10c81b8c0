"""CDK stacks: one TrainingStack per environment."""

from stacks.training_stack import TrainingStack

__all__ = ["TrainingStack"]
