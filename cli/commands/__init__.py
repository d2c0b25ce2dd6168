"""One module per top-level command; each exposes a click command or group named `command`."""
