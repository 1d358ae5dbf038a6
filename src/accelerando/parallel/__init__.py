"""Model transformations applied while preparing: compile, pipelining, activation checkpointing."""
