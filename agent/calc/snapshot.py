"""One-shot calculation: what would NODE's dataplane be programmed with? (`pyfelix calc`)

Role: read a datastore to in-sync, run it through the full pipeline (validator, calc graph,
event sequencer) into a `ExpectedDataplane`, and return that state plus every warning. No
kernel is touched. Input: a `--datastore` value (docs/ARCHITECTURE.md section 2) and a hostname.
Output: `Snapshot` (`summary` is the `pyfelix calc -o json` object).

A file datastore (directory or YAML file) is read once with `load_path`; any other backend
runs its syncer until the pipeline has sent `InSync` (or `timeout` expires).

Warnings (never fatal, and never change the rest of the output): datastore errors
(unparsable files, unkeyable or duplicate documents) and documents the validator rejected
(each treated as deleted), each naming the resource and field; plus, should it ever
happen, any breach of the message-ordering contract the dataplane model detected.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pyfelix.agent.calc.expected_dataplane import ExpectedDataplane
from pyfelix.agent.calc.pipeline import CalcPipeline
from pyfelix.agent.syncer.api import SyncStatus

if TYPE_CHECKING:
    from pyfelix.agent.datastore import DatastoreLocation


class CalcTimeout(RuntimeError):
    """The datastore did not reach in-sync in time."""


@dataclass
class Snapshot:
    hostname: str
    state: ExpectedDataplane
    warnings: list[str] = field(default_factory=list)

    @property
    def summary(self) -> dict[str, Any]:
        return self.state.summary()


def compute(datastore: DatastoreLocation, hostname: str, *,
            timeout: float = 30.0,
            before_feed: Callable[[CalcPipeline], None] | None = None) -> Snapshot:
    """Run the pipeline for `hostname` over `datastore` to in-sync and return the result.
    `before_feed(pipeline)` may register extra calc nodes on `pipeline.graph` first
    (`agent.calc.explain` does).

    Raises `agent.syncer.client.DatastoreClientError` if the datastore refuses,
    FileNotFoundError for a missing path, `CalcTimeout` if in-sync is not reached.
    """
    from pyfelix.agent.datastore import make_syncer

    state = ExpectedDataplane(strict=False)
    state.record = False
    pipeline = CalcPipeline(hostname, state)
    if before_feed is not None:
        before_feed(pipeline)
    if datastore.backend == "file":
        from pyfelix.agent.syncer.file import load_path

        updates, errors = load_path(datastore.path)
        for error in errors:
            pipeline.on_error(error)
        pipeline.feed(updates, SyncStatus.IN_SYNC)
    else:
        syncer = make_syncer(datastore)
        pipeline.start()
        syncer.start(pipeline)
        try:
            if not pipeline.wait_in_sync(timeout):
                raise CalcTimeout(f"datastore {datastore} did not reach in-sync within "
                                  f"{timeout:g}s")
        finally:
            syncer.stop()
            pipeline.stop()
    warnings = [str(e) for e in pipeline.errors]
    warnings += [pipeline.validator.errors[k] for k in sorted(pipeline.validator.errors)]
    warnings += [f"internal: message ordering: {v}" for v in state.violations]
    return Snapshot(hostname, state, warnings)
