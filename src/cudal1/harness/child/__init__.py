"""What runs beside candidate code: the candidate's own process (import, build, construction,
forward calls on inputs it is handed, its own timing blocks) and its confinement.

Nothing in this package may be trusted by the judge: whatever the candidate's process reports is
bounded by the clean side (the reference worker and the parent)."""
