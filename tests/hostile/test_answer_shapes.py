"""``btk.pagination.check_answer`` against generated answers of every operation ``btk`` reads.

The generator (:mod:`aws_answers`) builds answers from botocore's output shapes and corrupts some
out of them in a way it knows; the check must let every answer inside its shape through unchanged
and stop every corrupted one with one line naming the operation.
"""

from __future__ import annotations

from typing import Any

import pytest
from aws_answers import Generated, answers, output_shape
from example_budget import capped
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from btk.pagination import PaginationError, check_answer, shape_problem

#: Every SageMaker operation the reservation Lambda, ``btk capacity`` and ``btk report`` call.
OPERATIONS = (
    "search_training_plan_offerings",
    "list_training_plans",
    "describe_training_plan",
    "create_training_plan",
    "list_pipeline_executions",
    "list_pipeline_execution_steps",
    "search",
    "describe_training_job",
)


@pytest.mark.parametrize("operation", OPERATIONS)
def test_an_answer_is_let_through_inside_its_shape_and_stopped_in_one_line_outside_it(operation: str) -> None:
    shape = output_shape(operation)

    @settings(max_examples=capped(60), deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(generated=answers(operation, corrupt=2))
    def one(generated: Generated) -> None:
        if not generated.outside:
            assert check_answer(generated.value, shape, operation=operation) is generated.value
            return
        with pytest.raises(PaginationError) as raised:
            check_answer(generated.value, shape, operation=operation)
        line = str(raised.value)
        assert line.startswith(f"{operation} answered outside its documented shape: "), line
        assert "\n" not in line, (generated.corruption, line)

    one()


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ({"TrainingPlanArn": "a", "TrainingPlanName": "n", "Status": "Active", "TotalInstanceCount": 2**31},
         "TotalInstanceCount 2147483648 is beyond a 32-bit integer"),
        ({"TrainingPlanArn": "a", "TrainingPlanName": "n", "Status": "Active", "DurationMinutes": 60},
         "DurationMinutes 60 is above its documented maximum 59"),
        ({"TrainingPlanArn": "a", "TrainingPlanName": "n", "Status": "Active", "ResponseMetadata": {"x": None}}, None),
        ({"TrainingPlanArn": "a", "TrainingPlanName": "n", "Status": "Unheard-of"}, None),
        ({"TrainingPlanArn": "a", "TrainingPlanName": "n", "Status": "Active", "TargetResources": ("training-job",)},
         "TargetResources is tuple, not a list"),
    ],
)  # fmt: skip
def test_ranges_bits_and_what_the_model_does_not_name(value: dict[str, Any], problem: str | None) -> None:
    """Numbers beyond the model's range or their type's bits are outside; members the model does not name
    (botocore's ResponseMetadata) and enum values it does not list (a service adds them) are not."""
    assert shape_problem(value, output_shape("describe_training_plan")) == problem


@given(st.sampled_from(OPERATIONS))
@settings(max_examples=capped(8), database=None)
def test_the_answer_itself_must_be_an_object(operation: str) -> None:
    assert shape_problem(None, output_shape(operation)) == "the answer is null"
    assert shape_problem([], output_shape(operation)) == "the answer is a list, not an object"
