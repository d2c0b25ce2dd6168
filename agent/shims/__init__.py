"""Narrow shims over the kernel and the clock, injected into dataplane code as keyword arguments.

Every kernel touch of the Linux dataplane goes through one of these (netlink, command runner,
sysctl files, clock), each with a real default and a stateful fake under `tests/fakes/`.
Each real shim can be bound to a network namespace (by name under /run/netns, or by path) so
tests and the lab point a manager at a namespace they created.
"""
