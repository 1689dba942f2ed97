"""Research studies beside the library: not installed, not part of the API (see ``studies/README.md``)."""
