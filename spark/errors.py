"""Errors the data source raises, each a plain exception with a message naming what to fix.

Spark wraps an exception raised inside its Python workers; the class name and message survive
in the wrapper's text, so name and message are what users see.
"""

from __future__ import annotations


class OptionError(ValueError):
    """A missing, malformed or contradictory data source option."""


class UnknownTopicError(ValueError):
    """A topic or topic-partition named by the options does not exist."""


class MissingColumnError(ValueError):
    """A DataFrame written to raftlog lacks a required column or has one of the wrong type."""


class DataLossError(RuntimeError):
    """Records to be read were deleted (retention) before they were read, with
    ``failOnDataLoss`` true."""
