"""One process, one device: the base behaviour, unchanged."""

from accelerando.strategies.base import Strategy


class SingleDeviceStrategy(Strategy):
    name = "single_device"
