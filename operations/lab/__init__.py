"""Local process harness shared by the crash lab and the benchmarks (sandbox only)."""
