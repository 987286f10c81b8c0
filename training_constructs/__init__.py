"""Reusable CDK constructs of the Blackwell Training Kit.

Named ``training_constructs`` (not ``constructs``): a top-level ``constructs`` package would
shadow the ``constructs`` library that aws-cdk-lib imports, and synth would fail.
"""
