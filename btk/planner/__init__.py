"""The planner: from a model profile and an instance type to the knobs that train it best.

* ``memory``: per-GPU peak memory of a knob set (ZeRO states, activations, logits, gathers).
* ``throughput``: step time, tokens/s/GPU, MFU and cost of a knob set.
* ``search``: the exhaustive, deterministic search over feasible knobs and the legacy baseline.
* ``cost``: tokens per hour and a price per billion tokens (on-demand hours, a plan's fee).
* ``compare``: the best plan of one profile on each of several instance types.
* ``render`` and ``plot``: the planner's answers as text tables and as a figure.

Nothing here imports aws_cdk, torch, boto3 or matplotlib at module level.
"""
