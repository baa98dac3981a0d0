"""Execution providers: each owns a device and a kernel registry."""
