"""The JIT runtime: render (source), compile (compiler), cache (cache), load and launch (runtime),
parallel ahead-of-time builds (precompile), and the native launch hot path (launcher)."""
