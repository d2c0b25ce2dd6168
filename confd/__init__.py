"""confd: BIRD 2 configuration from the datastore, checked and reloaded.

Pipeline (logic in Python, templates dumb)::

    syncer RawUpdates -> BGPView (typed BGP resources) -> compute_bird_config() -> BirdConfig
        -> render_bird_config() (jinja2, StrictUndefined) -> bird.conf text
        -> ConfdLoop: stage, `bird -p -c` check, atomic rename, `birdc configure`

Modules: `bgp_view` (the BGP syncer view), `bgp_config` (the computed model), `render`
(templates in `templates/`), `bird` (bird/birdc commands and a BIRD instance in a netns),
`watcher` (the watch-render-check-reload loop), `datastore` (syncer selection).
"""
