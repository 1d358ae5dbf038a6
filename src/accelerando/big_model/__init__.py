"""Big-model inference: meta init, device-map planning, checkpoint loading, offload hooks, dispatch.

Public names are re-exported with Accelerate's module paths from `accelerando.big_modeling`,
`accelerando.hooks`, `accelerando.utils.modeling` and `accelerando.utils.offload`.
"""
