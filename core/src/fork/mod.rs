//! Same-worker agent fork (seed 000 pillar 2). Being written: see issue 3.
