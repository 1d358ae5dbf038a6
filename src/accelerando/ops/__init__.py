"""Operations on nested structures of tensors, local (tree) and across processes (collectives)."""
