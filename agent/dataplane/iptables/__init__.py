"""The iptables fallback dataplane: chain model, policy renderer, save/restore table writer."""
