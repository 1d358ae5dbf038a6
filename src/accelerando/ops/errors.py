"""Exceptions and warnings raised by operations on tensors across processes (Accelerate's names)."""


class DistributedOperationException(ValueError):
    """A collective cannot run because the ranks' tensors do not agree (shapes, dtypes, structure).

    A ValueError too: accelerando raised ValueError for these before Accelerate's name existed here."""


class CannotPadNestedTensorWarning(UserWarning):
    """`pad_across_processes` left a nested tensor as it was: it has no single size along a dimension."""
