"""Plain-torch references of every kernel, with the same names and arguments as the public API."""
