"""The Linux dataplane: driver loop, managers, kernel-facing renderers.

`loop.DataplaneLoop` drains the calc graph's messages (and the interface monitor's events),
feeds every manager's `on_update`, then calls `apply()` in a fixed order (see `manager.py`).
Only code under this package (through `agent.shims`) touches the kernel.
"""
