"""Stateful fakes of the kernel shims (`agent.shims`), for unit tests of dataplane managers.

Each fake keeps the state the kernel would keep, enforces the kernel's rules that matter to
the code under test (a chain in use cannot be deleted, a set referenced by a rule cannot be
destroyed...), and can be told to fail the next operation(s) (`fail_next`).
"""
