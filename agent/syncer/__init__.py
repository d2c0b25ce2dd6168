"""Datastore syncers: list + watch a datastore and stream keyed raw documents.

See `agent.syncer.api` for the interface every backend implements.
"""
