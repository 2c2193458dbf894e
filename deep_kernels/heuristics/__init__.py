"""Pure config heuristics: (problem, device) -> frozen config; no GPU calls."""
