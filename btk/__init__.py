"""Blackwell Training Kit typed core.

This package imports neither ``aws_cdk`` nor ``torch``: the CLI stays fast and the
training image stays lean. Every other layer consumes the contracts defined here.
"""

__version__ = "0.1.0"
