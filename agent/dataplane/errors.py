"""Errors a dataplane raises while it is being built."""


class DataplaneUnavailable(RuntimeError):
    """The kernel cannot run the requested dataplane (e.g. no BPF support, no bpffs).

    The agent exits with this message unless a fallback is configured
    (FELIX_BPFFALLBACK=iptables): a silent fallback would change how policy is enforced.
    """
