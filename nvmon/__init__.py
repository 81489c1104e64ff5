"""nvmon: fleet monitor for 8-GPU NVLink/NVSwitch servers."""

__version__ = "0.1.0"
