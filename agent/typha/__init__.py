"""Typha-style sync fan-out: one datastore watch per syncer type, served to many clients.

- `agent.typha.protocol`: framing, message types, versioning, compression (the wire format,
  documented in docs/typha-protocol.md);
- `agent.typha.cache`: the server's snapshot cache and bounded update log, per syncer type;
- `agent.typha.server`: `TyphaServer`, the asyncio TCP/TLS server (`pyfelix typha`);
- `agent.typha.client`: `TyphaSyncer`, a `Syncer` reading from a Typha server
  (`--datastore typha://HOST:PORT[,...]`);
- `agent.typha.discovery`: which Typha addresses to try (explicit list or a Kubernetes
  service's endpoints);
- `agent.typha.tls`: TLS contexts and the peer identity checks (CN / URI SAN).
"""
