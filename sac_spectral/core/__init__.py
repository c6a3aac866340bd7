"""Layer 0, imported by everything above: typed configuration, seeding, threads, member-batched
networks, per-layer views, re-initialization and bf16 precision. Imports no other layer."""
