"""Exceptions and warnings raised by operations on tensors across processes (Accelerate's names)."""


class DistributedOperationException(ValueError):
    """A collective cannot run because the ranks' tensors do not agree (shapes, dtypes, structure).

    Accelerate raises it only in debug mode; accelerando checks every collective, cheaply. It is a
    ValueError too, so code written against accelerando's earlier ValueError keeps working.
    """


MISMATCH = "Cannot apply desired operation due to shape mismatches. All shapes across devices must be valid."


class CannotPadNestedTensorWarning(UserWarning):
    """`pad_across_processes` left a nested tensor as it was: it has no single size along a dimension."""


class CollectiveMismatchError(DistributedOperationException):
    """Debug mode: ranks called different collectives, or some never called one (names each call site)."""
