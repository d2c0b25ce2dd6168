"""Dataplane managers: one per slice of kernel state (routes, sysctls, IP sets, iptables)."""
