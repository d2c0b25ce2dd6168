"""Test fixtures for the Kubernetes datastore: an in-process fake API server (server.py)."""
