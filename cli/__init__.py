"""The `pyfelix` command line: click commands that call the library and format its answers."""
