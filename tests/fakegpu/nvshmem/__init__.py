"""A one-PE stand-in for nvshmem4py (see tests/fakegpu/README.md)."""
