"""``btk report``: experiment economics from an environment's SageMaker training history.

Modules, in the order data flows: :mod:`~btk.report.aws` (paginated, retried read-only
calls), :mod:`~btk.report.collect` (find and describe the jobs), :mod:`~btk.report.classify`
(failure causes), :mod:`~btk.report.predict` (the planner's prediction for a run's knobs),
:mod:`~btk.report.economics` (the figures), :mod:`~btk.report.schema` (the typed JSON
output), :mod:`~btk.report.render` and :mod:`~btk.report.plots`. Nothing here imports boto3
or matplotlib at module level. Definitions of every figure: ``docs/report.md``.
"""
